"""Bundles for the service tests: small, deterministic, built on the simulator's scenarios."""

from __future__ import annotations

import functools
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from triage.service import Settings, create_app
from triage.simulate.scenarios import run_scenario

with warnings.catch_warnings():  # starlette asks for httpx2 at import; the TestClient works with httpx
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
    from fastapi.testclient import TestClient

NS = uuid.UUID("a3c1e7a4-55f1-4f0e-8f55-0d0f6a4f2c10")
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@functools.cache
def _base(name: str, seed: int) -> dict[str, Any]:
    return run_scenario(name, seed).bundle


def bundle(
    family: str = "shm_exhausted",
    *,
    seed: int = 1,
    rank: int = 0,
    restart: int = 0,
    job: str = "llama-sft",
    namespace: str = "ml-training",
    team: str | None = "nlp-research",
    at: datetime | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """A scenario's bundle as posted by `rank` (restart `restart`) of job `job`."""
    out = dict(_base(family, seed))
    workload = dict(out.get("workload") or {})
    workload.update(
        job=job,
        owner_name=job,
        namespace=namespace,
        team=team,
        rank=rank,
        local_rank=rank % 8,
        pod=f"{job}-worker-{rank // 8}",
        restart_count=restart,
        labels={"team": team} if team else {},
    )
    out["workload"] = workload
    ident = key or f"{family}:{seed}:{job}:{namespace}:{rank}:{restart}:{at}"
    out["incident_id"] = str(uuid.uuid5(NS, ident))
    out["occurred_at"] = (at or T0 + timedelta(minutes=restart)).isoformat()
    return out


def gz(data: dict[str, Any] | bytes) -> bytes:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return gzip.compress(raw, compresslevel=1)


GZIP = {"Content-Encoding": "gzip", "Content-Type": "application/json"}


def post(client: Any, data: dict[str, Any] | bytes, *, token: str | None = None, gzipped: bool = True) -> Any:
    headers = dict(GZIP) if gzipped else {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = gz(data) if gzipped else (data if isinstance(data, bytes) else json.dumps(data).encode())
    return client.post("/api/v1/incidents", content=body, headers=headers)


class Service:
    """An app, its TestClient and its settings (no lifespan: tests drive the worker themselves)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self.client = TestClient(self.app)
        self.db = self.app.state.db

    def drain(self, limit: int = 10_000) -> int:
        """Run the worker until the queue has nothing due; the number of analyses."""
        from triage.worker import Worker

        worker = Worker(self.settings, self.db, metrics=self.app.state.metrics)
        n = 0
        try:
            while n < limit and worker.run_once():
                n += 1
        finally:
            worker.close()
        return n

    def close(self) -> None:
        self.client.close()
        self.db.dispose()


REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`triage serve` in a real process on a free loopback port (stopped by the PID it started)."""

    def __init__(self, env: dict[str, str], *args: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {k: v for k, v in os.environ.items() if not k.startswith("TRIAGE_")}
        full.update(env)
        full["PYTHONPATH"] = str(REPO) + os.pathsep + full.get("PYTHONPATH", "")
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "triage.cli", "serve", "--port", str(self.port), *args],
            env=full,
            cwd=REPO,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(
            f"triage serve did not become ready:\n{self.log.read_text(errors='replace')[-4000:]}"
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers run (a crash, an OOM kill, a node loss)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._log_file.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        if not self._log_file.closed:
            self._log_file.close()
