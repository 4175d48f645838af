"""Shared by the GPU tests: the checkout on sys.path, the loopback triage service, the gpu marker, and the
skip on a machine without a CUDA GPU."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

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
