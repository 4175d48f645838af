"""Acceptance: crashed pods seen by the watcher become tickets in the real service (SQLite store, the real
ingest endpoint, the real worker and grouping), one ticket per crash, with the pod's limits and /dev/shm
facts as evidence — and a watcher that sees the same crashes again adds nothing."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.fakekube import FakeKubeAPI
from tests.k8s.k8sobjects import (
    CUDA_OOM_LOG,
    NS,
    container,
    container_status,
    node,
    pod,
    shm_volume,
    terminated,
)
from triage.k8s.client import KubeClient
from triage.k8s.watcher import IngestClient, WatchConfig, Watcher

with warnings.catch_warnings():  # starlette asks for httpx2 at import; the TestClient works with httpx
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
    from fastapi.testclient import TestClient

TOKEN = "k8s-watcher-token-7f3a9c2e41"
GiB = 1024**3


class Service:
    def __init__(self, tmp: Path) -> None:
        from triage.service import Settings, create_app

        self.settings = Settings(
            data_dir=tmp / "data",
            database_url=f"sqlite:///{tmp / 'triage.db'}",
            analysis_isolation="thread",
            worker=False,
            retry_backoff_seconds=0,
            public_url="http://triage.test",
            ingest_tokens=f"gpu-east={TOKEN}",
        )
        self.app = create_app(self.settings)
        self.client = TestClient(self.app)

    def transport(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
        """The watcher's POST, sent through the app (same path, headers and gzip body)."""
        assert url == "http://triage.test/api/v1/incidents"
        resp = self.client.post("/api/v1/incidents", content=body, headers=headers)
        return resp.status_code, resp.content

    def drain(self) -> int:
        from triage.worker import Worker

        worker = Worker(self.settings, self.app.state.db)
        n = 0
        try:
            while worker.run_once():
                n += 1
        finally:
            worker.close()
        return n

    def get(self, path: str, **params: Any) -> Any:
        resp = self.client.get(path, params=params)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def close(self) -> None:
        self.client.close()
        self.app.state.db.dispose()


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    for key in [k for k in __import__("os").environ if k.startswith("TRIAGE_")]:
        monkeypatch.delenv(key)
    svc = Service(tmp_path)
    try:
        yield svc
    finally:
        svc.close()


def _crashed_pods(api: FakeKubeAPI) -> None:
    api.add_node(node())
    # a data-loading job killed by the kernel at its 64 GiB limit; /dev/shm a 16 GiB Memory emptyDir
    api.add_pod(
        pod(
            "etl-train-0",
            containers=[container(memory="64Gi", cpu="32")],
            volumes=[shm_volume(size_limit="16Gi")],
            owner=("batch/v1", "Job", "etl-train"),
            phase="Failed",
            statuses=[container_status(state=terminated("OOMKilled", 137))],
        )
    )
    api.set_log(NS, "etl-train-0", "trainer", "epoch 0 step 120\nloading shard 17 of 40\n")
    # a fine-tune that hit a CUDA OOM, without the collector; nothing mounted at /dev/shm
    api.add_pod(
        pod(
            "vit-finetune-0",
            containers=[container(shm_volume=None)],
            volumes=[],
            owner=("batch/v1", "Job", "vit-finetune"),
            phase="Failed",
            statuses=[container_status(state=terminated("Error", 1))],
        )
    )
    api.set_log(NS, "vit-finetune-0", "trainer", CUDA_OOM_LOG)


def _facts(diagnosis: dict[str, Any]) -> str:
    """What a ticket shows as evidence: the rules' facts and the pod's contract violations."""
    facts = [str(e.get("fact")) for e in diagnosis["evidence"]]
    facts += [str(v.get("sentence")) for v in diagnosis["details"].get("contract_violations") or []]
    return "\n".join(facts)


def _watcher(kube: KubeClient, service: Service) -> Watcher:
    ingest = IngestClient("http://triage.test", TOKEN, transport=service.transport, sleep=lambda s: None)
    return Watcher(kube, ingest, WatchConfig())


def test_each_crashed_pod_makes_exactly_one_ticket(
    fake_api: FakeKubeAPI, kube: KubeClient, service: Service
) -> None:
    _crashed_pods(fake_api)
    w = _watcher(kube, service)
    w.run_once()
    assert w.stats.posted == 2 and w.state.pending == {}
    assert service.drain() == 2

    incidents = service.get("/api/v1/incidents", namespace=NS)["items"]
    assert len(incidents) == 2
    by_pod = {i["pod"]: i for i in incidents}
    assert {i["cluster"] for i in incidents} == {"gpu-east"}

    oom = service.get(f"/api/v1/incidents/{by_pod['etl-train-0']['id']}")
    assert oom["status"] == "done" and oom["verdict"] == "host_memory_limit"
    assert oom["diagnosis"]["evidence"][0]["value"]["memory_limit_bytes"] == 64 * GiB
    facts = _facts(oom["diagnosis"])
    assert re.search(r"memory limit is 64(\.0)? GiB", facts)  # the container's limit, from the pod spec
    assert "oom_kill counter is 1" in facts  # the kill itself
    # the /dev/shm mount (a 16 GiB Memory emptyDir: below the 64 GiB SLA) as a contract violation
    assert "/dev/shm is 16 GiB" in facts

    cuda = service.get(f"/api/v1/incidents/{by_pod['vit-finetune-0']['id']}")
    assert cuda["status"] == "done" and cuda["kind"] == "cuda_oom"
    assert cuda["diagnosis"]["verdict"] != "host_memory_limit"
    facts = _facts(cuda["diagnosis"])
    assert "Tried to allocate 2.00 GiB" in json.dumps(cuda["diagnosis"]) or "2 GiB" in facts
    assert "nothing is mounted at /dev/shm" in facts  # the pod's shm fact, as contract evidence

    tickets = service.get("/api/v1/tickets", namespace=NS)["items"]
    assert len(tickets) == 2
    assert {t["job"] for t in tickets} == {"etl-train", "vit-finetune"}
    assert all(t["incident_count"] == 1 for t in tickets)
    assert {t["team"] for t in tickets} == {"nlp-research"}

    # the same crashes seen again: a relist, a restarted watcher without state — nothing new anywhere
    w.run_once()
    again = _watcher(kube, service)
    again.run_once()
    assert again.stats.duplicates == 2 and again.stats.posted == 0
    assert service.drain() == 0
    assert len(service.get("/api/v1/incidents", namespace=NS)["items"]) == 2
    tickets = service.get("/api/v1/tickets", namespace=NS)["items"]
    assert len(tickets) == 2 and all(t["incident_count"] == 1 for t in tickets)


def test_a_bad_token_is_refused_and_not_retried(
    fake_api: FakeKubeAPI, kube: KubeClient, service: Service
) -> None:
    _crashed_pods(fake_api)
    ingest = IngestClient("http://triage.test", "wrong-token-000000000000", transport=service.transport)
    w = Watcher(kube, ingest, WatchConfig())
    w.run_once()
    assert w.stats.rejected == 2 and w.state.pending == {}
    assert service.get("/api/v1/incidents")["items"] == []
