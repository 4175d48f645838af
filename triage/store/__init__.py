"""The service's store: SQLAlchemy 2 models, sessions and Alembic migrations (docs/service.md)."""

from __future__ import annotations

from triage.store.models import (
    Base,
    Incident,
    IngestToken,
    OutboxItem,
    ScaleUpRequest,
    SinkLink,
    Ticket,
    TicketEvent,
)
from triage.store.session import Database

__all__ = [
    "Base",
    "Database",
    "Incident",
    "IngestToken",
    "OutboxItem",
    "ScaleUpRequest",
    "SinkLink",
    "Ticket",
    "TicketEvent",
]
