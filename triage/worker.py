"""The analysis worker: a database-backed queue of stored incidents.

A worker claims one incident at a time — `SELECT … FOR UPDATE SKIP LOCKED` on PostgreSQL, an atomic
`UPDATE … WHERE status='queued'` on SQLite — and holds it under a lease. The analysis runs with a time
limit (in a child process by default); its result is written only if the lease is still this claim's
(fencing), then the incident is folded into its ticket in the same transaction. A failed attempt goes
back to the queue with a back-off; after `max_attempts` the incident is `failed` with the error kept.
A worker that dies leaves its claim to expire, and the next worker picks the incident up again.

`triage serve` runs `WorkerPool` in background threads; `triage serve --worker-only` runs only workers.
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import socket
import threading
import time
from datetime import timedelta
from types import ModuleType
from typing import Any

from sqlalchemy import or_, select, update

from triage.service.analysis import AnalysisError, AnalysisProcess, InvalidInput, analyse_blob
from triage.service.blobs import BlobStore
from triage.service.incidents import clean_json
from triage.service.metrics import Metrics
from triage.service.settings import Settings
from triage.store.models import DONE, FAILED, QUEUED, RUNNING, Incident, utcnow
from triage.store.session import Database
from triage.tickets import grouping

log = logging.getLogger("triage.worker")

MAINTENANCE_EVERY_S = 300.0
SINK_EVERY_S = 1.0
TEMP_MAX_AGE_S = 3600.0
RETENTION_BATCH = 500
ERROR_MAX_CHARS = 4000
OUTBOX_MODULE = "triage.tickets.outbox"


class Claim:
    """One claimed incident: its id, the lease token that fences writes, the attempt number."""

    def __init__(
        self, incident_id: str, token: str, attempt: int, blob_path: str | None, encoding: str, size: int
    ) -> None:
        self.incident_id = incident_id
        self.token = token
        self.attempt = attempt
        self.blob_path = blob_path
        self.encoding = encoding
        self.size = size


class Worker:
    """Claims and analyses incidents one at a time (one per thread)."""

    def __init__(
        self, settings: Settings, db: Database, *, metrics: Metrics | None = None, name: str | None = None
    ) -> None:
        self.settings = settings
        self.db = db
        self.metrics = metrics
        self.blobs = BlobStore(settings.blobs)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._process = AnalysisProcess() if settings.analysis_isolation == "process" else None
        self._stopping = False

    # -- the queue -----------------------------------------------------------------------------------

    def claim(self) -> Claim | None:
        """Take the oldest due incident (or one whose lease expired), or None."""
        now = utcnow()
        due = or_(
            (Incident.status == QUEUED) & (Incident.available_at <= now),
            (Incident.status == RUNNING) & (Incident.lease_expires_at < now),
        )
        with self.db.session() as s:
            row = s.execute(
                select(Incident.id, Incident.status, Incident.attempts, Incident.last_error)
                .where(due)
                .order_by(Incident.available_at, Incident.received_at)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            incident_id, status, attempts, last_error = row
            if status == RUNNING and attempts >= self.settings.max_attempts:
                # the last attempt's worker died (or hung past its lease): give up on this incident
                s.execute(
                    update(Incident)
                    .where(Incident.id == incident_id, due)
                    .values(
                        status=FAILED,
                        lease_owner=None,
                        lease_expires_at=None,
                        last_error=last_error or "the analysis never finished (its worker was lost)",
                    )
                )
                s.commit()
                log.warning("incident failed: worker lost", extra={"incident_id": incident_id})
                if self.metrics is not None:
                    self.metrics.analysis_failures.labels("true").inc()
                return None
            token = f"{self.name}:{secrets.token_hex(6)}"
            result = s.execute(
                update(Incident)
                .where(Incident.id == incident_id, due)
                .values(
                    status=RUNNING,
                    attempts=Incident.attempts + 1,
                    lease_owner=token,
                    lease_expires_at=now + timedelta(seconds=self.settings.lease_seconds),
                )
                .returning(Incident.attempts, Incident.blob_path, Incident.blob_encoding, Incident.blob_bytes)
            ).first()
            s.commit()
        if result is None:  # another worker won the race (SQLite: impossible under BEGIN IMMEDIATE)
            return None
        attempt, blob_path, encoding, size = result
        return Claim(incident_id, token, int(attempt), blob_path, str(encoding), int(size))

    def run_once(self) -> bool:
        """Claim and analyse one incident; False when the queue had nothing due."""
        claim = self.claim()
        if claim is None:
            return False
        self.process(claim)
        return True

    def process(self, claim: Claim) -> None:
        """Analyse a claimed incident and record the outcome."""
        log.info("analysis started", extra={"incident_id": claim.incident_id, "attempt": claim.attempt})
        started = time.perf_counter()
        try:
            if claim.blob_path is None:
                raise AnalysisError("the bundle is no longer stored (retention)")
            diagnosis = self.analyse(claim)
        except Exception as exc:
            if self._stopping:
                self.release(claim)
            else:
                self.fail(claim, exc)
            return
        elapsed = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.analysis_seconds.observe(elapsed)
        self.finish(claim, diagnosis, elapsed)

    def analyse(self, claim: Claim) -> dict[str, Any]:
        """Run the engine on the stored bundle, within the time limit."""
        assert claim.blob_path is not None
        path = str(self.blobs.path(claim.blob_path))
        if self._process is not None:
            return self._process.run(
                path,
                claim.encoding,
                timeout=self.settings.analysis_timeout_seconds,
                size=claim.size,
                k8s_enrich=self.settings.k8s_enrich,
            )
        return analyse_blob(path, claim.encoding, self.settings.k8s_enrich)

    def finish(self, claim: Claim, diagnosis: dict[str, Any], elapsed: float) -> None:
        """Store the diagnosis and fold the incident into its ticket, if the claim is still ours."""
        diagnosis = clean_json(diagnosis)
        with self.db.session() as s:
            incident = s.scalars(
                select(Incident)
                .where(Incident.id == claim.incident_id)
                .with_for_update()
                .execution_options(populate_existing=True)
            ).one_or_none()
            if incident is None or incident.lease_owner != claim.token or incident.status != RUNNING:
                log.warning(
                    "analysis result dropped: the lease was lost", extra={"incident_id": claim.incident_id}
                )
                return
            verdict = str(diagnosis.get("verdict") or "inconclusive")
            conf = diagnosis.get("confidence")
            incident.diagnosis = diagnosis
            incident.verdict = verdict
            incident.owner = diagnosis.get("owner")
            incident.confidence = float(conf) if isinstance(conf, int | float) else None
            incident.analysed_at = utcnow()
            incident.status = DONE
            incident.lease_owner = None
            incident.lease_expires_at = None
            incident.last_error = None
            ticket = grouping.fold(db_session=s, incident=incident)
            s.commit()
            ticket_id = ticket.id
        if self.metrics is not None:
            self.metrics.analyses.labels(verdict).inc()
        log.info(
            "incident analysed",
            extra={
                "incident_id": claim.incident_id,
                "verdict": verdict,
                "ticket_id": ticket_id,
                "seconds": round(elapsed, 3),
            },
        )

    def fail(self, claim: Claim, exc: BaseException) -> None:
        """Record a failed attempt: back to the queue with a back-off, or `failed` when out of attempts."""
        message = str(exc) if isinstance(exc, AnalysisError) else f"{type(exc).__name__}: {exc}"
        message = message.replace("\x00", "")[:ERROR_MAX_CHARS]
        final = claim.attempt >= self.settings.max_attempts or isinstance(exc, InvalidInput)
        backoff = self.settings.retry_backoff_seconds * (2 ** (claim.attempt - 1))
        with self.db.session() as s:
            values: dict[str, Any] = {"last_error": message, "lease_owner": None, "lease_expires_at": None}
            if final:
                values["status"] = FAILED
            else:
                values["status"] = QUEUED
                values["available_at"] = utcnow() + timedelta(seconds=backoff)
            s.execute(
                update(Incident)
                .where(Incident.id == claim.incident_id, Incident.lease_owner == claim.token)
                .values(**values)
            )
            s.commit()
        if self.metrics is not None:
            self.metrics.analysis_failures.labels("true" if final else "false").inc()
        log.warning(
            "analysis failed" + ("; giving up" if final else "; will retry"),
            extra={
                "incident_id": claim.incident_id,
                "attempt": claim.attempt,
                "error": message.splitlines()[0],
            },
            exc_info=not isinstance(exc, AnalysisError),
        )

    def release(self, claim: Claim) -> None:
        """Give a claim back untouched (shutting down): the attempt does not count."""
        with self.db.session() as s:
            s.execute(
                update(Incident)
                .where(Incident.id == claim.incident_id, Incident.lease_owner == claim.token)
                .values(
                    status=QUEUED,
                    attempts=Incident.attempts - 1,
                    available_at=utcnow(),
                    lease_owner=None,
                    lease_expires_at=None,
                )
            )
            s.commit()
        log.info("claim released at shutdown", extra={"incident_id": claim.incident_id})

    def abort(self) -> None:
        """Stop now: kill a running analysis (its claim is released, not failed)."""
        self._stopping = True
        if self._process is not None:
            self._process.close()

    # -- housekeeping --------------------------------------------------------------------------------

    def deliver_sinks(self) -> int:
        """Deliver due sink updates (when the sinks' outbox module is in this build)."""
        module = _outbox()
        if module is None:
            return 0
        try:
            return int(module.deliver_due(self.db.session, self.settings) or 0)
        except Exception:
            log.exception("sink delivery failed")
            return 0

    def maintenance(self) -> None:
        """Retention: delete bundles past TRIAGE_RETENTION_DAYS; sweep upload leftovers."""
        swept = self.blobs.sweep_temp(older_than_s=TEMP_MAX_AGE_S)
        if swept:
            log.info("upload leftovers removed", extra={"files": swept})
        days = self.settings.retention_days
        if days <= 0:
            return
        cutoff = utcnow() - timedelta(days=days)
        while True:
            with self.db.session() as s:
                rows = s.execute(
                    select(Incident.id, Incident.blob_path)
                    .where(
                        Incident.received_at < cutoff,
                        Incident.blob_path.is_not(None),
                        Incident.status.in_((DONE, FAILED)),
                    )
                    .limit(RETENTION_BATCH)
                    .with_for_update(skip_locked=True)
                ).all()
                if not rows:
                    return
                for _id, rel in rows:
                    if rel is not None:
                        self.blobs.delete(rel)
                s.execute(
                    update(Incident).where(Incident.id.in_([r[0] for r in rows])).values(blob_path=None)
                )
                s.commit()
            log.info("bundles past retention deleted", extra={"count": len(rows), "retention_days": days})

    def close(self) -> None:
        if self._process is not None:
            self._process.close()

    def run_forever(self, stop: threading.Event, *, housekeeping: bool = True) -> None:
        """Work until `stop` is set: analyse, deliver sinks, and now and then do maintenance."""
        last_maintenance = last_delivery = 0.0
        try:
            while not stop.is_set():
                busy = False
                try:
                    busy = self.run_once()
                    # sinks coalesce a ticket's changes: while busy, deliver at most once a second
                    if housekeeping and (not busy or time.monotonic() - last_delivery >= SINK_EVERY_S):
                        last_delivery = time.monotonic()
                        self.deliver_sinks()
                        if time.monotonic() - last_maintenance > MAINTENANCE_EVERY_S:
                            last_maintenance = time.monotonic()
                            self.maintenance()
                except Exception:
                    log.exception("worker iteration failed")
                    stop.wait(self.settings.worker_poll_seconds)
                if not busy:
                    stop.wait(self.settings.worker_poll_seconds)
        finally:
            self.close()


class WorkerPool:
    """`worker_concurrency` workers in daemon threads; the first also does sinks and maintenance."""

    def __init__(self, settings: Settings, db: Database, *, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.db = db
        self.metrics = metrics
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.workers: list[Worker] = []

    def start(self) -> None:
        for i in range(self.settings.worker_concurrency):
            worker = Worker(self.settings, self.db, metrics=self.metrics)
            self.workers.append(worker)
            t = threading.Thread(
                target=worker.run_forever,
                args=(self.stop_event,),
                kwargs={"housekeeping": i == 0},
                name=f"triage-worker-{i}",
                daemon=True,
            )
            t.start()
            self.threads.append(t)
        log.info("workers started", extra={"count": len(self.threads)})

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        for worker in self.workers:
            worker.abort()
        for t in self.threads:
            t.join(timeout)
        self.threads.clear()
        self.workers.clear()
        module = _outbox()
        if module is not None:
            module.close_cached()  # the sinks' open connections to the ticket and alert systems


_outbox_cache: list[ModuleType | None] = []


def _outbox() -> ModuleType | None:
    if not _outbox_cache:
        try:
            _outbox_cache.append(importlib.import_module(OUTBOX_MODULE))
        except ModuleNotFoundError as exc:
            if exc.name != OUTBOX_MODULE:
                raise
            _outbox_cache.append(None)
    return _outbox_cache[0]
