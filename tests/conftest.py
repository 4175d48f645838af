"""Shared test fixtures: the real snapshots beside the checkout, and running the CLI as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REAL_SNAPSHOTS = SHARED / "data" / "real-snapshots"


def real_snapshot_paths() -> list[Path]:
    paths = sorted(REAL_SNAPSHOTS.glob("*.pickle"))
    if not paths:  # CI always has ../shared beside the checkout: a missing corpus is a failure, not a skip
        raise RuntimeError(f"no real snapshots found under {REAL_SNAPSHOTS}")
    return paths


def run_cli(
    *args: str, input: bytes | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """Run `python -m triage.cli ARGS` in a fresh process."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("COLUMNS", "120")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "triage.cli", *args],
        input=input,
        capture_output=True,
        env=full_env,
        cwd=str(ROOT),
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def real_paths() -> list[Path]:
    return real_snapshot_paths()
