"""A table whose key has a scale: ``cents``, a ``numeric(10, 2)`` key, given a ``Decimal`` or a ``float`` with more
places than the scale, which PostgreSQL rounds (tests/activedb/test_transactions.py, tests/batch/test_commit.py).

Revision ID: t0008
Revises: t0007
"""
import sqlalchemy as sa
from alembic import op

revision = "t0008"
down_revision = "t0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cents",
        sa.Column("amount", sa.Numeric(10, 2), primary_key=True),
        sa.Column("label", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("cents")
