"""Operators' routes: the cluster's state (read-only), and draining and undraining an
instance (only with an admin key: see ``auth``)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request

from llumnix.gateway.context import context

reads = APIRouter()
changes = APIRouter()


@reads.get("/admin/cluster")
async def cluster(request: Request) -> dict[str, Any]:
    return await context(request).backend.cluster_info()


@changes.post("/admin/instances/{instance_id}/drain")
async def drain(instance_id: str, request: Request) -> dict[str, Any]:
    return await context(request).backend.drain_instance(instance_id)


@changes.post("/admin/instances/{instance_id}/undrain")
async def undrain(instance_id: str, request: Request) -> dict[str, Any]:
    return await context(request).backend.undrain_instance(instance_id)
