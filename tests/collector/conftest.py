"""Fixtures for the collector's tests (helpers live in collector_harness.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.collector.collector_harness import PTH, TriageServer


@pytest.fixture
def server() -> Iterator[TriageServer]:
    s = TriageServer().start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def pth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory holding a copy of the package's auto-activation .pth file."""
    d = tmp_path_factory.mktemp("site-packages")
    shutil.copy(PTH, d / PTH.name)
    return d
