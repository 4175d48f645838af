"""`/api/v1/incidents`: ingest (ingest token) and read (read access). Thin: the work is in
`triage.service.incidents`."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from triage.service import incidents as service
from triage.service.api import (
    NO_NUL,
    IncidentDetail,
    IncidentOut,
    IncidentPage,
    IncidentStatus,
    IngestAccepted,
    Problem,
)
from triage.service.deps import (
    BlobsDep,
    DatabaseDep,
    IngestClusterDep,
    MetricsDep,
    ReaderDep,
    ReadSessionDep,
    SettingsDep,
)
from triage.service.settings import Settings
from triage.store.models import Incident

router = APIRouter(prefix="/api/v1", tags=["incidents"])

_BUNDLE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "The incident bundle (docs/bundle.md), gzip'd with `Content-Encoding: gzip` or plain JSON.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IncidentBundle"}}},
    }
}


def incident_out(incident: Incident, settings: Settings, *, detail: bool = False) -> IncidentOut:
    data = {name: getattr(incident, name, None) for name in IncidentDetail.model_fields}
    data.update(
        error=incident.last_error,
        blob_available=incident.blob_path is not None,
        ticket_url=service.ticket_url(settings, incident.ticket_id)
        if incident.ticket_id is not None
        else None,
    )
    if detail:
        data["labels"] = incident.labels or {}
        return IncidentDetail.model_validate(data)
    data.pop("diagnosis", None)
    data.pop("labels", None)
    return IncidentOut.model_validate(data)


def _accepted(incident: Incident, settings: Settings) -> IngestAccepted:
    return IngestAccepted(
        incident_id=incident.id,
        status=incident.status,  # type: ignore[arg-type]
        verdict=incident.verdict,
        ticket_id=incident.ticket_id,
        ticket_url=service.incident_url(settings, incident.id),
    )


@router.post(
    "/incidents",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=IngestAccepted,
    responses={
        200: {
            "model": IngestAccepted,
            "description": "already stored (same incident_id): nothing new stored",
        },
        400: {"model": Problem, "description": "not JSON, or not gzip"},
        401: {"model": Problem},
        403: {"model": Problem},
        413: {
            "model": Problem,
            "description": "larger than TRIAGE_MAX_UPLOAD_BYTES / TRIAGE_MAX_BUNDLE_BYTES",
        },
        415: {"model": Problem, "description": "a Content-Encoding other than gzip"},
        422: {"model": Problem, "description": "not a valid incident bundle"},
    },
    openapi_extra=_BUNDLE_BODY,
    summary="Post an incident bundle",
)
async def post_incident(
    request: Request,
    cluster: IngestClusterDep,
    settings: SettingsDep,
    db: DatabaseDep,
    blobs: BlobsDep,
    metrics: MetricsDep,
) -> JSONResponse:
    """Stream the bundle to storage, validate it, store it durably, queue it for analysis."""
    started = time.perf_counter()
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > settings.max_upload_bytes:
        metrics.ingest_requests.labels("too_large").inc()
        raise HTTPException(
            status.HTTP_413_CONTENT_TOO_LARGE, f"the body exceeds {settings.max_upload_bytes} bytes"
        )
    try:
        upload = await service.receive(
            chunks=request.stream(),
            content_encoding=request.headers.get("content-encoding"),
            settings=settings,
            blobs=blobs,
        )
        stored = await run_in_threadpool(
            service.store, db=db, settings=settings, blobs=blobs, upload=upload, cluster=cluster
        )
    except service.UploadTooLarge as exc:
        metrics.ingest_requests.labels("too_large").inc()
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, str(exc))
    except service.UnsupportedEncoding as exc:
        metrics.ingest_requests.labels("rejected").inc()
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Encoding {exc}")
    except service.InvalidBundle as exc:
        metrics.ingest_requests.labels("rejected").inc()
        raise HTTPException(exc.status_code, exc.detail)
    except ClientDisconnect:
        metrics.ingest_requests.labels("disconnected").inc()
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "the client disconnected during the upload")
    metrics.ingest_requests.labels("accepted" if stored.created else "duplicate").inc()
    if stored.created:
        metrics.ingest_seconds.observe(time.perf_counter() - started)
        metrics.ingest_bytes.observe(stored.incident.blob_bytes)
    body = _accepted(stored.incident, settings)
    return JSONResponse(
        body.model_dump(mode="json"),
        status_code=status.HTTP_202_ACCEPTED if stored.created else status.HTTP_200_OK,
    )


@router.get("/incidents", response_model=IncidentPage, responses={401: {"model": Problem}})
def list_incidents(
    _user: ReaderDep,
    db_session: ReadSessionDep,
    settings: SettingsDep,
    status_: Annotated[IncidentStatus | None, Query(alias="status")] = None,
    verdict: Annotated[str | None, Query(max_length=40, pattern=NO_NUL)] = None,
    cluster: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    namespace: Annotated[str | None, Query(max_length=253, pattern=NO_NUL)] = None,
    ticket_id: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> IncidentPage:
    """Incidents, newest first."""
    filters = service.IncidentFilters(
        status=status_, verdict=verdict, cluster=cluster, namespace=namespace, ticket_id=ticket_id
    )
    rows, total = service.list_incidents(db_session=db_session, filters=filters, limit=limit, offset=offset)
    return IncidentPage(
        items=[incident_out(r, settings) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get(
    "/incidents/{incident_id}",
    response_model=IncidentDetail,
    responses={401: {"model": Problem}, 404: {"model": Problem}},
)
def get_incident(
    incident_id: Annotated[str, Path(max_length=64, pattern=NO_NUL)],
    _user: ReaderDep,
    db_session: ReadSessionDep,
    settings: SettingsDep,
) -> IncidentOut:
    """One incident with its status, last error and diagnosis."""
    incident = service.get(db_session=db_session, incident_id=incident_id.lower())
    if incident is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such incident")
    return incident_out(incident, settings, detail=True)
