"""Alembic environment: run with the connection `triage.store.migrate` passes in, or from the CLI with
`TRIAGE_DATABASE_URL` (see alembic.ini)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from triage.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from triage.store.session import Database

    db = Database(os.environ.get("TRIAGE_DATABASE_URL", "sqlite:///triage-data/triage.db"))
    try:
        with db.engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        db.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported: run them against a database")
run_migrations_online()
