"""Fixtures for the sink tests: a real Redmine (once per session), payloads, recording HTTP servers."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realparts import Alertmanager, HttpRecorder, Redmine
from tests.sinks.sinkkit import make_payload


@pytest.fixture(scope="session")
def redmine() -> Iterator[Redmine]:
    r = Redmine()
    try:
        r.start()
        yield r
    finally:
        r.stop()


@pytest.fixture
def recorder() -> Iterator[HttpRecorder]:
    with HttpRecorder() as rec:
        yield rec


@pytest.fixture
def payload_factory() -> Callable[..., Any]:
    return make_payload


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A migrated store: a SQLite file, and a fresh PostgreSQL database on 127.0.0.1:5432."""
    from triage.store.migrate import upgrade
    from triage.store.session import Database

    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'triage.db'}")
        upgrade(database)
        yield database
        database.dispose()
        return
    name = f"triage_test_{secrets.token_hex(4)}"
    try:
        import psycopg

        admin = psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True)
    except Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is not reachable: {exc}")
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 is not reachable: {type(exc).__name__}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        database = Database(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", pool_size=4)
        try:
            upgrade(database)
            yield database
        finally:
            database.dispose()
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def receiver() -> Iterator[HttpRecorder]:
    """The webhook Alertmanager routes to (one per test module)."""
    with HttpRecorder() as rec:
        yield rec


@pytest.fixture(scope="module")
def alertmanager(receiver: HttpRecorder) -> Iterator[Alertmanager]:
    am = Alertmanager(webhook_url=f"{receiver.url}/hook")
    try:
        yield am.start()
    finally:
        am.stop()
