"""The outbox on a real store (SQLite file and PostgreSQL): expansion per team, create-then-update,
retries through an outage, coalescing, exactly-once with several workers, leases, gone references.
Sinks are webhooks pointing at a local recording server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select, update

from tests.realparts import HttpRecorder, Recorded, Reply, json_reply
from tests.sinks.sinkkit import new_ticket, touch
from triage.store.models import OutboxItem, SinkLink, utcnow
from triage.tickets.outbox import ALL_SINKS, deliver_due, expand, purge_delivered
from triage.tickets.sinks.base import ExternalRef, RefGone, Sink, SinkConfig
from triage.tickets.sinks.payload import TicketPayload
from triage.tickets.sinks.registry import Registry, parse

SETTINGS = SimpleNamespace(public_url="http://triage.test", sinks_config=None)
SECRET = "outbox-test-secret"


def registry(*urls: str, team: str = "ml-research", **delivery: Any) -> Registry:
    pacing = {"backoff_base_s": 0.2, "backoff_max_s": 1.0, "lease_s": 30} | delivery
    timeout = min(5.0, pacing["lease_s"] / 4)
    sinks = [
        {"kind": "webhook", "name": f"hook{i}", "url": u, "secret": SECRET, "timeout_s": timeout}
        for i, u in enumerate(urls)
    ]
    doc = {
        "default_team": "platform",
        "owners": {"platform": "platform"},
        "teams": {team: {"sinks": sinks}, "platform": {"sinks": []}},
        "delivery": pacing,
    }
    return Registry(parse(doc))


@pytest.fixture
def reg(recorder: HttpRecorder) -> Iterator[Registry]:
    r = registry(recorder.url)
    yield r
    r.close()


def rows(db: Any, ticket_id: int | None = None) -> list[OutboxItem]:
    with db.read_session() as s:
        stmt = select(OutboxItem).order_by(OutboxItem.id)
        if ticket_id is not None:
            stmt = stmt.where(OutboxItem.ticket_id == ticket_id)
        return list(s.scalars(stmt).all())


def links(db: Any) -> list[SinkLink]:
    with db.read_session() as s:
        return list(s.scalars(select(SinkLink).order_by(SinkLink.id)).all())


def events(rec: HttpRecorder) -> list[tuple[str, str]]:
    return [(r.json()["ticket"]["ticket_id"], r.json()["event"]) for r in rec.requests]


def test_create_then_update_reaches_every_sink_of_the_team(db: Any) -> None:
    with HttpRecorder() as a, HttpRecorder() as b:
        reg = registry(a.url, b.url)
        tid = new_ticket(db, 1)
        touch(db, tid, "create")
        assert [(r.sink, r.action) for r in rows(db)] == [(ALL_SINKS, "create")]
        assert deliver_due(db.session, SETTINGS, registry=reg) == 2
        assert [(r.sink, r.external_ref is not None, r.delivered_at is not None) for r in rows(db)] == [
            (ALL_SINKS, True, True),
            ("hook0", True, True),
            ("hook1", True, True),
        ]
        assert sorted(link.sink for link in links(db)) == ["hook0", "hook1"]
        first = a.requests[0].json()
        assert first["event"] == "ticket.created"
        assert first["ticket"]["url"] == f"http://triage.test/tickets/{tid}"
        assert first["ticket"]["team"] == "ml-research"
        assert first["ticket"]["evidence"] == ["<script>alert(1)</script> keeps 412 blocks alive"]
        assert first["ticket"]["leak_site"] == "train.py:88 in step"

        touch(db, tid, incident_count=5, rank_count=4)
        assert deliver_due(db.session, SETTINGS, registry=reg) == 2
        assert events(a) == [(str(tid), "ticket.created"), (str(tid), "ticket.updated")]
        assert a.requests[1].json()["ticket"]["counts"]["ranks"] == 4
        assert len(links(db)) == 2  # an update, not a new external ticket
        assert deliver_due(db.session, SETTINGS, registry=reg) == 0
        reg.close()


def test_routing_by_owner_and_default_team(db: Any) -> None:
    with HttpRecorder() as ml, HttpRecorder() as platform:
        doc = {
            "default_team": "platform",
            "owners": {"platform": "platform"},
            "teams": {
                "ml-research": {"sinks": [{"kind": "webhook", "url": ml.url, "secret": SECRET}]},
                "platform": {"sinks": [{"kind": "webhook", "url": platform.url, "secret": SECRET}]},
            },
        }
        reg = Registry(parse(doc))
        leak = new_ticket(db, 1, team="ml-research", owner="algorithm")
        quota = new_ticket(db, 2, team="ml-research", owner="platform")
        orphan = new_ticket(db, 3, team=None, owner="algorithm")
        for t in (leak, quota, orphan):
            touch(db, t, "create")
        assert deliver_due(db.session, SETTINGS, registry=reg) == 3
        assert [e[0] for e in events(ml)] == [str(leak)]
        assert sorted(e[0] for e in events(platform)) == sorted([str(quota), str(orphan)])
        reg.close()


def test_an_outage_delays_delivery_and_coalesces_it(db: Any, recorder: HttpRecorder, reg: Registry) -> None:
    """Sink down (503, then connection refused) while a job's ranks fold in → one create once it is back."""
    tid = new_ticket(db, 7)
    touch(db, tid, "create")
    recorder.down = True
    assert deliver_due(db.session, SETTINGS, registry=reg) == 0
    [head] = [r for r in rows(db) if r.sink == "hook0"]
    assert head.attempts == 1 and head.delivered_at is None and "HTTP 503" in (head.last_error or "")
    assert head.next_attempt_at > utcnow()

    recorder.stop()  # now the port refuses connections
    for n in range(2, 6):
        touch(db, tid, incident_count=n, rank_count=n)
    for _ in range(3):
        time.sleep(0.25)
        assert deliver_due(db.session, SETTINGS, registry=reg) == 0
    head = next(r for r in rows(db) if r.id == head.id)
    assert head.attempts >= 2 and "ConnectError" in (head.last_error or "")
    assert links(db) == []

    recorder.down = False
    recorder.start()
    deadline = time.monotonic() + 10
    delivered = 0
    while delivered == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        delivered = deliver_due(db.session, SETTINGS, registry=reg)
    assert delivered == 1
    assert deliver_due(db.session, SETTINGS, registry=reg) == 0
    assert events(recorder) == [(str(tid), "ticket.created")]  # exactly once
    assert recorder.requests[0].json()["ticket"]["counts"]["ranks"] == 5  # with the newest state
    assert all(r.delivered_at is not None for r in rows(db))
    assert [link.sink for link in links(db)] == ["hook0"]


def test_backoff_grows_and_a_refusal_waits_the_maximum(db: Any) -> None:
    statuses = iter([500, 500, 400])

    def handler(req: Recorded) -> Reply:
        return next(statuses), {}, b"no"

    with HttpRecorder(handler=handler) as rec:
        reg = registry(rec.url, backoff_base_s=10, backoff_max_s=100)
        tid = new_ticket(db, 8)
        touch(db, tid, "create")
        waits = []
        for _ in range(3):
            deliver_due(db.session, SETTINGS, registry=reg)
            head = next(r for r in rows(db) if r.sink == "hook0")
            waits.append((head.next_attempt_at - utcnow()).total_seconds())
            with db.session() as s:  # make it due again without waiting
                s.execute(update(OutboxItem).where(OutboxItem.id == head.id).values(next_attempt_at=utcnow()))
                s.commit()
        assert 8 < waits[0] <= 10 and 18 < waits[1] <= 20 and 98 < waits[2] <= 100
        assert "HTTP 400" in (head.last_error or "")
        reg.close()


def test_several_workers_deliver_each_change_once(db: Any) -> None:
    created: dict[str, int] = {}
    lock = threading.Lock()

    def handler(req: Recorded) -> Reply:
        doc = req.json()
        time.sleep(0.02)
        if doc["event"] == "ticket.created":
            with lock:
                created[doc["ticket"]["ticket_id"]] = created.get(doc["ticket"]["ticket_id"], 0) + 1
        return json_reply(200, {"id": doc["ticket"]["ticket_id"]})

    with HttpRecorder(handler=handler) as rec:
        reg = registry(rec.url)
        tickets = [new_ticket(db, 100 + i) for i in range(8)]
        for t in tickets:
            touch(db, t, "create")
        stop = threading.Event()
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                while not stop.is_set():
                    deliver_due(db.session, SETTINGS, registry=reg)
                    time.sleep(0.01)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for th in threads:
            th.start()
        for t in tickets:  # recurrences arrive while the workers deliver
            touch(db, t, incident_count=2)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(r.delivered_at is None for r in rows(db)):
            time.sleep(0.05)
        stop.set()
        for th in threads:
            th.join(10)
        assert errors == []
        assert all(r.delivered_at is not None for r in rows(db))
        assert created == {str(t): 1 for t in tickets}
        with db.read_session() as s:
            assert len(s.scalars(select(SinkLink)).all()) == len(tickets)
        # per ticket, no update was sent before its create
        for t in tickets:
            mine = [e for e in events(rec) if e[0] == str(t)]
            assert mine[0][1] == "ticket.created" and all(e[1] == "ticket.updated" for e in mine[1:])
        reg.close()


def test_a_dead_workers_claim_returns_after_the_lease(db: Any, recorder: HttpRecorder) -> None:
    reg = registry(recorder.url, lease_s=0.5)
    tid = new_ticket(db, 9)
    touch(db, tid, "create")
    expand(db.session, reg)
    head = next(r for r in rows(db) if r.sink == "hook0")
    with db.session() as s:  # a worker claimed it, then died before sending
        s.execute(
            update(OutboxItem)
            .where(OutboxItem.id == head.id)
            .values(attempts=1, next_attempt_at=utcnow() + timedelta(seconds=0.5))
        )
        s.commit()
    assert deliver_due(db.session, SETTINGS, registry=reg) == 0
    time.sleep(0.6)
    assert deliver_due(db.session, SETTINGS, registry=reg) == 1
    assert events(recorder) == [(str(tid), "ticket.created")]
    reg.close()


class MemorySink(Sink[SinkConfig]):
    """The no-op test plugin: keeps issues in a dict; an issue can be deleted behind its back."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__(SinkConfig(kind="memory"))
        self.issues: dict[str, list[str]] = {}
        self.made = 0

    def create(self, payload: TicketPayload) -> ExternalRef:
        self.made += 1
        key = f"M-{self.made}"
        self.issues[key] = [payload.action]
        return self.ref(key, f"memory://{key}")

    def update(self, ref: ExternalRef, payload: TicketPayload) -> None:
        if ref.id not in self.issues:
            raise RefGone(f"{ref.id} was deleted")
        self.issues[ref.id].append(payload.action)


def test_a_deleted_external_ticket_is_created_again(db: Any) -> None:
    sink = MemorySink()
    reg = Registry(parse({"teams": {"ml-research": {}}}), sinks=[("ml-research", sink)])
    tid = new_ticket(db, 10)
    touch(db, tid, "create")
    assert deliver_due(db.session, SETTINGS, registry=reg) == 1
    assert sink.issues == {"M-1": ["created"]}
    [link] = links(db)
    assert (link.sink, link.url) == ("memory", "memory://M-1")

    del sink.issues["M-1"]  # someone deleted the issue in the tracker
    touch(db, tid, incident_count=3)
    assert deliver_due(db.session, SETTINGS, registry=reg) == 0  # the update finds it gone
    assert links(db) == []
    assert deliver_due(db.session, SETTINGS, registry=reg) == 1  # and the retry opens a new one
    assert sink.issues == {"M-2": ["created"]}
    assert [link.url for link in links(db)] == ["memory://M-2"]


def test_updates_can_be_muted_per_sink_and_a_missing_sink_keeps_its_rows(
    db: Any, recorder: HttpRecorder
) -> None:
    doc = {
        "teams": {
            "ml-research": {
                "sinks": [
                    {
                        "kind": "webhook",
                        "name": "quiet",
                        "url": recorder.url,
                        "secret": SECRET,
                        "notify_updates": False,
                    }
                ]
            }
        },
        "delivery": {"backoff_base_s": 0.2, "backoff_max_s": 1.0},
    }
    reg = Registry(parse(doc))
    tid = new_ticket(db, 11)
    touch(db, tid, "create")
    touch(db, tid, incident_count=2)
    assert deliver_due(db.session, SETTINGS, registry=reg) == 1
    touch(db, tid, incident_count=3)
    assert deliver_due(db.session, SETTINGS, registry=reg) == 0
    assert [r.external_ref for r in rows(db) if r.sink == "quiet"][-1] == "skipped"
    touch(db, tid, status="resolved")  # a resolution still goes out
    assert deliver_due(db.session, SETTINGS, registry=reg) == 1
    assert events(recorder) == [(str(tid), "ticket.created"), (str(tid), "ticket.resolved")]

    # the sink is removed from the configuration while a change is pending: the row waits, with the reason
    touch(db, tid, incident_count=4, status="open")
    expand(db.session, reg)
    reg.close()
    empty = Registry(parse({"teams": {"ml-research": {}}}))
    assert deliver_due(db.session, SETTINGS, registry=empty) == 0
    pending = [r for r in rows(db) if r.delivered_at is None]
    assert len(pending) == 1 and "not configured any more" in (pending[0].last_error or "")


def test_delivered_rows_can_be_purged(db: Any, recorder: HttpRecorder, reg: Registry) -> None:
    tid = new_ticket(db, 12)
    touch(db, tid, "create")
    assert deliver_due(db.session, SETTINGS, registry=reg) == 1
    touch(db, tid, incident_count=2)  # pending: never purged
    assert purge_delivered(db.session, older_than=timedelta(hours=1)) == 0
    assert purge_delivered(db.session, older_than=timedelta(seconds=-1)) == 2
    assert [(r.sink, r.delivered_at) for r in rows(db)] == [(ALL_SINKS, None)]
    assert len(links(db)) == 1
