"""``evolve``: a frozen dataclass with a few fields changed, for the request path.

``dataclasses.replace`` calls ``__init__`` and ``__post_init__`` again (all of a
``SamplingParams``' checks, 25 fields of an ``InstanceStatus``) and ``copy.copy`` goes
through ``__reduce_ex__``: tens of microseconds a call where the gateway makes several
per request. This copies the instance dict and sets the changes; the caller vouches that
the new values are valid (no check runs)."""
from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def evolve(obj: T, **changes: Any) -> T:
    """A shallow copy of ``obj`` (a dataclass with an instance dict) with ``changes``."""
    new = object.__new__(type(obj))
    state = new.__dict__
    state.update(obj.__dict__)
    for name, value in changes.items():
        if name not in state:
            raise AttributeError(f"{type(obj).__name__} has no field {name!r}")
        state[name] = value
    return new
