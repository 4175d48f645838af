"""`/healthz` (the process answers), `/readyz` (store reachable and migrated, blob dir writable),
`/metrics` (Prometheus)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy import text

from triage.service.deps import BlobsDep, DatabaseDep, MetricsDep
from triage.service.metrics import CONTENT_TYPE
from triage.store.migrate import current_revision, head_revision
from triage.store.session import Database

router = APIRouter(tags=["health"])
log = logging.getLogger("triage.health")


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the process is up and serving."""
    return {"status": "ok"}


def _store_ready(db: Database) -> str | None:
    try:
        with db.read_engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            revision = current_revision(conn)
    except Exception as exc:
        return f"database unreachable: {type(exc).__name__}"
    head = head_revision()
    if revision != head:
        return f"database at migration {revision}, expected {head}"
    return None


@router.get("/readyz", responses={503: {"description": "not ready; `checks` says why"}})
async def readyz(db: DatabaseDep, blobs: BlobsDep) -> JSONResponse:
    """Readiness: the database answers at the expected migration and the blob dir is writable."""
    problems: dict[str, str] = {}
    store = await run_in_threadpool(_store_ready, db)
    if store:
        problems["database"] = store
    if not await run_in_threadpool(blobs.writable):
        problems["blobs"] = f"blob dir {blobs.root} is not writable"
    if problems:
        log.warning("not ready", extra={"checks": problems})
        return JSONResponse(
            {"status": "unavailable", "checks": problems}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE
        )
    return JSONResponse({"status": "ok", "checks": {}})


@router.get("/metrics", response_class=Response)
async def metrics(m: MetricsDep) -> Response:
    """Prometheus metrics (text exposition format)."""
    body = await run_in_threadpool(m.render)
    return Response(body, media_type=CONTENT_TYPE)
