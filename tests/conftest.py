from __future__ import annotations

import sys

import pytest


@pytest.fixture(scope="module", autouse=True)
def _no_ray_session_outlives_its_module():
    """Each module that uses Ray starts and shuts down its own session. A test that calls
    a remote function outside one (say its module's cluster fixture was skipped, as
    without redis-server) makes Ray start a session implicitly; shut that down here, or the
    next module's ``ray.init`` fails on it."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
