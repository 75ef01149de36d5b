"""Benchmark tables."""
import sqlalchemy as sa
from alembic import op

revision = "b0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "bench_objects",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "bench_rows",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("a", sa.Integer, nullable=True),
        sa.Column("b", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("bench_rows")
    op.drop_table("bench_objects")
