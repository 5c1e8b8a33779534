from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from llumnix.gateway.app import build_app
from tests.gateway.fake_backend import EngineBackend


@pytest.fixture()
def backend():
    """A real engine over a fake executor behind the Backend protocol."""
    return EngineBackend()


@pytest.fixture()
def client(backend):
    """The gateway app over ``backend``, in process."""
    return TestClient(build_app(backend))
