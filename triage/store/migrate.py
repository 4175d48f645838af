"""Run the Alembic migrations programmatically at start, one process at a time.

On PostgreSQL a session-level advisory lock serializes replicas that start together; on SQLite a file
lock beside the database does the same for processes on one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

from triage.store.session import Database

log = logging.getLogger("triage.store")

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_ADVISORY_LOCK_KEY = 0x7472_6961  # "tria"


def alembic_config() -> Config:
    """An Alembic config pointing at the packaged migrations (no ini file needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    return cfg


@functools.cache
def head_revision() -> str | None:
    """The newest migration shipped with this build."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(conn: Connection) -> str | None:
    """The revision the database is at (None: never migrated)."""
    return MigrationContext.configure(conn).get_current_revision()


def upgrade(db: Database, revision: str = "head") -> None:
    """Bring the database to `revision` (the head by default); safe to call from every replica."""
    cfg = alembic_config()
    with _file_lock(db), db.engine.connect() as conn:
        if db.is_postgres:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
            conn.commit()
        try:
            before = current_revision(conn)
            conn.commit()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
            after = current_revision(conn)
            conn.commit()
            if before != after:
                log.info("database migrated", extra={"from_revision": before, "to_revision": after})
        finally:
            if db.is_postgres:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _ADVISORY_LOCK_KEY})
                conn.commit()


@contextlib.contextmanager
def _file_lock(db: Database) -> Iterator[None]:
    if not db.is_sqlite or db.url.database in (None, "", ":memory:"):
        yield
        return
    path = Path(str(db.url.database)).with_suffix(".migrate.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
