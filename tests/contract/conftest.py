"""Fixtures of the resource-contract tests: golden manifests, fixture roots, and the CLI in-process and real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from triage.cli import main
from triage.contract.load import ContractFile, load_contract_file

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
MANIFESTS = FIXTURES / "manifests"
EXPECTED = FIXTURES / "expected"
ROOTS = FIXTURES / "roots"
GiB = 1024**3
MiB = 1024**2


@pytest.fixture(autouse=True)
def _no_contract_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from the packaged contract unless it sets $TRIAGE_CONTRACT itself."""
    monkeypatch.delenv("TRIAGE_CONTRACT", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def contract_file(_no_contract_env: None) -> ContractFile:
    """The packaged contract (the environment's $TRIAGE_CONTRACT is cleared first)."""
    return load_contract_file(None)


Result = tuple[int, str, str]


@pytest.fixture
def triage(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """`triage ARGS` in-process (the same parser and handlers as the console script): (rc, stdout, stderr)."""

    def run(*args: str) -> Result:
        try:
            rc = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            rc = int(exc.code or 0)
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture
def triage_json(triage: Callable[..., Result]) -> Callable[..., tuple[int, dict[str, Any]]]:
    def run(*args: str) -> tuple[int, dict[str, Any]]:
        rc, out, err = triage(*args, "--json")
        assert err == "", err
        return rc, json.loads(out)

    return run


def run_process(
    *args: str, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python3 -m triage.cli ARGS` in a fresh process, as a user runs it."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TRIAGE_CONTRACT", "POD_NAMESPACE")}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["COLUMNS"] = "200"
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "triage.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=str(cwd),
        timeout=60,
    )
