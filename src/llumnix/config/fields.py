"""Build a frozen config dataclass from a YAML mapping, field by typed field.

Every error is one line that starts with the offending key's path from the root of the
document (``engine.max_num_seq: unknown key (did you mean max_num_seqs?)``,
``scheduling.dispatch.staleness_s: must be > 0``), wherever the section sits in it.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, TypeVar, Union

from llumnix.core.errors import InvalidRequestError, LlumnixError

T = TypeVar("T")


class SystemConfigError(LlumnixError):
    """A key of a system config is unknown or has a bad value; ``path`` names it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def rebase(where: str, param: str) -> str:
    """The path from the document's root of ``param``, an error's path as the section at
    ``where`` raised it: relative to the section's parent, so it starts with the section's
    own name (``dispatch.staleness_s``, as the policy configs name theirs), or relative
    to the section itself."""
    head, _, last = where.rpartition(".")
    if last and param.split(".", 1)[0] == last:
        return join(head, param)
    return join(where, param)


def error_at(where: str, e: Exception) -> SystemConfigError:
    """``e``, raised while a section at ``where`` was constructed, as a path-named error."""
    param = getattr(e, "path", None) or getattr(e, "param", None)
    if not param:
        return SystemConfigError(where, str(e))
    problem = getattr(e, "problem", None) or str(e)
    if problem.startswith(f"{param}: "):  # bad_value's messages repeat the path
        problem = problem[len(param) + 2:]
    return SystemConfigError(rebase(where, param), problem)


def mapping(value: Any, where: str) -> dict[str, Any]:
    """A copy of a section's mapping (None: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SystemConfigError(where, f"must be a mapping, not {value!r}")
    return dict(value)


def build(cls: type[T], value: Any, where: str) -> T:
    """``cls`` from the mapping ``value``; unknown keys and values of the wrong type are
    errors naming their path; so are those the dataclass's own checks raise."""
    d = mapping(value, where)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    kwargs = {}
    for key, v in d.items():
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(names)}"
            raise SystemConfigError(join(where, str(key)), f"unknown key ({hint})")
        kwargs[key] = typed(hints[key], v, join(where, key))
    try:
        return cls(**kwargs)
    except (SystemConfigError, InvalidRequestError, ValueError, TypeError) as e:
        raise error_at(where, e) from None


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def typed(tp: Any, value: Any, path: str) -> Any:
    """``value`` checked against the annotation ``tp`` (a float field takes an int)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (tp,) = (a for a in args if a is not type(None))
        origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)  # type: ignore[arg-type]
    if tp is Any:
        return value
    if (origin or tp) is dict:
        return mapping(value, path)
    ok = (isinstance(value, (int, float)) if tp is float else isinstance(value, tp)) and (
        tp is bool or not isinstance(value, bool))
    if not ok:
        raise SystemConfigError(path, f"must be {_KINDS.get(tp, tp.__name__)}, not {value!r}")
    return float(value) if tp is float else value
