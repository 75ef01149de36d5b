"""Benchmark tables."""
import sqlalchemy as sa
from alembic import op

from activedb.migration_ops import assigned_key, counter, drop_tables

revision = "b0001"
down_revision = None


def upgrade() -> None:
    op.create_table("bench_objects", assigned_key(), counter("value"))
    op.create_table(
        "bench_rows",
        assigned_key(),
        sa.Column("a", sa.Integer, nullable=True),
        sa.Column("b", sa.Text, nullable=True),
    )


def downgrade() -> None:
    drop_tables("bench_rows", "bench_objects")
