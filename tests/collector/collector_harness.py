"""Helpers for the collector's tests: a real loopback triage endpoint and real training subprocesses.

The training scripts run torch's CPU build with the CUDA stand-in (fake_cuda.py: the observer, the
history, the snapshot and mem_get_info are absent on CPU builds; its snapshots come from the project's
simulator). The collector is activated the way a pod activates it: the package's ``.pth`` file processed
at interpreter start-up with TRIAGE_URL set (see site/sitecustomize.py for the order of the two).
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
TRAIN = SCRIPTS / "train.py"
PTH = ROOT / "collector" / "_boot" / "oom_triage_collector.pth"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def bundle(self) -> dict[str, Any]:
        return json.loads(gzip.decompress(self.body))


@dataclass
class TriageServer:
    """``POST /api/v1/incidents`` as the service answers it: 202 for a new incident, 200 for a known one."""

    mode: str = "ok"  # ok | slow | reject | error
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    known: set[str] = field(default_factory=set)
    port: int = 0
    _httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ids(self) -> list[str]:
        return [r.bundle["incident_id"] for r in self.received]

    def start(self) -> TriageServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                rec = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                server.received.append(rec)
                if server.mode == "slow":
                    time.sleep(server.delay)
                if server.mode == "reject":
                    self._answer(400, {"detail": "bundle does not validate"})
                    return
                if server.mode == "error":
                    self._answer(503, {"detail": "down for maintenance"})
                    return
                iid = rec.bundle["incident_id"]
                status = 200 if iid in server.known else 202
                server.known.add(iid)
                self._answer(
                    status,
                    {
                        "incident_id": iid,
                        "ticket_url": f"{server.url}/tickets/{iid[:8]}",
                        "verdict": "tensor_leak",
                        "status": "new" if status == 202 else "known",
                    },
                )

            def _answer(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (budget spent)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


def free_port() -> int:
    """A loopback port nobody listens on (the service is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def subprocess_env(
    pth_dir: Path,
    *,
    url: str | None,
    spool: Path | str | None = None,
    scenario: str | None = "tensor_leak",
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIAGE_", "OOMT_", "PYTORCH_CUDA"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "site"), str(HERE), str(ROOT)])
    env["OOMT_PTH_DIR"] = str(pth_dir)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if url is not None:
        env["OOMT_TRIAGE_URL"] = url
    if scenario:
        env["OOMT_FAKE_SCENARIO"] = scenario
    if spool is not None:
        env["TRIAGE_SPOOL"] = str(spool)
    env.update(extra or {})
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    ended_at: float

    def marker(self, name: str) -> str | None:
        for line in self.stdout.splitlines():
            if line.startswith(name + "="):
                return line.split("=", 1)[1]
        return None

    def triage_lines(self) -> list[str]:
        return [ln for ln in self.stderr.splitlines() if ln.startswith("oom-triage:")]

    def stderr_without_triage(self) -> str:
        return "\n".join(ln for ln in self.stderr.splitlines() if not ln.startswith("oom-triage:"))


def run_script(env: dict[str, str], *args: str, timeout: float = 60, argv0: list[str] | None = None) -> Run:
    t0 = time.monotonic()
    p = subprocess.run(
        [*(argv0 or [sys.executable, str(TRAIN)]), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(SCRIPTS),
    )
    return Run(p.returncode, p.stdout, p.stderr, time.monotonic() - t0, time.time())


def spooled(spool: Path) -> list[Path]:
    return sorted(spool.glob("*.json.gz")) if spool.is_dir() else []


def read_bundle(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))
