"""Routes for operators: liveness, readiness, metrics. No key needed."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from app import metrics
from app.api.deps import RuntimeDep
from app.errors import PROBLEM_JSON
from app.migrate import current_revision
from app.schemas import Health

router = APIRouter(tags=["operations"])
log = logging.getLogger("parley.ops")


@router.get("/healthz")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    responses={503: {"description": "Database unreachable or not migrated to head"}},
)
async def readyz(runtime: RuntimeDep) -> Response:
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
    body = {"type": "unavailable", "title": "Service unavailable", "status": 503, "detail": detail}
    return JSONResponse(body, status_code=503, media_type=PROBLEM_JSON)


@router.get("/metrics", response_class=Response)
async def prometheus_metrics() -> Response:
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)
