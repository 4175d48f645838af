"""The ORM models. Field meanings are documented in docs/service.md; times are timezone-aware UTC."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Incident queue states and ticket workflow states.
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
INCIDENT_STATUSES = (QUEUED, RUNNING, DONE, FAILED)
OPEN, ACKNOWLEDGED, RESOLVED = "open", "acknowledged", "resolved"
TICKET_STATUSES = (OPEN, ACKNOWLEDGED, RESOLVED)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp stored as UTC and always read back timezone-aware (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dt.datetime: UTCDateTime,
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
    }


class Ticket(Base):
    """One problem of one job: every rank and restart whose incident has the same fingerprint."""

    __tablename__ = "tickets"
    __table_args__ = (
        Index("ix_tickets_status_last_seen", "status", "last_seen"),
        Index("ix_tickets_last_seen", "last_seen"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    title: Mapped[str] = mapped_column(String(500), default="")
    cluster: Mapped[str] = mapped_column(String(200), default="-")
    namespace: Mapped[str | None] = mapped_column(String(253), index=True)
    job: Mapped[str | None] = mapped_column(String(500))
    team: Mapped[str | None] = mapped_column(String(200), index=True)
    owner: Mapped[str | None] = mapped_column(String(20))
    verdict: Mapped[str] = mapped_column(String(40), index=True)
    site: Mapped[str] = mapped_column(String(1000), default="-")
    status: Mapped[str] = mapped_column(String(20), default=OPEN)
    assignee: Mapped[str | None] = mapped_column(String(200))
    incident_count: Mapped[int] = mapped_column(Integer, default=0)
    rank_count: Mapped[int] = mapped_column(Integer, default=0)
    pod_count: Mapped[int] = mapped_column(Integer, default=0)
    max_restart: Mapped[int | None] = mapped_column(Integer)
    first_seen: Mapped[dt.datetime]
    last_seen: Mapped[dt.datetime]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    acknowledged_at: Mapped[dt.datetime | None]
    resolved_at: Mapped[dt.datetime | None]
    reopen_count: Mapped[int] = mapped_column(Integer, default=0)
    latest_incident_id: Mapped[str | None] = mapped_column(String(36))
    headline: Mapped[str] = mapped_column(Text, default="")
    confidence: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)

    incidents: Mapped[list[Incident]] = relationship(
        back_populates="ticket", order_by="Incident.rank", lazy="raise_on_sql", viewonly=True
    )


class Incident(Base):
    """One crash of one process, as posted by a collector: stored first, analysed by the worker."""

    __tablename__ = "incidents"
    __table_args__ = (
        Index("ix_incidents_queue", "status", "available_at"),
        Index("ix_incidents_ticket_rank", "ticket_id", "rank"),
        Index("ix_incidents_received_at", "received_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(200))
    received_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    occurred_at: Mapped[dt.datetime]
    kind: Mapped[str] = mapped_column(String(40))
    namespace: Mapped[str | None] = mapped_column(String(253))
    pod: Mapped[str | None] = mapped_column(String(253))
    node: Mapped[str | None] = mapped_column(String(253))
    container: Mapped[str | None] = mapped_column(String(253))
    job: Mapped[str | None] = mapped_column(String(500))
    owner_kind: Mapped[str | None] = mapped_column(String(100))
    owner_name: Mapped[str | None] = mapped_column(String(500))
    team: Mapped[str | None] = mapped_column(String(200))
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    rank: Mapped[int | None] = mapped_column(Integer)
    local_rank: Mapped[int | None] = mapped_column(Integer)
    world_size: Mapped[int | None] = mapped_column(Integer)
    restart_count: Mapped[int | None] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(Integer)
    batch_size: Mapped[int | None] = mapped_column(Integer)

    blob_path: Mapped[str | None] = mapped_column(String(500))
    blob_encoding: Mapped[str] = mapped_column(String(20), default="gzip")
    blob_sha256: Mapped[str] = mapped_column(String(64))
    blob_bytes: Mapped[int] = mapped_column(BigInteger)
    wire_bytes: Mapped[int] = mapped_column(BigInteger)

    status: Mapped[str] = mapped_column(String(20), default=QUEUED)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    available_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    lease_owner: Mapped[str | None] = mapped_column(String(100))
    lease_expires_at: Mapped[dt.datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)

    verdict: Mapped[str | None] = mapped_column(String(40), index=True)
    owner: Mapped[str | None] = mapped_column(String(20))
    confidence: Mapped[float | None] = mapped_column(Float)
    diagnosis: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    analysed_at: Mapped[dt.datetime | None]
    ticket_id: Mapped[int | None] = mapped_column(ForeignKey("tickets.id", ondelete="SET NULL"))

    ticket: Mapped[Ticket | None] = relationship(back_populates="incidents", lazy="raise_on_sql")


class TicketEvent(Base):
    """The ticket's history: created, each folded incident, reopen, status, assignment, notes."""

    __tablename__ = "ticket_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ticket_id: Mapped[int] = mapped_column(ForeignKey("tickets.id", ondelete="CASCADE"), index=True)
    at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(20))
    actor: Mapped[str] = mapped_column(String(200), default="system")
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)


class OutboxItem(Base):
    """A pending delivery of a ticket change to one external sink (written by the sinks' `enqueue`)."""

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_due", "delivered_at", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ticket_id: Mapped[int] = mapped_column(ForeignKey("tickets.id", ondelete="CASCADE"), index=True)
    sink: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(20))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[dt.datetime | None]
    external_ref: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class SinkLink(Base):
    """The external ticket (Jira key, GitHub issue, Redmine id …) a ticket was delivered as, per sink."""

    __tablename__ = "sink_links"
    __table_args__ = (UniqueConstraint("ticket_id", "sink", name="uq_sink_links_ticket_sink"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ticket_id: Mapped[int] = mapped_column(ForeignKey("tickets.id", ondelete="CASCADE"))
    sink: Mapped[str] = mapped_column(String(100))
    external_ref: Mapped[str] = mapped_column(String(500))
    url: Mapped[str | None] = mapped_column(String(2000))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ScaleUpRequest(Base):
    """A scale-up request: the small-scale report and the contract's decision on it."""

    __tablename__ = "scale_up_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    requested_by: Mapped[str] = mapped_column(String(200), default="anonymous")
    namespace: Mapped[str | None] = mapped_column(String(253))
    job: Mapped[str | None] = mapped_column(String(500))
    gpus: Mapped[int] = mapped_column(Integer)
    requested_gpus: Mapped[int | None] = mapped_column(Integer)
    mfu: Mapped[float] = mapped_column(Float)
    gpu_utilization: Mapped[float] = mapped_column(Float)
    step_time_s: Mapped[float] = mapped_column(Float)
    approved: Mapped[bool] = mapped_column(Boolean)
    reasons: Mapped[list[Any]] = mapped_column(default=list)
    decision: Mapped[dict[str, Any]] = mapped_column(default=dict)
    contract_version: Mapped[str] = mapped_column(String(100), default="")


class IngestToken(Base):
    """A cluster's ingest token, stored as its sha256 (the token itself is never stored)."""

    __tablename__ = "ingest_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster: Mapped[str] = mapped_column(String(200), unique=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
