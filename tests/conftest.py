from __future__ import annotations

import logging
import os
import sys

import pytest


@pytest.fixture(autouse=True)
def _logging_setup_stays_in_its_test():
    """A test that runs a command (``cli.main``) gets its logging setup
    (``logging_setup.configure_logging``: a root handler, levels, ``$LLUMNIX_LOG_LEVEL``);
    the next test starts without it."""
    root, ours = logging.getLogger(), logging.getLogger("llumnix")
    handlers, levels, env = list(root.handlers), (root.level, ours.level), os.environ.get("LLUMNIX_LOG_LEVEL")
    yield
    root.handlers[:] = handlers
    root.setLevel(levels[0])
    ours.setLevel(levels[1])
    if env is None:
        os.environ.pop("LLUMNIX_LOG_LEVEL", None)
    else:
        os.environ["LLUMNIX_LOG_LEVEL"] = env


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
