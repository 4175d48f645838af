"""Ticket sinks: one file per external system behind one small interface (``base.Sink``).

``create(payload) -> ExternalRef`` opens the ticket outside, ``update(ref, payload)`` reports a
recurrence or a resolution. Which sinks a ticket reaches is configured per team (``registry``); deliveries
go through the outbox (``triage.tickets.outbox``), which retries until the system is back.
"""

from __future__ import annotations

from triage.tickets.sinks.base import (
    ExternalRef,
    PermanentSinkError,
    RefGone,
    Sink,
    SinkConfig,
    SinkError,
)
from triage.tickets.sinks.payload import Counts, TicketPayload

__all__ = [
    "Counts",
    "ExternalRef",
    "PermanentSinkError",
    "RefGone",
    "Sink",
    "SinkConfig",
    "SinkError",
    "TicketPayload",
]
