"""marks version on sessions: the view cache keeps the marks it read with it

Revision ID: 7b3e5c0d9a41
Revises: a02e32adef3e
Create Date: 2026-12-01 14:30:00.000000+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7b3e5c0d9a41"
down_revision: str | None = "a02e32adef3e"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agent_sessions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("marks_version", sa.Integer(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("agent_sessions", schema=None) as batch_op:
        batch_op.drop_column("marks_version")
