"""Engines and session factories: SQLite (embedded default) or PostgreSQL (multi-replica).

On SQLite, writers take the database lock when their transaction begins (`BEGIN IMMEDIATE`), so
concurrent writers queue on the busy timeout instead of failing half-way with "database is locked";
readers use a separate engine with ordinary deferred transactions (WAL mode: they never block writers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

SQLITE_BUSY_TIMEOUT_S = 30.0


class Database:
    """The store's engines and session factories; `session()` writes, `read_session()` only reads."""

    def __init__(self, url: str | URL, *, pool_size: int = 10, echo: bool = False) -> None:
        self.url = make_url(url)
        self.dialect = self.url.get_backend_name()
        if self.dialect == "sqlite":
            memory = self.url.database in (None, "", ":memory:")
            self.engine = _sqlite_engine(self.url, immediate=True, memory=memory, echo=echo)
            self.read_engine = (
                self.engine if memory else _sqlite_engine(self.url, immediate=False, memory=False, echo=echo)
            )
        else:
            self.engine = create_engine(
                self.url,
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_pre_ping=True,
                pool_recycle=1800,
                echo=echo,
            )
            self.read_engine = self.engine
        self.session: sessionmaker[Session] = sessionmaker(self.engine, expire_on_commit=False)
        self.read_session: sessionmaker[Session] = sessionmaker(self.read_engine, expire_on_commit=False)

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def dispose(self) -> None:
        """Close every pooled connection (at shutdown, and in tests before dropping the database)."""
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()


def _sqlite_engine(url: URL, *, immediate: bool, memory: bool, echo: bool) -> Engine:
    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
        "echo": echo,
    }
    if memory:
        kwargs["poolclass"] = StaticPool
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _sqlite_on_connect(memory))
    event.listen(engine, "begin", _sqlite_begin(immediate))
    return engine


def _sqlite_on_connect(memory: bool) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the driver (the SQLAlchemy recipe for pysqlite), so that
        # BEGIN is emitted by the "begin" event below and DDL runs inside transactions.
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        try:
            if not memory:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        finally:
            cur.close()

    return on_connect


def _sqlite_begin(immediate: bool) -> Callable[[Any], None]:
    statement = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql(statement)

    return on_begin
