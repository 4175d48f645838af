"""Prometheus metrics on a dedicated registry (one per app, so tests and replicas never collide).

Per-process counters and histograms for what this process did; gauges read from the database at scrape
time for what the whole deployment holds (queue depth, incidents by verdict, failing sink deliveries),
so every replica reports the same numbers for those.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from triage.store.models import Incident, OutboxItem, Ticket
from triage.store.session import Database

log = logging.getLogger("triage.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The app's metrics; `render()` is the /metrics body."""

    def __init__(self, db: Database | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ingest_requests = Counter(
            "triage_ingest_requests", "Bundle uploads by result", ["result"], registry=r
        )
        self.ingest_seconds = Histogram(
            "triage_ingest_seconds",
            "Upload start to durably stored",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.ingest_bytes = Histogram(
            "triage_ingest_bytes",
            "Decompressed bundle size",
            buckets=tuple(float(2**p) for p in range(10, 34, 2)),
            registry=r,
        )
        self.analyses = Counter("triage_analyses", "Finished analyses by verdict", ["verdict"], registry=r)
        self.analysis_failures = Counter(
            "triage_analysis_failures",
            "Failed analysis attempts (final: no retry left)",
            ["final"],
            registry=r,
        )
        self.analysis_seconds = Histogram(
            "triage_analysis_seconds",
            "Time to analyse one incident",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        if db is not None:
            r.register(_StoreCollector(db))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StoreCollector(Collector):
    def __init__(self, db: Database) -> None:
        self.db = db

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queue = GaugeMetricFamily("triage_queue_depth", "Incidents by queue state", labels=["status"])
        verdicts = GaugeMetricFamily("triage_incidents", "Analysed incidents by verdict", labels=["verdict"])
        tickets = GaugeMetricFamily("triage_tickets", "Tickets by status", labels=["status"])
        failing = GaugeMetricFamily(
            "triage_sink_failures", "Undelivered sink deliveries whose last attempt failed", labels=["sink"]
        )
        pending = GaugeMetricFamily("triage_outbox_pending", "Undelivered sink deliveries", labels=["sink"])
        try:
            with self.db.read_session() as s:
                by_status = dict(
                    s.execute(select(Incident.status, func.count()).group_by(Incident.status)).all()
                )
                for status in ("queued", "running", "failed"):
                    queue.add_metric([status], float(by_status.get(status, 0)))
                for verdict, n in s.execute(
                    select(Incident.verdict, func.count())
                    .where(Incident.verdict.is_not(None))
                    .group_by(Incident.verdict)
                ).all():
                    verdicts.add_metric([str(verdict)], float(n))
                for status, n in s.execute(select(Ticket.status, func.count()).group_by(Ticket.status)).all():
                    tickets.add_metric([str(status)], float(n))
                undelivered = OutboxItem.delivered_at.is_(None)
                for sink, n in s.execute(
                    select(OutboxItem.sink, func.count())
                    .where(undelivered, OutboxItem.last_error.is_not(None))
                    .group_by(OutboxItem.sink)
                ).all():
                    failing.add_metric([str(sink)], float(n))
                for sink, n in s.execute(
                    select(OutboxItem.sink, func.count()).where(undelivered).group_by(OutboxItem.sink)
                ).all():
                    pending.add_metric([str(sink)], float(n))
        except Exception:
            log.exception("metrics: the store could not be read")
            return
        yield from (queue, verdicts, tickets, failing, pending)
