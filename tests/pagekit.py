"""The service for the page and end-to-end tests: bundles from the simulator, the app with its worker,
and a real uvicorn server on a free loopback port."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn

from tests.realparts import free_port
from triage.service import Settings, create_app
from triage.simulate.scenarios import run_scenario

with warnings.catch_warnings():  # starlette asks for httpx2 at import; the TestClient works with httpx
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
    from fastapi.testclient import TestClient

HOSTILE = "<script>alert(1)</script>"
NS = uuid.UUID("0b3f0a52-8d5e-4b51-9d1c-3f8f3e1c7a10")
T0 = datetime(2026, 4, 1, 9, 0, tzinfo=UTC)
LEAK = ("leak_like_big_batch", 0)
SCREENSHOTS: list[
    Path
] = []  # saved by the browser tests; listed at the end of the run  # a tensor leak with stacks and a trace; about 1 MB of JSON


@functools.cache
def _scenario(name: str, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    r = run_scenario(name, seed)
    return r.bundle, r.truth


def bundle(
    name: str = LEAK[0],
    seed: int = LEAK[1],
    *,
    rank: int = 0,
    world_size: int = 1,
    restart: int = 0,
    job: str = "llama-sft",
    namespace: str = "ml",
    team: str | None = "ml-research",
    minutes: float = 0,
) -> dict[str, Any]:
    """One rank's bundle of a job: the scenario's bundle with its identity, rank and time replaced."""
    base, _truth = _scenario(name, seed)
    out = dict(base)
    workload = dict(out.get("workload") or {})
    workload.update(
        job=job,
        owner_kind="PyTorchJob",
        owner_name=job,
        namespace=namespace,
        team=team,
        rank=rank,
        local_rank=rank % 8,
        world_size=world_size,
        pod=f"{job}-worker-{rank // 8}",
        node=f"gpu-node-{rank // 8}",
        restart_count=restart,
        labels={"team": team} if team else {},
    )
    out["workload"] = workload
    out["incident_id"] = str(uuid.uuid5(NS, f"{name}:{seed}:{namespace}:{job}:{rank}:{restart}:{minutes}"))
    out["occurred_at"] = (T0 + timedelta(minutes=minutes + restart)).isoformat()
    return out


def hostile_bundle(**kw: Any) -> dict[str, Any]:
    """A leak whose source file and function are named ``<script>alert(1)</script>``."""
    _base, truth = _scenario(*LEAK)
    leak = truth.get("leak_site") or {}
    filename, line = leak["filename"], leak["line"]
    evil_file = f"/workspace/src/{HOSTILE}.py"
    out = bundle(**kw)
    snapshot = copy.deepcopy(out["snapshot"])

    def fix(frames: Any) -> None:
        for f in frames or []:
            if isinstance(f, dict) and f.get("filename") == filename:
                if f.get("line") == line:
                    f["name"] = HOSTILE
                f["filename"] = evil_file

    for seg in snapshot.get("segments") or []:
        fix(seg.get("frames"))
        for b in seg.get("blocks") or []:
            fix(b.get("frames"))
    for trace in snapshot.get("device_traces") or []:
        for entry in trace:
            fix(entry.get("frames"))
    out["snapshot"] = snapshot
    error = dict(out.get("error") or {})
    error["traceback"] = str(error.get("traceback") or "").replace(filename, evil_file)
    error["message"] = f"{error.get('message') or ''} {HOSTILE}"
    out["error"] = error
    return out


def gz(doc: dict[str, Any]) -> bytes:
    return gzip.compress(json.dumps(doc).encode(), compresslevel=1)


@dataclass
class Seeded:
    """A service seeded with tickets for the page tests."""

    app: App
    leak: dict[str, Any]  # the hostile tensor-leak ticket (API JSON)
    other: dict[str, Any]  # an other_process ticket in another namespace and team
    shm: dict[str, Any]  # a /dev/shm ticket (no snapshot)
    bundles: dict[str, dict[str, Any]]  # incident id → the bundle posted


class App:
    """The service on a SQLite file, analysis in-thread, no background worker: tests drive the worker."""

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        values: dict[str, Any] = {
            "data_dir": data_dir,
            "analysis_isolation": "thread",
            "worker": False,
            "retry_backoff_seconds": 0,
            "public_url": "http://triage.test",
        } | settings
        self.settings = Settings(**values)
        self.app = create_app(self.settings)
        self.db = self.app.state.db
        self.client = TestClient(self.app)

    def post(self, doc: dict[str, Any], *, token: str | None = None) -> Any:
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        r = self.client.post("/api/v1/incidents", content=gz(doc), headers=headers)
        assert r.status_code in (200, 202), r.text
        return r.json()

    def drain(self) -> int:
        """Analyse everything queued (folding into tickets); the number of analyses."""
        from triage.worker import Worker

        worker = Worker(self.settings, self.db)
        n = 0
        try:
            while worker.run_once():
                n += 1
        finally:
            worker.close()
        return n

    def deliver(self) -> int:
        """One pass of the worker's sink delivery (the outbox)."""
        from triage.worker import Worker

        worker = Worker(self.settings, self.db)
        try:
            return worker.deliver_sinks()
        finally:
            worker.close()

    def close(self) -> None:
        from triage.tickets.sinks.registry import close_cached

        self.client.close()
        self.db.dispose()
        close_cached()  # as the service's shutdown does: the sinks' connections to Redmine, Alertmanager, …


class UvicornThread:
    """A real uvicorn server for ``app`` on a free loopback port, in a thread of this process."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
