"""POST /api/v1/incidents: streamed, capped, validated, stored durably before any analysis, idempotent on
incident_id; ingest tokens hashed and separate from read access."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import func, select

from tests.service.svckit import GZIP, Service, bundle, gz, post
from triage.store.models import Incident, IngestToken

EAST = "east-token-0123456789abcdef"
WEST = "west-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"


def count(svc: Service) -> int:
    with svc.db.read_session() as s:
        return int(s.scalar(select(func.count()).select_from(Incident)) or 0)


def test_a_bundle_is_stored_queued_and_answered_202(service: Service) -> None:
    b = bundle()
    r = post(service.client, b)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body == {
        "incident_id": b["incident_id"],
        "status": "queued",
        "verdict": None,
        "ticket_id": None,
        "ticket_url": f"http://triage.test/incidents/{b['incident_id']}",
    }
    with service.db.read_session() as s:
        inc = s.get(Incident, b["incident_id"])
        assert inc is not None
        assert (inc.cluster, inc.status, inc.attempts) == ("local", "queued", 0)
        assert (inc.namespace, inc.job, inc.rank, inc.team) == ("ml-training", "llama-sft", 0, "nlp-research")
        raw = json.dumps(b).encode()
        assert inc.blob_bytes == len(raw)
        assert inc.blob_path is not None and inc.blob_path.endswith(".json.gz")
        blob = service.settings.blobs / inc.blob_path
    assert json.loads(gzip.decompress(blob.read_bytes())) == b
    assert list((service.settings.blobs / "tmp").iterdir()) == []


def test_a_repeat_of_the_same_incident_answers_200_and_stores_nothing(service: Service) -> None:
    b = bundle()
    assert post(service.client, b).status_code == 202
    files = sorted(p for p in service.settings.blobs.rglob("*") if p.is_file())
    again = post(service.client, b, gzipped=False)
    assert again.status_code == 200
    assert again.json()["incident_id"] == b["incident_id"]
    assert count(service) == 1
    assert sorted(p for p in service.settings.blobs.rglob("*") if p.is_file()) == files


def test_concurrent_posts_of_one_incident_store_it_once(service: Service) -> None:
    b = bundle(rank=5)
    body = gz(b)
    codes: list[int] = []

    def send() -> None:
        r = service.client.post("/api/v1/incidents", content=body, headers=GZIP)
        codes.append(r.status_code)

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes).count(202) == 1 and sorted(codes).count(200) == 5, codes
    assert count(service) == 1
    stored = [p for p in service.settings.blobs.rglob("*.json.gz")]
    assert len(stored) == 1


def test_plain_json_is_accepted_too(service: Service) -> None:
    r = post(service.client, bundle(), gzipped=False)
    assert r.status_code == 202


def test_invalid_bodies_are_refused_and_leave_nothing(service: Service) -> None:
    client = service.client
    assert post(client, b"{not json").status_code == 400
    assert client.post("/api/v1/incidents", content=b"not gzip", headers=GZIP).status_code == 400
    r = post(client, {"schema": "oom-triage/incident@1", "incident_id": "nope", "kind": "cuda_oom"})
    assert r.status_code == 422
    assert {tuple(e["loc"]) for e in r.json()["detail"]} == {("incident_id",), ("occurred_at",)}
    snap = dict(bundle(), snapshot=[1, 2])
    assert post(client, snap).status_code == 422
    r = client.post("/api/v1/incidents", content=b"{}", headers={"Content-Encoding": "br"})
    assert r.status_code == 415
    assert count(service) == 0
    assert [p for p in service.settings.blobs.rglob("*") if p.is_file()] == []


def test_size_caps_answer_413(make_service: Callable[..., Service]) -> None:
    svc = make_service(max_upload_bytes=20_000, max_bundle_bytes=50_000)
    client = svc.client
    big = dict(bundle(), pad="x" * 60_000)
    r = post(client, big)  # compresses to well under 20 kB, but 60 kB decompressed
    assert r.status_code == 413 and "decompressed" in r.json()["detail"]
    r = post(client, big, gzipped=False)  # 60 kB on the wire
    assert r.status_code == 413

    def chunks() -> object:  # no Content-Length: the cap applies while streaming
        for _ in range(30):
            yield b" " * 1000

    r = client.post("/api/v1/incidents", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert count(svc) == 0
    assert list((svc.settings.blobs / "tmp").iterdir()) == []


def test_ingest_tokens_are_per_cluster_hashed_and_separate_from_reads(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service(ingest_tokens=f"east={EAST},west={WEST}", read_token=READ)
    client = svc.client
    assert post(client, bundle(rank=1)).status_code == 401
    assert post(client, bundle(rank=1), token="wrong").status_code == 403
    assert post(client, bundle(rank=1), token=READ).status_code == 403  # the read token cannot ingest
    assert post(client, bundle(rank=1), token=WEST).status_code == 202
    assert post(client, bundle(rank=2), token=EAST).status_code == 202
    with svc.db.read_session() as s:
        clusters = dict(s.execute(select(Incident.rank, Incident.cluster)).all())
        stored = {row.cluster: row.token_sha256 for row in s.scalars(select(IngestToken))}
    assert clusters == {1: "west", 2: "east"}
    assert set(stored) == {"east", "west"} and EAST not in stored.values()
    # an ingest token cannot read
    assert client.get("/api/v1/incidents", headers={"Authorization": f"Bearer {EAST}"}).status_code == 401
    assert client.get("/api/v1/incidents", headers={"Authorization": f"Bearer {READ}"}).status_code == 200


def test_a_token_removed_from_the_settings_is_revoked_at_start(make_service: Callable[..., Service]) -> None:
    first = make_service(ingest_tokens=f"east={EAST},west={WEST}")
    first.close()
    svc = make_service(ingest_tokens=f"east={WEST}")  # west dropped, east's token rotated
    client = svc.client
    assert post(client, bundle(rank=1), token=EAST).status_code == 403
    r = post(client, bundle(rank=1), token=WEST)
    assert r.status_code == 202
    with svc.db.read_session() as s:
        assert s.get(Incident, r.json()["incident_id"]).cluster == "east"


def test_reads_need_the_read_token_or_the_trusted_user_header(make_service: Callable[..., Service]) -> None:
    svc = make_service(read_token=READ, trusted_user_header="X-Forwarded-User", ingest_tokens=f"east={EAST}")
    client = svc.client
    assert client.get("/api/v1/tickets").status_code == 401
    assert client.get("/api/v1/tickets", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/api/v1/tickets", headers={"Authorization": f"Bearer {READ}"}).status_code == 200
    assert client.get("/api/v1/tickets", headers={"X-Forwarded-User": "alice"}).status_code == 200
    assert client.get("/healthz").status_code == 200  # probes stay open


def test_the_incident_api_shows_state_and_filters(service: Service) -> None:
    client = service.client
    for rank in range(3):
        assert post(client, bundle(rank=rank, namespace="a" if rank else "b")).status_code == 202
    page = client.get("/api/v1/incidents", params={"namespace": "a", "limit": 1}).json()
    assert (page["total"], len(page["items"]), page["limit"]) == (2, 1, 1)
    assert client.get("/api/v1/incidents", params={"status": "done"}).json()["total"] == 0
    one = page["items"][0]["id"]
    detail = client.get(f"/api/v1/incidents/{one}").json()
    assert detail["status"] == "queued" and detail["diagnosis"] is None and detail["blob_available"]
    assert client.get("/api/v1/incidents/00000000-0000-0000-0000-000000000000").status_code == 404


def test_stale_upload_leftovers_are_swept(service: Service, tmp_path: Path) -> None:
    from triage.worker import Worker

    tmp = service.settings.blobs / "tmp"
    (tmp / "dead.part").write_bytes(b"half a body")
    worker = Worker(service.settings, service.db)
    worker.blobs.sweep_temp(older_than_s=0)
    assert not (tmp / "dead.part").exists()
