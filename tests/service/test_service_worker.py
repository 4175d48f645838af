"""The analysis worker: a database-backed queue that retries, survives restarts and never analyses one
incident twice at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from tests.service.svckit import Service, bundle, post
from triage.service.settings import Settings
from triage.store.models import Incident, Ticket, utcnow
from triage.worker import Worker


def incident(svc: Service, incident_id: str) -> Incident:
    with svc.db.read_session() as s:
        row = s.get(Incident, incident_id)
        assert row is not None
        return row


def test_an_incident_is_analysed_and_grouped(service: Service) -> None:
    b = bundle()
    post(service.client, b)
    assert service.drain() == 1
    got = service.client.get(f"/api/v1/incidents/{b['incident_id']}").json()
    assert got["status"] == "done" and got["attempts"] == 1 and got["error"] is None
    assert got["verdict"] == "shm_exhausted" and got["owner"] == "platform"
    assert got["diagnosis"]["verdict"] == "shm_exhausted" and got["diagnosis"]["evidence"]
    assert got["ticket_url"] == f"http://triage.test/tickets/{got['ticket_id']}"
    again = post(service.client, b)
    assert again.status_code == 200
    assert again.json()["verdict"] == "shm_exhausted" and again.json()["ticket_id"] == got["ticket_id"]


def test_a_crashing_analysis_is_retried_then_failed_while_others_proceed(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    import triage.worker

    bad = bundle(rank=1)
    real = triage.worker.analyse_blob
    calls: list[str] = []

    def flaky(path: str, encoding: str, k8s_enrich: str = "off") -> dict[str, Any]:
        calls.append(path)
        if bad["incident_id"] in path:
            raise RuntimeError("engine exploded on this bundle")
        return real(path, encoding, k8s_enrich)

    monkeypatch.setattr(triage.worker, "analyse_blob", flaky)
    for rank in range(3):
        post(service.client, bundle(rank=rank))
    assert service.drain() == 5  # two good ones, three attempts of the bad one
    got = service.client.get(f"/api/v1/incidents/{bad['incident_id']}").json()
    assert got["status"] == "failed" and got["attempts"] == 3
    assert "RuntimeError: engine exploded on this bundle" in got["error"]
    assert got["ticket_id"] is None
    assert service.client.get("/api/v1/incidents", params={"status": "done"}).json()["total"] == 2
    metrics = service.client.get("/metrics").text
    assert 'triage_analysis_failures_total{final="false"} 2.0' in metrics
    assert 'triage_analysis_failures_total{final="true"} 1.0' in metrics
    assert 'triage_queue_depth{status="failed"} 1.0' in metrics


def test_a_failed_attempt_waits_for_its_backoff(
    make_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    import triage.worker

    svc = make_service(retry_backoff_seconds=3600)

    def boom(path: str, encoding: str, k8s_enrich: str = "off") -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(triage.worker, "analyse_blob", boom)
    b = bundle()
    post(svc.client, b)
    assert svc.drain() == 1  # the retry is not due for an hour
    row = incident(svc, b["incident_id"])
    assert row.status == "queued" and row.attempts == 1 and row.last_error == "RuntimeError: boom"
    assert row.available_at > utcnow() + timedelta(minutes=59)


def test_a_dead_workers_claim_returns_to_the_queue_and_its_late_result_is_dropped(service: Service) -> None:
    b = bundle()
    post(service.client, b)
    dead = Worker(service.settings, service.db, name="dead")
    claim = dead.claim()
    assert claim is not None and claim.attempt == 1
    assert Worker(service.settings, service.db).claim() is None  # leased: nobody else takes it
    with service.db.session() as s:  # the lease runs out
        s.execute(update(Incident).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        s.commit()
    assert service.drain() == 1
    row = incident(service, b["incident_id"])
    assert row.status == "done" and row.attempts == 2
    dead.finish(claim, {"verdict": "tensor_leak", "owner": "algorithm"}, 0.1)  # too late: fenced
    row = incident(service, b["incident_id"])
    assert row.verdict == "shm_exhausted"
    with service.db.read_session() as s:
        assert [t.incident_count for t in s.scalars(select(Ticket))] == [1]


def test_an_incident_whose_worker_dies_every_time_is_failed(service: Service) -> None:
    b = bundle()
    post(service.client, b)
    for _ in range(3):
        assert Worker(service.settings, service.db).claim() is not None
        with service.db.session() as s:
            s.execute(update(Incident).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
            s.commit()
    assert Worker(service.settings, service.db).claim() is None
    row = incident(service, b["incident_id"])
    assert row.status == "failed" and row.attempts == 3
    assert "worker was lost" in (row.last_error or "")


def test_a_claim_released_at_shutdown_does_not_count_as_an_attempt(service: Service) -> None:
    b = bundle()
    post(service.client, b)
    worker = Worker(service.settings, service.db)
    claim = worker.claim()
    assert claim is not None
    worker.release(claim)
    row = incident(service, b["incident_id"])
    assert (row.status, row.attempts, row.lease_owner) == ("queued", 0, None)


def test_concurrent_workers_claim_each_incident_once(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    import triage.worker

    real = triage.worker.analyse_blob
    seen: list[str] = []
    lock = threading.Lock()

    def counting(path: str, encoding: str, k8s_enrich: str = "off") -> dict[str, Any]:
        with lock:
            seen.append(Path(path).name.rsplit("-", 1)[0])
        time.sleep(0.005)
        return real(path, encoding, k8s_enrich)

    monkeypatch.setattr(triage.worker, "analyse_blob", counting)
    ids = [post(service.client, bundle(rank=r)).json()["incident_id"] for r in range(24)]

    def work() -> None:
        w = Worker(service.settings, service.db)
        while w.run_once():
            pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == sorted(ids)  # each analysed exactly once
    tickets = service.client.get("/api/v1/tickets").json()["items"]
    assert [(t["incident_count"], t["rank_count"]) for t in tickets] == [(24, 24)]


def test_the_background_worker_runs_in_the_app(make_service: Callable[..., Service]) -> None:
    from tests.service.svckit import TestClient

    svc = make_service(worker=True, worker_poll_seconds=0.05)
    b = bundle()
    with TestClient(svc.app) as client:
        assert post(client, b).status_code == 202
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if client.get(f"/api/v1/incidents/{b['incident_id']}").json()["status"] == "done":
                break
            time.sleep(0.05)
        assert client.get(f"/api/v1/incidents/{b['incident_id']}").json()["verdict"] == "shm_exhausted"
    assert svc.app.state.workers.threads == []  # stopped with the app


def test_retention_deletes_old_bundles_but_keeps_the_records(make_service: Callable[..., Service]) -> None:
    svc = make_service(retention_days=7)
    old, new = bundle(rank=1), bundle(rank=2)
    post(svc.client, old)
    post(svc.client, new)
    svc.drain()
    path = svc.settings.blobs / (incident(svc, old["incident_id"]).blob_path or "")
    assert path.is_file()
    with svc.db.session() as s:
        s.execute(
            update(Incident)
            .where(Incident.id == old["incident_id"])
            .values(received_at=utcnow() - timedelta(days=8))
        )
        s.commit()
    Worker(svc.settings, svc.db).maintenance()
    assert not path.exists()
    got = svc.client.get(f"/api/v1/incidents/{old['incident_id']}").json()
    assert got["blob_available"] is False and got["verdict"] == "shm_exhausted"
    assert svc.client.get(f"/api/v1/incidents/{new['incident_id']}").json()["blob_available"] is True


def test_analysis_runs_in_a_child_process_with_a_time_limit(tmp_path: Path) -> None:
    from tests.service.svckit import TestClient
    from triage.service import create_app

    def settings(**kw: Any) -> Settings:
        return Settings(
            data_dir=tmp_path, worker=False, retry_backoff_seconds=0, analysis_isolation="process", **kw
        )

    app = create_app(settings())
    client = TestClient(app)
    try:
        ok, slow = bundle(rank=1), bundle(rank=2)
        post(client, ok)
        worker = Worker(settings(), app.state.db)
        try:
            assert worker.run_once()
        finally:
            worker.close()
        assert client.get(f"/api/v1/incidents/{ok['incident_id']}").json()["verdict"] == "shm_exhausted"
        post(client, slow)
        strict = Worker(settings(analysis_timeout_seconds=0.001), app.state.db)
        try:
            while strict.run_once():
                pass
        finally:
            strict.close()
        got = client.get(f"/api/v1/incidents/{slow['incident_id']}").json()
        assert got["status"] == "failed" and got["attempts"] == 3
        assert "did not finish within 0.001 s" in got["error"]
    finally:
        client.close()
        app.state.db.dispose()


def test_a_worker_only_replica_analyses_what_the_api_stored(make_service: Callable[..., Service]) -> None:
    from tests.service.svckit import TestClient
    from triage.service import create_app

    api = make_service()
    b = bundle()
    post(api.client, b)
    settings = api.settings.model_copy(update={"worker_poll_seconds": 0.05})
    replica = create_app(settings, role="worker")
    try:
        with TestClient(replica) as client:
            assert client.get("/readyz").status_code == 200
            assert client.get("/api/v1/tickets").status_code == 404  # no API on a worker replica
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and incident(api, b["incident_id"]).status != "done":
                time.sleep(0.05)
    finally:
        replica.state.db.dispose()
    assert incident(api, b["incident_id"]).verdict == "shm_exhausted"


def test_two_replicas_share_one_store(
    make_service: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    import triage.worker
    from tests.service.svckit import TestClient

    real = triage.worker.analyse_blob
    seen: list[str] = []
    lock = threading.Lock()

    def counting(path: str, encoding: str, k8s_enrich: str = "off") -> dict[str, Any]:
        with lock:
            seen.append(Path(path).name)
        return real(path, encoding, k8s_enrich)

    monkeypatch.setattr(triage.worker, "analyse_blob", counting)
    a = make_service(worker=True, worker_concurrency=2, worker_poll_seconds=0.02)
    b = make_service(worker=True, worker_concurrency=2, worker_poll_seconds=0.02)
    with TestClient(a.app) as ca, TestClient(b.app) as cb:
        for rank in range(30):
            assert post(ca if rank % 2 else cb, bundle(rank=rank)).status_code == 202
        assert post(ca, bundle(rank=3)).status_code == 200  # the other replica stored it: a repeat
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            page = ca.get("/api/v1/incidents", params={"status": "done"}).json()
            if page["total"] == 30:
                break
            time.sleep(0.05)
        tickets = cb.get("/api/v1/tickets").json()["items"]
    assert len(seen) == 30 and len(set(seen)) == 30
    assert [(t["incident_count"], t["rank_count"]) for t in tickets] == [(30, 30)]
