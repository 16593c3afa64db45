"""durable runs: fencing epoch, reserved event ids, take-overs, remote cancel

Revision ID: a02e32adef3e
Revises: 5c1e8a9d2f47
Create Date: 2026-12-01 13:20:12.651810+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a02e32adef3e"
down_revision: str | None = "5c1e8a9d2f47"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("epoch", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(
            sa.Column("reserved_seq", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("takeovers", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("streaming_uuid", sa.Uuid(), nullable=True))
        batch_op.add_column(
            sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("cancel_requested_at")
        batch_op.drop_column("streaming_uuid")
        batch_op.drop_column("takeovers")
        batch_op.drop_column("reserved_seq")
        batch_op.drop_column("epoch")
