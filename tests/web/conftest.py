"""Fixtures of the page tests: one service seeded with three tickets (analysed by the real worker)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pagekit import SCREENSHOTS, App, Seeded, bundle, hostile_bundle


@pytest.fixture(autouse=True)
def _no_triage_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("TRIAGE_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    app = App(Path(tmp_path_factory.mktemp("pages")))
    posted: dict[str, dict[str, Any]] = {}
    docs = [hostile_bundle(rank=r, world_size=4, job="evil-job") for r in range(4)]
    docs.append(bundle("other_process", 1, job="vit-dpo", namespace="vision", team="vision-team"))
    docs.append(bundle("shm_exhausted", 0, job="dino-sft", namespace="vision", team="vision-team"))
    for doc in docs:
        app.post(doc)
        posted[doc["incident_id"]] = doc
    assert app.drain() == len(docs)
    tickets = app.client.get("/api/v1/tickets").json()["items"]
    by_verdict = {t["verdict"]: t for t in tickets}
    assert set(by_verdict) == {"tensor_leak", "other_process", "shm_exhausted"}, tickets
    yield Seeded(
        app, by_verdict["tensor_leak"], by_verdict["other_process"], by_verdict["shm_exhausted"], posted
    )
    app.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the screenshots the browser tests saved (they are test artifacts, under artifacts/)."""
    for shot in SCREENSHOTS:
        terminalreporter.write_line(f"browser screenshot saved: {shot}")
