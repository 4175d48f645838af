"""The app factory: `create_app(settings)` migrates the store, syncs the ingest tokens, wires the routers
and (in its lifespan) runs the analysis workers in background threads."""

from __future__ import annotations

import importlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
from sqlalchemy import delete, select, text
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from triage.service.blobs import BlobStore
from triage.service.deps import TokenCache
from triage.service.metrics import Metrics
from triage.service.routers import health, incidents, scaleup, tickets
from triage.service.settings import Settings, hash_token
from triage.store.migrate import upgrade
from triage.store.models import IngestToken
from triage.store.session import Database

log = logging.getLogger("triage.service")

PAGES_MODULE = "triage.service.routers.pages"
STATIC_DIR = Path(__file__).resolve().parents[1] / "web" / "static"
_TOKEN_LOCK_KEY = 0x7472_6962

Role = Literal["all", "worker"]


def create_app(settings: Settings, *, role: Role = "all", start_worker: bool | None = None) -> FastAPI:
    """The service. `role="worker"` serves only health and metrics (for `--worker-only` replicas);
    `start_worker` (default: `settings.worker`, always for the worker role) runs the workers in threads."""
    db = Database(settings.database_url, pool_size=settings.db_pool_size)
    blobs = BlobStore(settings.blobs)
    blobs.ensure()
    upgrade(db)
    sync_ingest_tokens(db=db, tokens=settings.ingest_token_map())
    metrics = Metrics(db)
    run_workers = (True if role == "worker" else settings.worker) if start_worker is None else start_worker

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = None
        if run_workers:
            from triage.worker import WorkerPool

            pool = WorkerPool(settings, db, metrics=metrics)
            pool.start()
        app.state.workers = pool
        try:
            yield
        finally:
            if pool is not None:
                pool.stop()
            db.dispose()

    app = FastAPI(
        title="oom-triage",
        summary="OOM triage for GPU training clusters: is it the platform or the training code?",
        version=_version(),
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.db = db
    app.state.blobs = blobs
    app.state.metrics = metrics
    app.state.token_cache = TokenCache()
    app.state.role = role
    app.include_router(health.router)
    if role == "all":
        app.include_router(incidents.router)
        app.include_router(tickets.router)
        app.include_router(scaleup.router)
        _include_pages(app)
    app.add_middleware(RequestLogMiddleware)
    _document_bundle(app)
    return app


def _document_bundle(app: FastAPI) -> None:
    """Add the incident bundle's schema to the OpenAPI components (the ingest body is streamed, so
    FastAPI does not see it as a parameter)."""
    from fastapi.openapi.utils import get_openapi

    from triage.schemas import IncidentBundle

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            bundle = IncidentBundle.model_json_schema(
                by_alias=True, ref_template="#/components/schemas/{model}"
            )
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(bundle.pop("$defs", {}))
            schemas["IncidentBundle"] = bundle
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def sync_ingest_tokens(*, db: Database, tokens: dict[str, str]) -> None:
    """Store the configured ingest tokens hashed; drop the ones no longer configured."""
    wanted = {cluster: hash_token(token) for cluster, token in tokens.items()}
    with db.session() as s:
        if db.is_postgres:
            s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _TOKEN_LOCK_KEY})
        have = {row.cluster: row for row in s.scalars(select(IngestToken))}
        stale = [c for c, row in have.items() if wanted.get(c) != row.token_sha256]
        if stale:
            s.execute(delete(IngestToken).where(IngestToken.cluster.in_(stale)))
            s.flush()
        for cluster, digest in wanted.items():
            if cluster not in have or cluster in stale:
                s.add(IngestToken(cluster=cluster, token_sha256=digest))
        s.commit()
    if stale or len(wanted) != len(have):
        log.info("ingest tokens synced", extra={"clusters": sorted(wanted)})


def _include_pages(app: FastAPI) -> None:
    try:
        pages = importlib.import_module(PAGES_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != PAGES_MODULE:
            raise
        app.include_router(_fallback_pages())
        return
    app.include_router(pages.router)
    if STATIC_DIR.is_dir():
        from fastapi.staticfiles import StaticFiles

        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")


def _fallback_pages() -> APIRouter:
    """Without the pages (a build without triage.service.routers.pages): the links lead to the JSON."""
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def index() -> RedirectResponse:
        return RedirectResponse("/api/v1/tickets")

    @router.get("/incidents/{incident_id}")
    def incident_page(incident_id: str) -> RedirectResponse:
        return RedirectResponse(f"/api/v1/incidents/{incident_id}")

    @router.get("/tickets/{ticket_id}")
    def ticket_page(ticket_id: int) -> RedirectResponse:
        return RedirectResponse(f"/api/v1/tickets/{ticket_id}")

    return router


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("oom-triage")
    except Exception:
        return "0"


class RequestLogMiddleware:
    """One structured log line per request (method, path, status, duration, request id); streaming-safe."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _header(scope, b"x-request-id") or secrets.token_hex(8)
        status_code = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            path = scope.get("path", "")
            if path not in ("/healthz", "/readyz", "/metrics") or status_code >= 400:
                log.info(
                    "request",
                    extra={
                        "method": scope.get("method"),
                        "path": path,
                        "status": status_code,
                        "ms": round((time.perf_counter() - started) * 1000, 1),
                        "request_id": request_id,
                    },
                )


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            text_value: Any = value.decode("latin-1")[:64]
            return str(text_value)
    return None
