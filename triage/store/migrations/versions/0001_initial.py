"""Initial schema: incidents (with queue columns), tickets, events, outbox, sink links, scale-up requests,
ingest tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "ingest_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=200), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster"),
        sa.UniqueConstraint("token_sha256"),
    )
    op.create_table(
        "scale_up_requests",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requested_by", sa.String(length=200), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=True),
        sa.Column("job", sa.String(length=500), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("requested_gpus", sa.Integer(), nullable=True),
        sa.Column("mfu", sa.Float(), nullable=False),
        sa.Column("gpu_utilization", sa.Float(), nullable=False),
        sa.Column("step_time_s", sa.Float(), nullable=False),
        sa.Column("approved", sa.Boolean(), nullable=False),
        sa.Column("reasons", JSON_TYPE, nullable=False),
        sa.Column("decision", JSON_TYPE, nullable=False),
        sa.Column("contract_version", sa.String(length=100), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("scale_up_requests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_scale_up_requests_created_at"), ["created_at"], unique=False)

    op.create_table(
        "tickets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("title", sa.String(length=500), nullable=False),
        sa.Column("cluster", sa.String(length=200), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=True),
        sa.Column("job", sa.String(length=500), nullable=True),
        sa.Column("team", sa.String(length=200), nullable=True),
        sa.Column("owner", sa.String(length=20), nullable=True),
        sa.Column("verdict", sa.String(length=40), nullable=False),
        sa.Column("site", sa.String(length=1000), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("assignee", sa.String(length=200), nullable=True),
        sa.Column("incident_count", sa.Integer(), nullable=False),
        sa.Column("rank_count", sa.Integer(), nullable=False),
        sa.Column("pod_count", sa.Integer(), nullable=False),
        sa.Column("max_restart", sa.Integer(), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reopen_count", sa.Integer(), nullable=False),
        sa.Column("latest_incident_id", sa.String(length=36), nullable=True),
        sa.Column("headline", sa.Text(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("summary", JSON_TYPE, nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint"),
    )
    with op.batch_alter_table("tickets", schema=None) as batch_op:
        batch_op.create_index("ix_tickets_last_seen", ["last_seen"], unique=False)
        batch_op.create_index(batch_op.f("ix_tickets_namespace"), ["namespace"], unique=False)
        batch_op.create_index("ix_tickets_status_last_seen", ["status", "last_seen"], unique=False)
        batch_op.create_index(batch_op.f("ix_tickets_team"), ["team"], unique=False)
        batch_op.create_index(batch_op.f("ix_tickets_verdict"), ["verdict"], unique=False)

    op.create_table(
        "incidents",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster", sa.String(length=200), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=True),
        sa.Column("pod", sa.String(length=253), nullable=True),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("container", sa.String(length=253), nullable=True),
        sa.Column("job", sa.String(length=500), nullable=True),
        sa.Column("owner_kind", sa.String(length=100), nullable=True),
        sa.Column("owner_name", sa.String(length=500), nullable=True),
        sa.Column("team", sa.String(length=200), nullable=True),
        sa.Column("labels", JSON_TYPE, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("local_rank", sa.Integer(), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("restart_count", sa.Integer(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.Column("blob_path", sa.String(length=500), nullable=True),
        sa.Column("blob_encoding", sa.String(length=20), nullable=False),
        sa.Column("blob_sha256", sa.String(length=64), nullable=False),
        sa.Column("blob_bytes", sa.BigInteger(), nullable=False),
        sa.Column("wire_bytes", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("available_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.String(length=100), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("verdict", sa.String(length=40), nullable=True),
        sa.Column("owner", sa.String(length=20), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("diagnosis", JSON_TYPE, nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("analysed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ticket_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["ticket_id"], ["tickets.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.create_index("ix_incidents_queue", ["status", "available_at"], unique=False)
        batch_op.create_index("ix_incidents_received_at", ["received_at"], unique=False)
        batch_op.create_index("ix_incidents_ticket_rank", ["ticket_id", "rank"], unique=False)
        batch_op.create_index(batch_op.f("ix_incidents_verdict"), ["verdict"], unique=False)

    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("ticket_id", sa.Integer(), nullable=False),
        sa.Column("sink", sa.String(length=100), nullable=False),
        sa.Column("action", sa.String(length=20), nullable=False),
        sa.Column("payload", JSON_TYPE, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("external_ref", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["ticket_id"], ["tickets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_due", ["delivered_at", "next_attempt_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_outbox_ticket_id"), ["ticket_id"], unique=False)

    op.create_table(
        "sink_links",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("ticket_id", sa.Integer(), nullable=False),
        sa.Column("sink", sa.String(length=100), nullable=False),
        sa.Column("external_ref", sa.String(length=500), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["ticket_id"], ["tickets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("ticket_id", "sink", name="uq_sink_links_ticket_sink"),
    )
    op.create_table(
        "ticket_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("ticket_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("detail", JSON_TYPE, nullable=False),
        sa.ForeignKeyConstraint(["ticket_id"], ["tickets.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ticket_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ticket_events_ticket_id"), ["ticket_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("ticket_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ticket_events_ticket_id"))

    op.drop_table("ticket_events")
    op.drop_table("sink_links")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_outbox_ticket_id"))
        batch_op.drop_index("ix_outbox_due")

    op.drop_table("outbox")
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_incidents_verdict"))
        batch_op.drop_index("ix_incidents_ticket_rank")
        batch_op.drop_index("ix_incidents_received_at")
        batch_op.drop_index("ix_incidents_queue")

    op.drop_table("incidents")
    with op.batch_alter_table("tickets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tickets_verdict"))
        batch_op.drop_index(batch_op.f("ix_tickets_team"))
        batch_op.drop_index("ix_tickets_status_last_seen")
        batch_op.drop_index(batch_op.f("ix_tickets_namespace"))
        batch_op.drop_index("ix_tickets_last_seen")

    op.drop_table("tickets")
    with op.batch_alter_table("scale_up_requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_scale_up_requests_created_at"))

    op.drop_table("scale_up_requests")
    op.drop_table("ingest_tokens")
