"""Helpers shared by the sink tests (a module of its own: ``conftest`` names are ambiguous on sys.path)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from triage.tickets.sinks.payload import Counts, TicketPayload

HOSTILE = "<script>alert(1)</script>"


def make_payload(**changes: Any) -> TicketPayload:
    base: dict[str, Any] = {
        "ticket_id": "42",
        "fingerprint": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        "delivery_id": "7",
        "title": "tensor_leak in ml/llama-70b-sft",
        "verdict": "tensor_leak",
        "owner": "algorithm",
        "team": "ml-research",
        "confidence": 0.93,
        "url": "http://triage.test/tickets/42",
        "headline": "Live memory grew 1.2 GiB per step from one site that is never freed.",
        "evidence": [
            "412 blocks (9.8 GiB) allocated at train.py:88 in step are still live after 12 steps.",
            f"The leak site's frame is named {HOSTILE}.",
        ],
        "actions": ["Detach the loss before appending it: losses.append(loss.item())."],
        "counts": Counts(incidents=3, ranks=2, restarts=1, pods=2),
        "namespace": "ml",
        "job": "llama-70b-sft",
        "leak_site": f"train.py:88 in {HOSTILE}",
        "first_seen": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "last_seen": datetime(2026, 1, 2, 3, 14, 5, tzinfo=UTC),
        "evidence_document": {"verdict": "tensor_leak", "summary": {"allocated_bytes": 123}},
    }
    base.update(changes)
    return TicketPayload(**base)


# -- a store with tickets, for the outbox tests --------------------------------------------------------


def new_ticket(db: Any, n: int, *, team: str | None = "ml-research", owner: str | None = "algorithm") -> int:
    """Insert a ticket as the grouping code would leave it; returns its id."""
    from triage.store.models import Ticket

    now = datetime.now(UTC)
    with db.session() as s:
        t = Ticket(
            fingerprint=f"{n:064x}",
            title=f"tensor leak in ml/job-{n}",
            cluster="test",
            namespace="ml",
            job=f"job-{n}",
            team=team,
            owner=owner,
            verdict="tensor_leak",
            site="train.py:88",
            incident_count=1,
            rank_count=1,
            first_seen=now,
            last_seen=now,
            headline="live memory grows every step",
            confidence=0.9,
            summary={
                "evidence": [
                    {"rule": "tensor_leak", "fact": f"{HOSTILE} keeps 412 blocks alive", "value": 1}
                ],
                "actions": ["detach the loss"],
                "leak_site": {"filename": "train.py", "line": 88, "name": "step"},
            },
        )
        s.add(t)
        s.commit()
        return int(t.id)


def touch(db: Any, ticket_id: int, action: str = "update", **changes: Any) -> None:
    """Change a ticket and enqueue the change, in one transaction, as the ticket code does."""
    from triage.store.models import Ticket
    from triage.tickets.outbox import enqueue

    with db.session() as s:
        t = s.get(Ticket, ticket_id)
        assert t is not None
        for k, v in changes.items():
            setattr(t, k, v)
        s.flush()
        enqueue(s, t, action)
        s.commit()
