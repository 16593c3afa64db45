"""Routes for operators: liveness, readiness, metrics. No key needed."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from app import metrics
from app.api.deps import RuntimeDep
from app.api.problems import RETRY_AFTER_SECONDS, problem_response
from app.migrate import current_revision
from app.schemas import Health

router = APIRouter(tags=["operations"])
log = logging.getLogger("parley.ops")


@router.get("/healthz", summary="Check liveness")
async def healthz() -> Health:
    """200 while the process serves requests; the database is not consulted. No key
    needed."""
    return Health(status="ok")


@router.get(
    "/readyz",
    responses={503: {"description": "Database unreachable or not migrated, or shutting down"}},
    summary="Check readiness",
)
async def readyz(runtime: RuntimeDep) -> Response:
    """200 when the database answers and is migrated to the revision this build expects;
    503 (problem+json) otherwise, and while the process shuts down. No key needed."""
    if runtime.supervisor.shutting_down.is_set():
        return _unready("The server is shutting down")
    try:
        revision = await current_revision(runtime.db.engine)
    except Exception as exc:  # any driver error means "not ready", never a 500
        log.warning("readiness check failed: %s", exc)
        return _unready("The database is not reachable")
    if revision != runtime.migration_head:
        return _unready(
            f"The database is at migration {revision or 'none'}, "
            f"the service expects {runtime.migration_head}"
        )
    return JSONResponse({"status": "ok", "detail": f"migrated to {revision}"})


def _unready(detail: str) -> Response:
    return problem_response(
        503,
        "unavailable",
        "Service unavailable",
        detail,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    summary="Get metrics",
)
async def prometheus_metrics() -> Response:
    """The process's metrics in the Prometheus text format. No key needed."""
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)
