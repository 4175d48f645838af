"""The API's request and response models (what /docs and the OpenAPI schema show)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NO_NUL = (
    r"^[^\x00]*$"  # PostgreSQL text cannot hold NUL: such a filter is refused (422), never sent to the store
)

JSON_BODY_MAX = 1 << 20  # request bodies of the JSON endpoints (the ingest route has its own, larger caps)

IncidentStatus = Literal["queued", "running", "done", "failed"]
TicketStatus = Literal["open", "acknowledged", "resolved"]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class IngestAccepted(BaseModel):
    """The answer to a POST of a bundle: 202 when stored now, 200 when it was stored before."""

    incident_id: str
    status: IncidentStatus
    verdict: str | None = None
    ticket_id: int | None = None
    ticket_url: str


class IncidentOut(_Out):
    id: str
    cluster: str
    received_at: dt.datetime
    occurred_at: dt.datetime
    kind: str
    namespace: str | None = None
    pod: str | None = None
    node: str | None = None
    container: str | None = None
    job: str | None = None
    owner_kind: str | None = None
    owner_name: str | None = None
    team: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    restart_count: int | None = None
    step: int | None = None
    batch_size: int | None = None
    status: IncidentStatus
    attempts: int
    error: str | None = Field(default=None, description="the last analysis error (kept when failed)")
    verdict: str | None = None
    owner: str | None = None
    confidence: float | None = None
    analysed_at: dt.datetime | None = None
    ticket_id: int | None = None
    ticket_url: str | None = None
    blob_bytes: int
    blob_available: bool


class IncidentDetail(IncidentOut):
    diagnosis: dict[str, Any] | None = None
    labels: dict[str, Any] = Field(default_factory=dict)


class Page(BaseModel):
    total: int
    limit: int
    offset: int


class IncidentPage(Page):
    items: list[IncidentOut]


class TicketOut(_Out):
    id: int
    url: str
    fingerprint: str
    title: str
    cluster: str
    namespace: str | None = None
    job: str | None = None
    team: str | None = None
    owner: str | None = None
    verdict: str
    site: str
    status: TicketStatus
    assignee: str | None = None
    incident_count: int
    rank_count: int
    pod_count: int
    max_restart: int | None = None
    first_seen: dt.datetime
    last_seen: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime
    acknowledged_at: dt.datetime | None = None
    resolved_at: dt.datetime | None = None
    reopen_count: int
    latest_incident_id: str | None = None
    headline: str
    confidence: float | None = None


class RankRow(_Out):
    """One row of a ticket's per-rank table."""

    rank: int | None = None
    pod: str | None = None
    node: str | None = None
    step: int | None = None
    restart: int | None = None
    incident_id: str
    verdict: str | None = None
    status: IncidentStatus
    occurred_at: dt.datetime


class EventOut(_Out):
    at: dt.datetime
    kind: str
    actor: str
    detail: dict[str, Any]


class LinkOut(_Out):
    sink: str
    external_ref: str
    url: str | None = None


class TicketDetail(TicketOut):
    summary: dict[str, Any]
    ranks: list[RankRow]
    events: list[EventOut]
    links: list[LinkOut]


class TicketPage(Page):
    items: list[TicketOut]


class TicketPatch(BaseModel):
    """A change to a ticket: any of status, assignee (null unassigns), a note."""

    model_config = ConfigDict(extra="forbid")

    status: TicketStatus | None = None
    assignee: str | None = Field(default=None, max_length=200)
    note: str | None = Field(default=None, max_length=10000)


class ScaleUpIn(BaseModel):
    """A small-scale report asking for more GPUs. Fractions are 0..1."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    gpus: int = Field(ge=1, le=1_000_000, description="GPUs the small-scale run used")
    mfu: float = Field(ge=0, le=1, description="model FLOPs utilisation of the small-scale run, 0..1")
    gpu_utilization: float = Field(ge=0, le=1, description="GPU utilisation of the small-scale run, 0..1")
    step_time_s: float = Field(gt=0, description="seconds per training step")
    requested_gpus: int | None = Field(default=None, ge=1, le=1_000_000, description="GPUs asked for")
    namespace: str | None = Field(default=None, max_length=253)
    job: str | None = Field(default=None, max_length=500)


class ScaleUpOut(_Out):
    id: int
    created_at: dt.datetime
    requested_by: str
    namespace: str | None = None
    job: str | None = None
    gpus: int
    requested_gpus: int | None = None
    mfu: float
    gpu_utilization: float
    step_time_s: float
    approved: bool
    decision: Literal["approved", "denied"]
    reasons: list[Any]
    checks: list[Any]
    contract_version: str


class ScaleUpPage(Page):
    items: list[ScaleUpOut]


class Problem(BaseModel):
    """An error answer."""

    detail: Any
