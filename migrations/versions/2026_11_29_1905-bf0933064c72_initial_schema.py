"""initial schema

Revision ID: bf0933064c72
Revises:
Create Date: 2026-11-29 19:05:25.890419+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "bf0933064c72"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_sessions",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("title", sa.String(length=500), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column(
            "system",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "tools",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "builtin_tools",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("max_tokens", sa.Integer(), nullable=True),
        sa.Column(
            "thinking",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "compaction",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("head_uuid", sa.Uuid(), nullable=True),
        sa.Column("message_seq", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_creation_input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("compact_failures", sa.Integer(), nullable=False),
        sa.Column("last_request_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_sessions")),
    )
    op.create_index(
        "ix_agent_sessions_tenant_created",
        "agent_sessions",
        ["tenant", "created_at", "id"],
        unique=False,
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("key_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_sha256", name=op.f("uq_api_keys_key_sha256")),
    )
    op.create_table(
        "files",
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["agent_sessions.id"],
            name=op.f("fk_files_session_id_agent_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "path", name=op.f("pk_files")),
    )
    op.create_table(
        "messages",
        sa.Column("uuid", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("parent_uuid", sa.Uuid(), nullable=True),
        sa.Column("logical_parent_uuid", sa.Uuid(), nullable=True),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("subtype", sa.String(length=64), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column(
            "content",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("stop_reason", sa.String(length=64), nullable=True),
        sa.Column(
            "usage",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("is_meta", sa.Boolean(), nullable=False),
        sa.Column("token_estimate", sa.Integer(), nullable=False),
        sa.Column("copied_from", sa.Uuid(), nullable=True),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["logical_parent_uuid"],
            ["messages.uuid"],
            name=op.f("fk_messages_logical_parent_uuid_messages"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["parent_uuid"],
            ["messages.uuid"],
            name=op.f("fk_messages_parent_uuid_messages"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["agent_sessions.id"],
            name=op.f("fk_messages_session_id_agent_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("uuid", name=op.f("pk_messages")),
    )
    op.create_index(
        op.f("ix_messages_logical_parent_uuid"), "messages", ["logical_parent_uuid"], unique=False
    )
    op.create_index(op.f("ix_messages_parent_uuid"), "messages", ["parent_uuid"], unique=False)
    op.create_index(op.f("ix_messages_run_id"), "messages", ["run_id"], unique=False)
    op.create_index("uq_messages_session_seq", "messages", ["session_id", "seq"], unique=True)
    op.create_table(
        "runs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("user_message_uuid", sa.Uuid(), nullable=True),
        sa.Column(
            "required_action",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "usage",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "error",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "params",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "state",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("last_event_seq", sa.BigInteger(), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["agent_sessions.id"],
            name=op.f("fk_runs_session_id_agent_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index(
        "ix_runs_session_created", "runs", ["session_id", "created_at", "id"], unique=False
    )
    op.create_index("ix_runs_status", "runs", ["status", "lease_expires_at"], unique=False)
    op.create_index(
        "uq_runs_one_active_per_session",
        "runs",
        ["session_id"],
        unique=True,
        postgresql_where=sa.text("status IN ('running', 'requires_action')"),
        sqlite_where=sa.text("status IN ('running', 'requires_action')"),
    )
    op.create_index(
        "uq_runs_session_idempotency_key",
        "runs",
        ["session_id", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_table(
        "collapses",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("start_uuid", sa.Uuid(), nullable=False),
        sa.Column("end_uuid", sa.Uuid(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("tokens_saved", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["end_uuid"],
            ["messages.uuid"],
            name=op.f("fk_collapses_end_uuid_messages"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["agent_sessions.id"],
            name=op.f("fk_collapses_session_id_agent_sessions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["start_uuid"],
            ["messages.uuid"],
            name=op.f("fk_collapses_start_uuid_messages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_collapses")),
    )
    op.create_index(op.f("ix_collapses_end_uuid"), "collapses", ["end_uuid"], unique=False)
    op.create_index(op.f("ix_collapses_session_id"), "collapses", ["session_id"], unique=False)
    op.create_index(op.f("ix_collapses_start_uuid"), "collapses", ["start_uuid"], unique=False)
    op.create_table(
        "micro_watermarks",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("anchor_uuid", sa.Uuid(), nullable=False),
        sa.Column("tokens_freed", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["anchor_uuid"],
            ["messages.uuid"],
            name=op.f("fk_micro_watermarks_anchor_uuid_messages"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["agent_sessions.id"],
            name=op.f("fk_micro_watermarks_session_id_agent_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_micro_watermarks")),
    )
    op.create_index(
        op.f("ix_micro_watermarks_anchor_uuid"), "micro_watermarks", ["anchor_uuid"], unique=False
    )
    op.create_index(
        op.f("ix_micro_watermarks_session_id"), "micro_watermarks", ["session_id"], unique=False
    )
    op.create_table(
        "run_events",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_run_events_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "seq", name=op.f("pk_run_events")),
    )
    op.create_table(
        "snips",
        sa.Column("message_uuid", sa.Uuid(), nullable=False),
        sa.Column("session_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["message_uuid"],
            ["messages.uuid"],
            name=op.f("fk_snips_message_uuid_messages"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["agent_sessions.id"],
            name=op.f("fk_snips_session_id_agent_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("message_uuid", name=op.f("pk_snips")),
    )
    op.create_index(op.f("ix_snips_session_id"), "snips", ["session_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_snips_session_id"), table_name="snips")
    op.drop_table("snips")
    op.drop_table("run_events")
    op.drop_index(op.f("ix_micro_watermarks_session_id"), table_name="micro_watermarks")
    op.drop_index(op.f("ix_micro_watermarks_anchor_uuid"), table_name="micro_watermarks")
    op.drop_table("micro_watermarks")
    op.drop_index(op.f("ix_collapses_start_uuid"), table_name="collapses")
    op.drop_index(op.f("ix_collapses_session_id"), table_name="collapses")
    op.drop_index(op.f("ix_collapses_end_uuid"), table_name="collapses")
    op.drop_table("collapses")
    op.drop_index(
        "uq_runs_session_idempotency_key",
        table_name="runs",
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.drop_index(
        "uq_runs_one_active_per_session",
        table_name="runs",
        postgresql_where=sa.text("status IN ('running', 'requires_action')"),
        sqlite_where=sa.text("status IN ('running', 'requires_action')"),
    )
    op.drop_index("ix_runs_status", table_name="runs")
    op.drop_index("ix_runs_session_created", table_name="runs")
    op.drop_table("runs")
    op.drop_index("uq_messages_session_seq", table_name="messages")
    op.drop_index(op.f("ix_messages_run_id"), table_name="messages")
    op.drop_index(op.f("ix_messages_parent_uuid"), table_name="messages")
    op.drop_index(op.f("ix_messages_logical_parent_uuid"), table_name="messages")
    op.drop_table("messages")
    op.drop_table("files")
    op.drop_table("api_keys")
    op.drop_index("ix_agent_sessions_tenant_created", table_name="agent_sessions")
    op.drop_table("agent_sessions")
