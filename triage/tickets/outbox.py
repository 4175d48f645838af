"""The sinks' outbox: every ticket change reaches every configured sink, late if need be, never twice.

Two entry points (docs/service.md, "Sinks hook"):

``enqueue(session, ticket, action)``
    called by the ticket code in the same transaction as the change (so a change and its delivery
    commit or roll back together). It stores the ticket payload as it is now, in one row addressed to
    ``*``: "every sink of the ticket's team". The team's sink list is resolved by the delivering worker,
    the process that has the sinks configuration (``TRIAGE_SINKS_CONFIG``); an API-only replica has none
    and still records every change.

``deliver_due(session_factory, settings) -> int``
    called by the worker loop. First it *expands* each ``*`` row into one row per configured sink of
    the ticket's team (routing: ``registry.Registry.team_for``), in one transaction. Then it delivers:

    - rows of one (ticket, sink) pair go out in order, one at a time: only the oldest undelivered row of
      a pair (its *head*) may be claimed, so a create and its updates can never race into two issues;
    - a claim is an atomic compare-and-set (``attempts`` must still be what the worker read, the row
      must be due); it pushes ``next_attempt_at`` one lease ahead, so a worker that dies returns its claim
      when the lease ends. Several workers (threads, replicas, SQLite or PostgreSQL) deliver each row once;
    - the head is sent with the *newest* payload of its pair and the rows behind it are marked delivered
      with it (``coalesced``): 64 ranks folding into one ticket while a tracker is down become one issue
      with the final counts, not one issue and 63 comments;
    - whether a delivery is a ``create`` or an ``update`` is decided by the ``SinkLink`` table, not by the
      row: once a sink returned an external reference, every later delivery of that ticket updates it
      (a recurrence is a comment, never a new external ticket); a reference the system says is gone
      (404) is dropped and the next attempt creates a new one;
    - a failure keeps the row with ``last_error`` and retries it with exponential backoff
      (``delivery.backoff_base_s`` doubling up to ``backoff_max_s``; ``Retry-After`` honoured; a refused
      request waits the maximum): an outage delays a delivery, it never drops one.

No HTTP call runs inside a database transaction: claim, send, record are three steps.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import CursorResult, Executable, delete, func, select, update
from sqlalchemy.orm import Session

from triage.store.models import RESOLVED, Incident, OutboxItem, SinkLink, Ticket, utcnow
from triage.tickets.sinks.base import ExternalRef, PermanentSinkError, RefGone, Sink, SinkError
from triage.tickets.sinks.payload import Action, Counts, TicketPayload
from triage.tickets.sinks.registry import Registry, close_cached, from_settings

log = logging.getLogger("triage.tickets.outbox")

ALL_SINKS = "*"  # an enqueued change not yet expanded into one row per sink
EXPANDED = "expanded"
ERROR_MAX = 2000
REF_MAX = 500  # SinkLink.external_ref / OutboxItem.external_ref column width
EXPAND_BATCH = 500

SessionFactory = Callable[[], Session]


def _rows(s: Session, stmt: Executable) -> int:
    """Rows matched by an UPDATE/DELETE: the compare-and-set of claims and fences."""
    result = s.execute(stmt)
    assert isinstance(result, CursorResult)
    return int(result.rowcount)


# -- enqueue ------------------------------------------------------------------------------------------


def enqueue(session: Session, ticket: Ticket, action: str) -> None:
    """Record that ``ticket`` changed (``action``: ``create`` or ``update``) for delivery to its sinks."""
    session.add(
        OutboxItem(
            ticket_id=ticket.id,
            sink=ALL_SINKS,
            action="create" if action == "create" else "update",
            payload=snapshot(ticket),
            next_attempt_at=utcnow(),
        )
    )
    session.flush()


def snapshot(ticket: Ticket) -> dict[str, Any]:
    """The ticket as a payload document (JSON-ready; the URL and the evidence file are added at delivery)."""
    summary = ticket.summary if isinstance(ticket.summary, dict) else {}
    evidence = [
        str(item.get("fact"))
        for item in summary.get("evidence") or []
        if isinstance(item, dict) and item.get("fact")
    ]
    leak = summary.get("leak_site")
    leak_text = None
    if isinstance(leak, dict) and leak.get("filename"):
        leak_text = f"{leak.get('filename')}:{leak.get('line', '?')}"
        if leak.get("name"):
            leak_text += f" in {leak.get('name')}"
    action: Action = "resolved" if ticket.status == RESOLVED else "updated"
    doc = TicketPayload(
        ticket_id=str(ticket.id),
        fingerprint=ticket.fingerprint,
        action=action,
        title=ticket.title or f"{ticket.verdict} ({ticket.fingerprint[:12]})",
        verdict=ticket.verdict,
        owner=ticket.owner,
        team=ticket.team,
        confidence=float(ticket.confidence or 0.0),
        status=ticket.status,
        headline=ticket.headline or "",
        evidence=evidence,
        actions=[str(a) for a in summary.get("actions") or []],
        missing=[str(m) for m in summary.get("missing") or []],
        candidates=[str(c) for c in summary.get("candidates") or []],
        counts=Counts(
            incidents=ticket.incident_count or 0,
            ranks=ticket.rank_count or 0,
            restarts=ticket.max_restart or 0,
            pods=getattr(ticket, "pod_count", 0) or 0,
        ),
        namespace=ticket.namespace,
        job=ticket.job,
        leak_site=leak_text,
        first_seen=ticket.first_seen,
        last_seen=ticket.last_seen,
    )
    return doc.model_dump(mode="json", exclude={"evidence_document", "url", "delivery_id"})


# -- deliver ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Claim:
    id: int
    ticket_id: int
    sink: str
    attempts: int  # after the claim: the fence for recording the result
    newest_id: int
    payload: dict[str, Any]
    link: SinkLink | None
    evidence: dict[str, Any]


def deliver_due(
    session_factory: SessionFactory,
    settings: Any,
    *,
    registry: Registry | None = None,
) -> int:
    """Expand new changes into per-sink rows, then deliver what is due; returns the deliveries made."""
    reg = registry if registry is not None else from_settings(settings)
    expand(session_factory, reg)
    at = utcnow()
    public_url = str(getattr(settings, "public_url", "") or "").rstrip("/")
    worker = f"{socket.gethostname()}:{os.getpid()}"
    done = 0
    for head_id, seen_attempts in _due_heads(session_factory, at, reg.delivery.batch):
        claim = _claim(session_factory, head_id, seen_attempts, at, reg)
        if claim is None:
            continue
        done += _deliver(session_factory, reg, claim, public_url, worker)
    return done


def expand(session_factory: SessionFactory, registry: Registry) -> int:
    """Turn each ``*`` row into one row per configured sink of its ticket's team; returns rows expanded."""
    with session_factory() as s:
        rows = s.execute(
            select(OutboxItem.id, OutboxItem.ticket_id)
            .where(OutboxItem.sink == ALL_SINKS, OutboxItem.delivered_at.is_(None))
            .order_by(OutboxItem.id)
            .limit(EXPAND_BATCH)
        ).all()
        if not rows:
            return 0
        by_ticket: dict[int, list[int]] = {}
        for row_id, ticket_id in rows:
            by_ticket.setdefault(ticket_id, []).append(row_id)
        now = utcnow()
        expanded = 0
        for ticket_id, ids in by_ticket.items():
            mine = [
                i
                for i in ids
                if _rows(
                    s,
                    update(OutboxItem)
                    .where(OutboxItem.id == i, OutboxItem.delivered_at.is_(None))
                    .values(delivered_at=now, external_ref=EXPANDED, last_error=None),
                )
                == 1
            ]
            if not mine:
                continue  # another worker expanded them
            newest = s.get(OutboxItem, max(mine))
            assert newest is not None
            ticket = s.get(Ticket, ticket_id)
            if ticket is None:
                continue
            team = registry.team_for(ticket.team, ticket.owner)
            payload = dict(newest.payload) | {"team": team}
            creating = any(
                a == "create"
                for (a,) in s.execute(select(OutboxItem.action).where(OutboxItem.id.in_(mine))).all()
            )
            for sink in registry.sinks(team):
                s.add(
                    OutboxItem(
                        ticket_id=ticket_id,
                        sink=sink.name,
                        action="create" if creating else "update",
                        payload=payload,
                        next_attempt_at=now,
                    )
                )
            expanded += len(mine)
        s.commit()
        return expanded


def _due_heads(session_factory: SessionFactory, now: datetime, batch: int) -> list[tuple[int, int]]:
    """(id, attempts) of the oldest undelivered row of each (ticket, sink) pair, when that row is due."""
    heads = (
        select(func.min(OutboxItem.id))
        .where(OutboxItem.delivered_at.is_(None), OutboxItem.sink != ALL_SINKS)
        .group_by(OutboxItem.ticket_id, OutboxItem.sink)
    )
    with session_factory() as s:
        rows = s.execute(
            select(OutboxItem.id, OutboxItem.attempts)
            .where(OutboxItem.id.in_(heads), OutboxItem.next_attempt_at <= now)
            .order_by(OutboxItem.next_attempt_at, OutboxItem.id)
            .limit(batch)
        ).all()
        s.rollback()
    return [(int(i), int(a)) for i, a in rows]


def _claim(
    session_factory: SessionFactory, head_id: int, seen_attempts: int, now: datetime, registry: Registry
) -> _Claim | None:
    with session_factory() as s:
        won = _rows(
            s,
            update(OutboxItem)
            .where(
                OutboxItem.id == head_id,
                OutboxItem.delivered_at.is_(None),
                OutboxItem.attempts == seen_attempts,
                OutboxItem.next_attempt_at <= now,
            )
            .values(
                attempts=seen_attempts + 1,
                next_attempt_at=now + timedelta(seconds=registry.delivery.lease_s),
            ),
        )
        if won != 1:
            s.rollback()
            return None
        row = s.get(OutboxItem, head_id)
        assert row is not None
        newest = s.execute(
            select(OutboxItem.id, OutboxItem.payload)
            .where(
                OutboxItem.ticket_id == row.ticket_id,
                OutboxItem.sink == row.sink,
                OutboxItem.delivered_at.is_(None),
            )
            .order_by(OutboxItem.id.desc())
            .limit(1)
        ).one()
        link = s.scalars(
            select(SinkLink).where(SinkLink.ticket_id == row.ticket_id, SinkLink.sink == row.sink)
        ).one_or_none()
        evidence = _evidence_document(s, row.ticket_id)
        claim = _Claim(
            id=row.id,
            ticket_id=row.ticket_id,
            sink=row.sink,
            attempts=seen_attempts + 1,
            newest_id=int(newest[0]),
            payload=dict(newest[1] or {}),
            link=link,
            evidence=evidence,
        )
        s.commit()
        return claim


def _evidence_document(s: Session, ticket_id: int) -> dict[str, Any]:
    """The latest incident's full diagnosis (the ticket keeps a trimmed one), for the evidence attachment."""
    ticket = s.get(Ticket, ticket_id)
    if ticket is None:
        return {}
    if ticket.latest_incident_id:
        diagnosis = s.scalar(select(Incident.diagnosis).where(Incident.id == ticket.latest_incident_id))
        if isinstance(diagnosis, dict):
            return diagnosis
    return dict(ticket.summary or {})


def _deliver(
    session_factory: SessionFactory, registry: Registry, claim: _Claim, public_url: str, worker: str
) -> int:
    team = str(claim.payload.get("team") or registry.config.default_team)
    sink = registry.sink(team, claim.sink)
    if sink is None:
        _failed(
            session_factory,
            registry,
            claim,
            PermanentSinkError(f"sink {claim.sink!r} of team {team!r} is not configured any more"),
        )
        return 0
    try:
        payload = TicketPayload.model_validate(
            claim.payload
            | {
                "url": f"{public_url}/tickets/{claim.ticket_id}" if public_url else "",
                "delivery_id": str(claim.id),
                "evidence_document": claim.evidence,
            }
        )
    except ValueError as exc:
        _failed(session_factory, registry, claim, PermanentSinkError(f"stored payload is invalid: {exc}"))
        return 0
    ref: ExternalRef | None = None
    skipped = False
    try:
        if claim.link is None:
            ref = sink.create(payload.model_copy(update={"action": "created"}))
        elif not sink.config.notify_updates and payload.action != "resolved":
            skipped = True
        else:
            sink.update(_ref_of(sink, claim.link), payload)
    except RefGone as exc:
        _gone(session_factory, claim, exc)
        return 0
    except SinkError as exc:
        _failed(session_factory, registry, claim, exc)
        return 0
    except Exception as exc:  # a bug in a sink must not stop the others; the row is retried
        log.exception("sink raised unexpectedly", extra={"sink": claim.sink, "ticket_id": claim.ticket_id})
        _failed(session_factory, registry, claim, SinkError(f"{claim.sink}: {type(exc).__name__}: {exc}"))
        return 0
    _delivered(session_factory, claim, ref, skipped, worker)
    return 0 if skipped else 1


def _ref_of(sink: Sink[Any], link: SinkLink) -> ExternalRef:
    try:
        doc = json.loads(link.external_ref)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "id" in doc:
        return ExternalRef(
            sink=sink.name,
            kind=str(doc.get("kind") or sink.kind),
            id=str(doc["id"]),
            url=link.url,
            data=doc.get("data") or {},
        )
    return ExternalRef(sink=sink.name, kind=sink.kind, id=link.external_ref, url=link.url)


def _ref_text(ref: ExternalRef) -> str:
    full = json.dumps(
        {"id": ref.id, "kind": ref.kind, "data": ref.data}, separators=(",", ":"), sort_keys=True
    )
    if len(full) <= REF_MAX:
        return full
    return json.dumps({"id": ref.id, "kind": ref.kind}, separators=(",", ":"))[:REF_MAX]


def _delivered(
    session_factory: SessionFactory, claim: _Claim, ref: ExternalRef | None, skipped: bool, worker: str
) -> None:
    now = utcnow()
    external = (
        ref.id[:REF_MAX] if ref is not None else (claim.link.external_ref[:REF_MAX] if claim.link else None)
    )
    with session_factory() as s:
        fenced = _rows(
            s,
            update(OutboxItem)
            .where(OutboxItem.id == claim.id, OutboxItem.attempts == claim.attempts)
            .values(delivered_at=now, last_error=None, external_ref="skipped" if skipped else external),
        )
        if fenced != 1:
            log.warning(
                "delivery finished after its lease ran out; another worker may have sent it too",
                extra={"outbox_id": claim.id, "sink": claim.sink, "worker": worker},
            )
        if ref is not None:
            exists = s.scalars(
                select(SinkLink).where(SinkLink.ticket_id == claim.ticket_id, SinkLink.sink == claim.sink)
            ).one_or_none()
            if exists is None:
                s.add(
                    SinkLink(
                        ticket_id=claim.ticket_id, sink=claim.sink, external_ref=_ref_text(ref), url=ref.url
                    )
                )
        # the rows queued behind the head were sent with it (their newest payload)
        s.execute(
            update(OutboxItem)
            .where(
                OutboxItem.ticket_id == claim.ticket_id,
                OutboxItem.sink == claim.sink,
                OutboxItem.delivered_at.is_(None),
                OutboxItem.id > claim.id,
                OutboxItem.id <= claim.newest_id,
            )
            .values(delivered_at=now, last_error=None, external_ref=f"coalesced:{claim.id}")
        )
        s.commit()
    log.info(
        "sink delivery",
        extra={
            "sink": claim.sink,
            "ticket_id": claim.ticket_id,
            "outbox_id": claim.id,
            "created": ref is not None,
            "skipped": skipped,
            "coalesced": claim.newest_id - claim.id,
        },
    )


def backoff_s(attempts: int, registry: Registry, exc: SinkError) -> float:
    """Seconds until the next attempt after ``attempts`` failed ones."""
    d = registry.delivery
    if isinstance(exc, PermanentSinkError):
        return d.backoff_max_s
    wait = d.backoff_base_s * (2 ** min(max(attempts - 1, 0), 30))
    if exc.retry_after is not None:
        wait = max(wait, exc.retry_after)
    return min(wait, d.backoff_max_s)


def _failed(session_factory: SessionFactory, registry: Registry, claim: _Claim, exc: SinkError) -> None:
    wait = backoff_s(claim.attempts, registry, exc)
    with session_factory() as s:
        s.execute(
            update(OutboxItem)
            .where(OutboxItem.id == claim.id, OutboxItem.attempts == claim.attempts)
            .values(next_attempt_at=utcnow() + timedelta(seconds=wait), last_error=str(exc)[:ERROR_MAX])
        )
        s.commit()
    log.warning(
        "sink delivery failed; will retry",
        extra={
            "sink": claim.sink,
            "ticket_id": claim.ticket_id,
            "outbox_id": claim.id,
            "attempt": claim.attempts,
            "retry_in_s": round(wait, 1),
            "error": str(exc)[:300],
        },
    )


def _gone(session_factory: SessionFactory, claim: _Claim, exc: SinkError) -> None:
    """The external ticket was deleted: forget it; the retry (now) creates a new one."""
    with session_factory() as s:
        s.execute(delete(SinkLink).where(SinkLink.ticket_id == claim.ticket_id, SinkLink.sink == claim.sink))
        s.execute(
            update(OutboxItem)
            .where(OutboxItem.id == claim.id, OutboxItem.attempts == claim.attempts)
            .values(next_attempt_at=utcnow(), last_error=str(exc)[:ERROR_MAX])
        )
        s.commit()
    log.warning(
        "external ticket gone; a new one will be created",
        extra={"sink": claim.sink, "ticket_id": claim.ticket_id},
    )


def purge_delivered(session_factory: SessionFactory, *, older_than: timedelta, batch: int = 5000) -> int:
    """Delete rows delivered longer ago than ``older_than`` (the SinkLink table keeps the references)."""
    cutoff = utcnow() - older_than
    removed = 0
    while True:
        with session_factory() as s:
            ids = s.scalars(
                select(OutboxItem.id)
                .where(OutboxItem.delivered_at.is_not(None), OutboxItem.delivered_at < cutoff)
                .limit(batch)
            ).all()
            if not ids:
                return removed
            removed += _rows(s, delete(OutboxItem).where(OutboxItem.id.in_(ids)))
            s.commit()


__all__ = [
    "ALL_SINKS",
    "backoff_s",
    "close_cached",
    "deliver_due",
    "enqueue",
    "expand",
    "purge_delivered",
    "snapshot",
]
