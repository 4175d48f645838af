"""Fixtures of the service tests: every API test runs on SQLite (a temp file) and on the real PostgreSQL
at 127.0.0.1:5432 (a fresh `triage_test_<random>` database per run, dropped after). Without a reachable
PostgreSQL the PostgreSQL half is skipped, or fails when `CI` is set."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.service.svckit import Service
from triage.service import Settings

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
TABLES = (
    "outbox",
    "sink_links",
    "ticket_events",
    "incidents",
    "tickets",
    "scale_up_requests",
    "ingest_tokens",
)


@pytest.fixture(autouse=True)
def _no_triage_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from each test, never from the developer's environment."""
    for key in list(os.environ):
        if key.startswith("TRIAGE_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test run (dropped at the end)."""
    import psycopg

    try:
        admin = psycopg.connect(PG_DSN, autocommit=True)
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL at 127.0.0.1:5432 is not reachable ({exc})"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    name = f"triage_test_{secrets.token_hex(6)}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL.format(name=name)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _truncate(url: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            present = {
                r[0]
                for r in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
            }
            tables = [t for t in TABLES if t in present]
            if tables:
                conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store of one test: a SQLite file, or the run's PostgreSQL database emptied."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'triage.db'}"
    url: str = request.getfixturevalue("pg_database")
    _truncate(url)
    return url


@pytest.fixture
def make_settings(tmp_path: Path, database_url: str) -> Callable[..., Settings]:
    """Settings for a test: its own data dir and store, analysis in-thread, no background worker."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "data_dir": tmp_path / "data",
            "database_url": database_url,
            "analysis_isolation": "thread",
            "worker": False,
            "retry_backoff_seconds": 0,
            "public_url": "http://triage.test",
            "db_pool_size": 4,
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def make_service(make_settings: Callable[..., Settings]) -> Iterator[Callable[..., Service]]:
    made: list[Service] = []

    def make(**overrides: Any) -> Service:
        svc = Service(make_settings(**overrides))
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


@pytest.fixture
def service(make_service: Callable[..., Service]) -> Service:
    """The default service: development, reads open, ingest open (cluster `local`)."""
    return make_service()
