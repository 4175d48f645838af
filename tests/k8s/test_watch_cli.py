"""`triage watch`: the command line, over real HTTP on both sides (the fake API server, an ingest server)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.fakekube import FakeKubeAPI
from tests.k8s.k8sobjects import CUDA_OOM_LOG, NS, container_status, node, pod, terminated
from triage.cli import main

ROOT = Path(__file__).resolve().parents[2]


class IngestServer:
    """Records what arrives at POST /api/v1/incidents and answers like the service (202, then 200)."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                bundle = json.loads(gzip.decompress(body))
                repeat = any(b["incident_id"] == bundle["incident_id"] for _, b in outer.received)
                outer.received.append((dict(self.headers), bundle))
                answer = json.dumps({"incident_id": bundle["incident_id"], "status": "queued"}).encode()
                self.send_response(200 if repeat else 202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ingest() -> Iterator[IngestServer]:
    server = IngestServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def crashed(fake_api: FakeKubeAPI) -> FakeKubeAPI:
    fake_api.add_node(node())
    fake_api.add_pod(
        pod("oom-0", phase="Failed", statuses=[container_status(state=terminated("OOMKilled", 137))])
    )
    fake_api.add_pod(
        pod(
            "cuda-0",
            phase="Failed",
            statuses=[container_status(state=terminated("Error", 1))],
            labels={"app": "vit"},
        )
    )
    fake_api.set_log(NS, "oom-0", "trainer", "step 1\n")
    fake_api.set_log(NS, "cuda-0", "trainer", CUDA_OOM_LOG)
    return fake_api


def test_watch_once_posts_over_http(
    crashed: FakeKubeAPI, ingest: IngestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("watch-token-5d1c9e0f7a\n")
    monkeypatch.delenv("TRIAGE_TOKEN", raising=False)
    state = tmp_path / "state.json"
    argv = [
        "watch",
        "--once",
        "--api-url",
        crashed.url,
        "--url",
        ingest.url,
        "--token-file",
        str(token_file),
        "--state-file",
        str(state),
        "--log-tail-lines",
        "50",
    ]
    assert main(argv) == 0
    kinds = sorted(b["kind"] for _, b in ingest.received)
    assert kinds == ["cuda_oom", "host_oom"]
    for headers, _ in ingest.received:
        assert headers["Authorization"] == "Bearer watch-token-5d1c9e0f7a"
        assert headers["Content-Encoding"] == "gzip" and headers["Content-Type"] == "application/json"
    assert {q["tailLines"][0] for q in crashed.calls("/log")} == {"50"}
    assert json.loads(state.read_text())["resource_version"] == "100"
    # selector: only the vit pod
    ingest.received.clear()
    assert main([*argv[:-4], "--selector", "app=vit"]) == 0
    assert [b["workload"]["pod"] for _, b in ingest.received] == ["cuda-0"]


def test_dry_run_prints_bundles(crashed: FakeKubeAPI, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--once", "--dry-run", "--api-url", crashed.url, "--namespace", NS]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(b["kind"] for b in lines) == ["cuda_oom", "host_oom"]


def test_errors_are_reported_not_raised(
    crashed: FakeKubeAPI, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRIAGE_URL", raising=False)
    assert main(["watch", "--once", "--api-url", crashed.url]) == 2
    assert "no service URL" in capsys.readouterr().err
    assert main(["watch", "--once", "--url", "http://x", "--token-file", "/nonexistent/token"]) == 2
    assert "cannot read the token" in capsys.readouterr().err


def test_undeliverable_incidents_exit_nonzero(crashed: FakeKubeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    import triage.k8s.watcher as watcher

    monkeypatch.setattr(watcher.time, "sleep", lambda s: None)
    # nothing listens on port 9 of loopback: every POST fails to connect
    assert main(["watch", "--once", "--api-url", crashed.url, "--url", "http://127.0.0.1:9"]) == 1


def test_the_parser_does_not_import_kubernetes() -> None:
    code = (
        "import sys, triage.cli; triage.cli.build_parser(); "
        "bad = [m for m in ('kubernetes', 'triage.k8s.watcher', 'triage.k8s.client', 'torch') if m in sys.modules]; "
        "assert not bad, bad"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT, timeout=60)
