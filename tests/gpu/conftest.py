"""Shared by the GPU tests: the checkout on sys.path, the loopback triage service, the gpu marker, and the
skip on a machine without a CUDA GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "collector")]

from tests.collector.collector_harness import TriageServer  # noqa: E402


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = [it for it in items if Path(str(it.path)).parent == HERE]
    cuda = _cuda() if here else False
    for it in here:
        it.add_marker(pytest.mark.gpu)
        if not cuda:
            it.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="module")
def server() -> Iterator[TriageServer]:
    s = TriageServer().start()
    yield s
    s.stop()


def run_under_collector(
    server: TriageServer, script: Path, *args: str, send_budget: int = 20, timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """``triage-run`` (python -m collector.run) around ``python SCRIPT ARGS``: the process and the bundles
    the loopback service received from it, each validated against the service's schema."""
    from triage.schemas import IncidentBundle

    before = len(server.received)
    with tempfile.TemporaryDirectory() as spool:
        cmd = [sys.executable, "-m", "collector.run", "--url", server.url, "--spool", spool]
        cmd += ["--send-budget", str(send_budget), "--", sys.executable, str(script), *args]
        env = dict(os.environ, PYTHONPATH=str(ROOT), TRIAGE_DEBUG="1")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    bundles = [r.bundle for r in server.received[before:]]
    for b in bundles:
        IncidentBundle.model_validate(b)
    return p, bundles
