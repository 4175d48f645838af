"""The pages: the ticket list with filters, the ticket page (its permalink), the incident page, downloads.

Thin: the data comes from ``triage.web.views``, the markup from ``triage/web/templates`` (autoescaped).
Every route needs read access (``ReaderDep``). Pages carry a Content-Security-Policy that allows no
script at all and only this origin's stylesheet, so even text that slipped past escaping could not run.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from triage.errors import InputError
from triage.service.deps import BlobsDep, ReaderDep, ReadSessionDep, SettingsDep
from triage.store.models import Incident, ScaleUpRequest, Ticket
from triage.tickets import service
from triage.web import render
from triage.web.charts import render as render_chart
from triage.web.export import NoSnapshot, export_snapshot, stream_file
from triage.web.views import FILTER_CHOICES, ListFilters, ticket_view

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 50
INT_MAX = 2**31 - 1
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

Text = Annotated[str | None, Query(max_length=200)]


def _page(template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(render(template, **context), status_code=status_code, headers=SECURITY_HEADERS)


def _not_found(user: str, message: str) -> HTMLResponse:
    return _page("error.html", status_code=404, user=user, status="Not found", message=message)


def _choice(value: str | None, name: str) -> str | None:
    return value if value in FILTER_CHOICES[name] else None


@router.get("/")
def index(_user: ReaderDep) -> RedirectResponse:
    return RedirectResponse("/tickets", status_code=303)


@router.get("/tickets", response_class=HTMLResponse)
def tickets_page(
    user: ReaderDep,
    db_session: ReadSessionDep,
    status: Text = None,
    verdict: Text = None,
    owner: Text = None,
    team: Text = None,
    namespace: Text = None,
    cluster: Text = None,
    offset: Annotated[int, Query(ge=0, le=INT_MAX)] = 0,
) -> HTMLResponse:
    """The ticket list: newest first, filtered by status, verdict, owner, team, namespace, cluster."""
    filters = ListFilters(
        status=_choice(status, "status"),
        verdict=_choice(verdict, "verdict"),
        owner=_choice(owner, "owner"),
        team=(team or "").strip() or None,
        namespace=(namespace or "").strip() or None,
        cluster=(cluster or "").strip() or None,
    )
    items, total = service.list_tickets(
        db_session=db_session, filters=filters.service_filters(), limit=PAGE_SIZE, offset=offset
    )
    return _page(
        "tickets.html",
        user=user,
        items=items,
        total=total,
        offset=offset,
        limit=PAGE_SIZE,
        filters=vars(filters),
        filters_obj=filters,
        choices=FILTER_CHOICES,
    )


@router.get("/tickets/{ticket_id}", response_class=HTMLResponse)
def ticket_page(
    ticket_id: str, user: ReaderDep, db_session: ReadSessionDep, settings: SettingsDep, blobs: BlobsDep
) -> HTMLResponse:
    """One ticket: the permalink handed to sinks and printed in the training log."""
    ticket = None
    if ticket_id.isdigit() and 0 < int(ticket_id) <= INT_MAX:
        ticket = db_session.get(Ticket, int(ticket_id))
    if ticket is None:
        return _not_found(user, f"There is no ticket {ticket_id[:40]!r}.")
    view = ticket_view(
        db_session=db_session, ticket=ticket, public_url=settings.public_url, blob_root=blobs.root
    )
    return _page("ticket.html", user=user, v=view, render_chart=render_chart)


@router.get("/scale-up-requests", response_class=HTMLResponse)
def scaleup_page(
    user: ReaderDep, db_session: ReadSessionDep, offset: Annotated[int, Query(ge=0, le=INT_MAX)] = 0
) -> HTMLResponse:
    """Scale-up requests and the contract's decision on each, newest first."""
    from sqlalchemy import select

    rows = db_session.scalars(
        select(ScaleUpRequest).order_by(ScaleUpRequest.id.desc()).offset(offset).limit(PAGE_SIZE)
    ).all()
    return _page("scaleup.html", user=user, items=rows)


def _incident(db_session: Any, incident_id: str) -> Incident | None:
    if not _UUID.match(incident_id):
        return None
    found: Incident | None = db_session.get(Incident, incident_id.lower())
    return found


@router.get("/incidents/{incident_id}", response_class=HTMLResponse, response_model=None)
def incident_page(incident_id: str, user: ReaderDep, db_session: ReadSessionDep) -> Response:
    """The link handed out at ingest: its ticket once grouped, else the incident's status."""
    incident = _incident(db_session, incident_id)
    if incident is None:
        return _not_found(user, "There is no such incident.")
    if incident.ticket_id is not None:
        return RedirectResponse(f"/tickets/{incident.ticket_id}", status_code=303)
    return _page("incident.html", user=user, incident=incident)


def _stored(db_session: Any, blobs: Any, incident_id: str) -> tuple[Incident, Path] | Response:
    incident = _incident(db_session, incident_id)
    if incident is None:
        return Response("no such incident\n", status_code=404, media_type="text/plain")
    if not incident.blob_path:
        return Response(
            "the bundle is no longer stored (retention)\n", status_code=410, media_type="text/plain"
        )
    path = Path(blobs.path(incident.blob_path))
    if not path.is_file():
        return Response("the bundle is no longer stored\n", status_code=410, media_type="text/plain")
    return incident, path


@router.get("/incidents/{incident_id}/bundle.json", response_model=None)
def bundle_download(
    incident_id: str, _user: ReaderDep, db_session: ReadSessionDep, blobs: BlobsDep
) -> Response:
    """The bundle as received (decompressed), streamed."""
    found = _stored(db_session, blobs, incident_id)
    if isinstance(found, Response):
        return found
    incident, path = found
    return StreamingResponse(
        stream_file(path, incident.blob_encoding),
        media_type="application/json",
        headers={
            "Content-Disposition": f'attachment; filename="incident-{incident.id}.json"',
            "X-Content-Type-Options": "nosniff",
        },
    )


@router.get("/incidents/{incident_id}/snapshot.pickle", response_model=None)
def snapshot_download(
    incident_id: str, _user: ReaderDep, db_session: ReadSessionDep, blobs: BlobsDep, settings: SettingsDep
) -> Response:
    """The allocator snapshot as torch pickles it: opens in pytorch.org/memory_viz."""
    found = _stored(db_session, blobs, incident_id)
    if isinstance(found, Response):
        return found
    incident, path = found
    workdir = Path(tempfile.mkdtemp(prefix="triage-export-"))
    out = workdir / "snapshot.pickle"
    try:
        export_snapshot(path, incident.blob_encoding, out, timeout_s=settings.analysis_timeout_seconds)
    except NoSnapshot as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return Response(f"{exc}\n", status_code=404, media_type="text/plain")
    except InputError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return Response(f"{exc}\n", status_code=422, media_type="text/plain")
    return FileResponse(
        out,
        media_type="application/octet-stream",
        filename=f"snapshot-{incident.id}.pickle",
        background=BackgroundTask(shutil.rmtree, workdir, ignore_errors=True),
    )
