"""Scale-up requests, health/readiness/metrics, the store's migrations, and the request log."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from tests.service.svckit import Service, bundle, post
from triage.store.migrate import current_revision, head_revision, upgrade
from triage.store.models import Base
from triage.store.session import Database

READ = "read-token-0123456789abcdef"
EAST = "east-token-0123456789abcdef"
GOOD_REPORT = {"gpus": 4, "mfu": 0.45, "gpu_utilization": 0.7, "step_time_s": 1.2, "requested_gpus": 64}


def test_a_scale_up_request_is_decided_by_the_contract_and_stored(service: Service) -> None:
    client = service.client
    r = client.post("/api/v1/scale-up-requests", json={**GOOD_REPORT, "namespace": "ml", "job": "llama"})
    assert r.status_code == 201, r.text
    ok = r.json()
    assert ok["approved"] is True and ok["decision"] == "approved" and ok["contract_version"]
    assert len(ok["reasons"]) == 4 and {c["status"] for c in ok["checks"]} == {"pass"}
    r = client.post("/api/v1/scale-up-requests", json={**GOOD_REPORT, "mfu": 0.2, "gpu_utilization": 0.5})
    denied = r.json()
    assert denied["approved"] is False and denied["decision"] == "denied"
    assert len(denied["reasons"]) == 2
    assert any("MFU 20%" in reason for reason in denied["reasons"])
    r = client.post("/api/v1/scale-up-requests", json={**GOOD_REPORT, "mfu": 45})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "mfu"]
    assert client.post("/api/v1/scale-up-requests", json={"gpus": 4}).status_code == 422
    page = client.get("/api/v1/scale-up-requests").json()
    assert page["total"] == 2 and [i["decision"] for i in page["items"]] == ["denied", "approved"]
    assert client.get("/api/v1/scale-up-requests", params={"approved": True}).json()["total"] == 1
    assert client.get(f"/api/v1/scale-up-requests/{ok['id']}").json() == ok
    assert client.get("/api/v1/scale-up-requests/9999").status_code == 404


def test_scale_up_requests_take_a_read_or_ingest_token(make_service: Callable[..., Service]) -> None:
    svc = make_service(read_token=READ, ingest_tokens=f"east={EAST}")
    client = svc.client
    assert client.post("/api/v1/scale-up-requests", json=GOOD_REPORT).status_code == 401
    r = client.post(
        "/api/v1/scale-up-requests", json=GOOD_REPORT, headers={"Authorization": f"Bearer {EAST}"}
    )
    assert r.status_code == 201 and r.json()["requested_by"] == "cluster:east"
    assert (
        client.get("/api/v1/scale-up-requests", headers={"Authorization": f"Bearer {EAST}"}).status_code
        == 401
    )
    assert (
        client.get("/api/v1/scale-up-requests", headers={"Authorization": f"Bearer {READ}"}).json()["total"]
        == 1
    )


def test_health_readiness_and_metrics(service: Service) -> None:
    client = service.client
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok", "checks": {}}
    post(client, bundle())
    post(client, bundle())
    service.drain()
    text = client.get("/metrics").text
    for line in (
        'triage_ingest_requests_total{result="accepted"} 1.0',
        'triage_ingest_requests_total{result="duplicate"} 1.0',
        "triage_ingest_seconds_count 1.0",
        'triage_analyses_total{verdict="shm_exhausted"} 1.0',
        'triage_queue_depth{status="queued"} 0.0',
        'triage_incidents{verdict="shm_exhausted"} 1.0',
        'triage_tickets{status="open"} 1.0',
    ):
        assert line in text, line
    assert "# TYPE triage_sink_failures gauge" in text


def test_readiness_fails_when_the_blob_dir_is_not_writable(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service.app.state.blobs, "writable", lambda: False)
    r = service.client.get("/readyz")
    assert r.status_code == 503 and "blobs" in r.json()["checks"]
    assert service.client.get("/healthz").status_code == 200


def test_migrations_match_the_models_and_rerun_safely(database_url: str) -> None:
    db = Database(database_url)
    try:
        threads = [
            threading.Thread(target=upgrade, args=(db,)) for _ in range(3)
        ]  # replicas starting together
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with db.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
        assert diff == []
    finally:
        db.dispose()


def test_each_request_is_logged_with_its_status(service: Service, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="triage.service"):
        r = service.client.get("/api/v1/tickets", headers={"X-Request-ID": "abc123"})
    assert r.headers["x-request-id"] == "abc123"
    rec = next(r for r in caplog.records if r.getMessage() == "request")
    assert (rec.method, rec.path, rec.status, rec.request_id) == ("GET", "/api/v1/tickets", 200, "abc123")  # type: ignore[attr-defined]


def test_json_log_lines_carry_the_extra_fields() -> None:
    import json

    from triage.service.logging import JsonFormatter

    record = logging.LogRecord("triage.x", logging.INFO, __file__, 1, "incident stored", (), None)
    record.incident_id = "abc"
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["logger"], line["msg"], line["incident_id"]) == (
        "info",
        "triage.x",
        "incident stored",
        "abc",
    )
