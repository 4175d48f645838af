"""Running a GPU workload under the collector, for tests/gpu."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.collector.collector_harness import TriageServer

ROOT = Path(__file__).resolve().parents[2]


def run_under_collector(
    server: TriageServer,
    script: Path,
    *args: str,
    send_budget: int = 20,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """``triage-run`` (python -m collector.run) around ``python SCRIPT ARGS``: the process and the bundles
    the loopback service received from it, each validated against the service's schema."""
    from triage.schemas import IncidentBundle

    before = len(server.received)
    with tempfile.TemporaryDirectory() as spool:
        cmd = [sys.executable, "-m", "collector.run", "--url", server.url, "--spool", spool]
        cmd += ["--send-budget", str(send_budget), "--", sys.executable, str(script), *args]
        full = dict(os.environ, **(env or {}), PYTHONPATH=str(ROOT), TRIAGE_DEBUG="1")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT)
    bundles = [r.bundle for r in server.received[before:]]
    for b in bundles:
        IncidentBundle.model_validate(b)
    return p, bundles
