"""Operators' routes: the cluster's state, and draining an instance."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request

from llumnix.gateway.context import context

router = APIRouter()


@router.get("/admin/cluster")
async def cluster(request: Request) -> dict[str, Any]:
    return await context(request).backend.cluster_info()


@router.post("/admin/instances/{instance_id}/drain")
async def drain(instance_id: str, request: Request) -> dict[str, Any]:
    return await context(request).backend.drain_instance(instance_id)
