"""The ticket lifecycle: read, filter, status workflow (open → acknowledged → resolved), assignment.

Keyword-only functions on a caller's session (Dispatch style); every change records a TicketEvent and
hands the ticket to the sinks' outbox (`triage.tickets.outbox.enqueue`) in the same transaction.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from triage.store.models import (
    ACKNOWLEDGED,
    OPEN,
    RESOLVED,
    Incident,
    SinkLink,
    Ticket,
    TicketEvent,
    utcnow,
)

log = logging.getLogger("triage.tickets")

TRANSITIONS: dict[str, frozenset[str]] = {
    OPEN: frozenset({ACKNOWLEDGED, RESOLVED}),
    ACKNOWLEDGED: frozenset({OPEN, RESOLVED}),
    RESOLVED: frozenset({OPEN}),
}
OUTBOX_MODULE = "triage.tickets.outbox"
_MISSING = object()
_outbox: Any = None


class TicketNotFound(LookupError):
    """No ticket with that id."""


class InvalidTransition(ValueError):
    """A status change the workflow does not allow."""


@dataclass(frozen=True)
class TicketFilters:
    team: str | None = None
    verdict: str | None = None
    status: str | None = None
    namespace: str | None = None
    cluster: str | None = None
    owner: str | None = None
    assignee: str | None = None


def outbox_module() -> ModuleType | None:
    """The sinks' outbox module, when this build has it."""
    global _outbox
    if _outbox is None:
        try:
            _outbox = importlib.import_module(OUTBOX_MODULE)
        except ModuleNotFoundError as exc:
            if exc.name != OUTBOX_MODULE:
                raise
            _outbox = _MISSING
    return None if _outbox is _MISSING else _outbox


def enqueue_sinks(*, db_session: Session, ticket: Ticket, action: str) -> None:
    """Hand a created/updated ticket to the sinks' outbox; a failing hook never loses the ticket."""
    module = outbox_module()
    if module is None:
        return
    try:
        with db_session.begin_nested():
            module.enqueue(db_session, ticket, action)
    except Exception:
        log.exception("sink outbox enqueue failed", extra={"ticket_id": ticket.id, "action": action})


def get(*, db_session: Session, ticket_id: int) -> Ticket | None:
    """The ticket with this id, or None."""
    return db_session.get(Ticket, ticket_id)


def _filtered(stmt: Select[Any], filters: TicketFilters) -> Select[Any]:
    for column, value in (
        (Ticket.team, filters.team),
        (Ticket.verdict, filters.verdict),
        (Ticket.status, filters.status),
        (Ticket.namespace, filters.namespace),
        (Ticket.cluster, filters.cluster),
        (Ticket.owner, filters.owner),
        (Ticket.assignee, filters.assignee),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    return stmt


def list_tickets(
    *, db_session: Session, filters: TicketFilters, limit: int = 50, offset: int = 0
) -> tuple[list[Ticket], int]:
    """One page of tickets matching the filters, most recently seen first, and the total."""
    total = db_session.scalar(_filtered(select(func.count()).select_from(Ticket), filters)) or 0
    rows = db_session.scalars(
        _filtered(select(Ticket), filters)
        .order_by(Ticket.last_seen.desc(), Ticket.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return list(rows), int(total)


def ranks(*, db_session: Session, ticket_id: int, limit: int = 5000) -> list[Incident]:
    """The per-rank table: the ticket's incidents by rank, then restart, then time."""
    return list(
        db_session.scalars(
            select(Incident)
            .where(Incident.ticket_id == ticket_id)
            .order_by(
                Incident.rank.asc().nulls_last(),
                Incident.restart_count.asc().nulls_first(),
                Incident.occurred_at,
            )
            .limit(limit)
        ).all()
    )


def events(*, db_session: Session, ticket_id: int) -> list[TicketEvent]:
    """The ticket's history, oldest first."""
    return list(
        db_session.scalars(
            select(TicketEvent)
            .where(TicketEvent.ticket_id == ticket_id)
            .order_by(TicketEvent.at, TicketEvent.id)
        ).all()
    )


def links(*, db_session: Session, ticket_id: int) -> list[SinkLink]:
    """The external tickets this ticket was delivered as."""
    return list(
        db_session.scalars(
            select(SinkLink).where(SinkLink.ticket_id == ticket_id).order_by(SinkLink.sink)
        ).all()
    )


def _locked(db_session: Session, ticket_id: int) -> Ticket:
    ticket = db_session.scalars(
        select(Ticket)
        .where(Ticket.id == ticket_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one_or_none()
    if ticket is None:
        raise TicketNotFound(ticket_id)
    return ticket


def transition(*, db_session: Session, ticket_id: int, status: str, actor: str) -> Ticket:
    """Move a ticket along the workflow; the same status is a no-op, a forbidden move raises."""
    ticket = _locked(db_session, ticket_id)
    if status == ticket.status:
        return ticket
    if status not in TRANSITIONS.get(ticket.status, frozenset()):
        raise InvalidTransition(f"a ticket cannot go from {ticket.status} to {status}")
    now = utcnow()
    previous = ticket.status
    ticket.status = status
    ticket.updated_at = now
    if status == ACKNOWLEDGED:
        ticket.acknowledged_at = now
    elif status == RESOLVED:
        ticket.resolved_at = now
    elif status == OPEN:
        ticket.resolved_at = None
        ticket.acknowledged_at = None
    db_session.add(
        TicketEvent(ticket_id=ticket.id, kind="status", actor=actor, detail={"from": previous, "to": status})
    )
    db_session.flush()
    enqueue_sinks(db_session=db_session, ticket=ticket, action="update")
    return ticket


def assign(*, db_session: Session, ticket_id: int, assignee: str | None, actor: str) -> Ticket:
    """Set (or clear, with None) the ticket's assignee."""
    ticket = _locked(db_session, ticket_id)
    if ticket.assignee == assignee:
        return ticket
    db_session.add(
        TicketEvent(
            ticket_id=ticket.id,
            kind="assigned",
            actor=actor,
            detail={"from": ticket.assignee, "to": assignee},
        )
    )
    ticket.assignee = assignee
    ticket.updated_at = utcnow()
    db_session.flush()
    enqueue_sinks(db_session=db_session, ticket=ticket, action="update")
    return ticket


def add_note(*, db_session: Session, ticket_id: int, note: str, actor: str) -> Ticket:
    """Record a note in the ticket's history."""
    ticket = _locked(db_session, ticket_id)
    db_session.add(TicketEvent(ticket_id=ticket.id, kind="note", actor=actor, detail={"note": note}))
    ticket.updated_at = utcnow()
    db_session.flush()
    return ticket
