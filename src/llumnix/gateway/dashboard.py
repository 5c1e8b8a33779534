"""``/dashboard``: the cluster, live, in a browser. One self-contained page (its script and
style inline, no build step, nothing fetched from elsewhere) shipped in the package; it
polls ``/admin/cluster`` twice a second with the key it was opened with (``?key=``, sent
as a Bearer header) and draws the instances, their KV use over the last minutes, the
migrations as they happen, and the gateway's request rate and latency percentiles."""
from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from starlette.responses import HTMLResponse

router = APIRouter()


@cache
def page() -> str:
    return (files("llumnix.gateway") / "static" / "dashboard.html").read_text(encoding="utf-8")


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> HTMLResponse:
    # no-store: the key may be in the address; referrer: it must not leave in a Referer
    return HTMLResponse(page(), headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})
