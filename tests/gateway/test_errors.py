from __future__ import annotations

import json

from llumnix.core.errors import InvalidRequestError
from llumnix.gateway.errors import error_response, validation_message


def test_error_response_has_openais_shape():
    r = error_response(404, "no such model", type_="NotFoundError", param="model", code="model_not_found")
    assert r.status_code == 404
    assert json.loads(r.body) == {"error": {"message": "no such model", "type": "NotFoundError",
                                            "param": "model", "code": "model_not_found"}}


def test_validation_messages_name_the_parameter_or_the_body():
    assert validation_message({"type": "value_error", "loc": ("body", "n"), "msg": "Value error, n must be in [1, 16]"},
                              "application/json") == ("n: n must be in [1, 16]", "n")
    assert validation_message({"type": "json_invalid", "loc": ("body", 1), "msg": "JSON decode error",
                               "ctx": {"error": "Expecting value"}}, "application/json") == (
        "request body is not valid JSON (Expecting value)", None)
    raised = InvalidRequestError("best_of is not supported", "best_of")
    assert validation_message({"type": "value_error", "loc": ("body",), "msg": "x", "ctx": {"error": raised}},
                              "application/json") == ("best_of is not supported", "best_of")
    message, param = validation_message({"type": "missing", "loc": ("body",), "msg": "Field required"}, "text/plain")
    assert param is None and message.endswith("sent as application/json (this one came as 'text/plain')")


def test_a_request_the_engine_failed_on_is_a_500_and_an_unavailable_cluster_a_503():
    from llumnix.core.errors import LlumnixError, RequestFailedError
    from llumnix.gateway.errors import failure_body

    status, body = failure_body(RequestFailedError("the engine failed on this request (RuntimeError)"))
    assert status == 500 and body["error"]["type"] == "server_error" and "RuntimeError" in body["error"]["message"]
    status, _ = failure_body(LlumnixError("no instance is available to serve the request"))
    assert status == 503


def test_an_admin_call_that_fails_is_answered_and_not_re_raised_to_the_server():
    """The soak's LlumSched restarts: Starlette's catch-all answered /admin/cluster with a
    503 but re-raised to uvicorn, which logged a traceback per call (the TestClient
    re-raises what the server would have logged)."""
    from fastapi.testclient import TestClient

    from llumnix.gateway.app import build_app
    from tests.gateway.fake_backend import EngineBackend

    backend = EngineBackend()

    async def down():
        raise TimeoutError("LlumSched did not answer")

    backend.cluster_info = down
    client = TestClient(build_app(backend, admin_key="k"))
    r = client.get("/admin/cluster", headers={"Authorization": "Bearer k"})
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
