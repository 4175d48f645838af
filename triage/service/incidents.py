"""Incidents: streaming a posted bundle to the blob dir, validating it, storing the row; reading them.

The order is what makes ingest safe to kill at any moment: body → temp file (size-capped) → scan and
validate (bounded memory) → fsync + rename → commit the row (status=queued). A crash before the commit
leaves at most a temp file, swept later; the collector's retry of the same incident_id then succeeds.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from triage.errors import InputTooLarge
from triage.schemas import IncidentBundle
from triage.service.blobs import BlobStore
from triage.service.bundlescan import BadBundle, GunzipReader, scan_bundle
from triage.service.settings import Settings
from triage.store.models import QUEUED, Incident, utcnow
from triage.store.session import Database

log = logging.getLogger("triage.ingest")

INT_MAX = 2**31 - 1


class UploadTooLarge(Exception):
    """The body (or its decompressed form) exceeds the configured cap."""


class UnsupportedEncoding(Exception):
    """A Content-Encoding other than gzip or identity."""


class InvalidBundle(Exception):
    """The bundle is not a valid incident bundle; `detail` says why (JSON-able)."""

    def __init__(self, detail: Any, *, status_code: int = 422) -> None:
        super().__init__(str(detail))
        self.detail = detail
        self.status_code = status_code


@dataclass
class Upload:
    """A request body, complete on disk but not yet validated or committed."""

    tmp: Path
    gzipped: bool
    wire_bytes: int


@dataclass
class Stored:
    incident: Incident
    created: bool


async def receive(
    *, chunks: AsyncIterator[bytes], content_encoding: str | None, settings: Settings, blobs: BlobStore
) -> Upload:
    """Stream a request body to a temp file in the blob dir, capping its size (memory stays flat)."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("gzip", "x-gzip"):
        gzipped = True
    elif encoding in ("identity", ""):
        gzipped = False
    else:
        raise UnsupportedEncoding(encoding)
    tmp = blobs.new_temp()
    size = 0
    try:
        with tmp.open("wb") as f:
            async for chunk in chunks:
                size += len(chunk)
                if size > settings.max_upload_bytes:
                    raise UploadTooLarge(f"the request body exceeds {settings.max_upload_bytes} bytes")
                f.write(chunk)
    except BaseException:
        blobs.delete(tmp)
        raise
    return Upload(tmp=tmp, gzipped=gzipped, wire_bytes=size)


def store(*, db: Database, settings: Settings, blobs: BlobStore, upload: Upload, cluster: str) -> Stored:
    """Validate an uploaded bundle and store it durably: the blob first, then the incident row."""
    try:
        with upload.tmp.open("rb") as raw:
            reader = GunzipReader(raw, gzipped=upload.gzipped, max_bytes=settings.max_bundle_bytes)
            try:
                scan = scan_bundle(reader)
            except InputTooLarge as exc:
                raise UploadTooLarge(str(exc))
            except BadBundle as exc:
                raise InvalidBundle(str(exc), status_code=400)
        if scan.snapshot not in ("absent", "null", "object"):
            raise InvalidBundle(f"snapshot must be an object or null, got {scan.snapshot}")
        try:
            bundle = IncidentBundle.model_validate({**scan.fields, "snapshot": None})
        except ValidationError as exc:
            raise InvalidBundle(exc.errors(include_url=False, include_context=False, include_input=False))
        incident_id = str(bundle.incident_id)
        try:
            occurred = bundle.occurred_at.astimezone(dt.UTC)
        except (OverflowError, ValueError):
            raise InvalidBundle("occurred_at is out of range")
        with db.read_session() as s:
            existing = s.get(Incident, incident_id)
        if existing is not None:
            return Stored(existing, created=False)
        with upload.tmp.open("rb+") as f:
            os.fsync(f.fileno())
        received = utcnow()
        rel = blobs.commit(upload.tmp, incident_id=incident_id, at=received, gzipped=upload.gzipped)
    finally:
        blobs.delete(upload.tmp)
    incident = _row(bundle, cluster=cluster, received=received, occurred=occurred)
    incident.blob_path = rel
    incident.blob_encoding = "gzip" if upload.gzipped else "identity"
    incident.blob_sha256 = reader.sha256.hexdigest()
    incident.blob_bytes = reader.size
    incident.wire_bytes = upload.wire_bytes
    try:
        with db.session() as s:
            s.add(incident)
            s.commit()
    except IntegrityError:  # the same incident_id committed by a concurrent upload
        blobs.delete(rel)
        with db.read_session() as s:
            existing = s.get(Incident, incident_id)
        if existing is None:
            raise
        return Stored(existing, created=False)
    except BaseException:
        blobs.delete(rel)
        raise
    log.info(
        "incident stored",
        extra={
            "incident_id": incident_id,
            "cluster": cluster,
            "bytes": reader.size,
            "wire_bytes": upload.wire_bytes,
        },
    )
    return Stored(incident, created=True)


def _text(value: Any, limit: int) -> str | None:
    if value is None:
        return None
    text = str(value).replace("\x00", "")
    return text[:limit]


def _int(value: Any) -> int | None:
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool) and -INT_MAX <= value <= INT_MAX
        else None
    )


def clean_json(value: Any) -> Any:
    """JSON data safe for any store: no NUL characters (PostgreSQL refuses them), finite floats."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, dict):
        return {clean_json(str(k)): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def _row(bundle: IncidentBundle, *, cluster: str, received: dt.datetime, occurred: dt.datetime) -> Incident:
    w = bundle.workload
    labels = clean_json(dict(w.labels)) if w is not None and w.labels else {}
    return Incident(
        id=str(bundle.incident_id),
        cluster=cluster,
        received_at=received,
        occurred_at=occurred,
        kind=bundle.kind,
        namespace=_text(w.namespace, 253) if w else None,
        pod=_text(w.pod, 253) if w else None,
        node=_text(w.node, 253) if w else None,
        container=_text(w.container, 253) if w else None,
        job=_text(w.job, 500) if w else None,
        owner_kind=_text(w.owner_kind, 100) if w else None,
        owner_name=_text(w.owner_name, 500) if w else None,
        team=_text(w.team, 200) if w else None,
        labels=labels,
        rank=_int(w.rank) if w else None,
        local_rank=_int(w.local_rank) if w else None,
        world_size=_int(w.world_size) if w else None,
        restart_count=_int(w.restart_count) if w else None,
        step=_int(w.step) if w else None,
        batch_size=_int(w.batch_size) if w else None,
        status=QUEUED,
        attempts=0,
        available_at=received,
    )


def incident_url(settings: Settings, incident_id: str) -> str:
    """The link handed out at ingest: the incident's page, which leads to its ticket once grouped."""
    return f"{settings.public_url}/incidents/{incident_id}"


def ticket_url(settings: Settings, ticket_id: int) -> str:
    """The ticket's page."""
    return f"{settings.public_url}/tickets/{ticket_id}"


def get(*, db_session: Session, incident_id: str) -> Incident | None:
    """The incident with this id, or None."""
    return db_session.get(Incident, incident_id)


@dataclass(frozen=True)
class IncidentFilters:
    status: str | None = None
    verdict: str | None = None
    cluster: str | None = None
    namespace: str | None = None
    ticket_id: int | None = None


def list_incidents(
    *, db_session: Session, filters: IncidentFilters, limit: int = 50, offset: int = 0
) -> tuple[list[Incident], int]:
    """One page of incidents, newest first, and the total matching."""
    stmt = select(Incident)
    count = select(func.count()).select_from(Incident)
    for column, value in (
        (Incident.status, filters.status),
        (Incident.verdict, filters.verdict),
        (Incident.cluster, filters.cluster),
        (Incident.namespace, filters.namespace),
        (Incident.ticket_id, filters.ticket_id),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
            count = count.where(column == value)
    total = db_session.scalar(count) or 0
    rows = db_session.scalars(
        stmt.order_by(Incident.received_at.desc(), Incident.id).limit(limit).offset(offset)
    ).all()
    return list(rows), int(total)
