"""Tables of ``activedb bench capture``.

* ``bench_capture_plain`` and ``bench_capture_orders`` — the same shape; the benchmark captures the
  second one (``db.capture``) and writes both in the same run;
* ``bench_capture_effects`` — what the benchmark's rule writes, one row per captured change.
"""
import sqlalchemy as sa
from alembic import op

revision = "b0004"
down_revision = "b0003"


def _orders(name: str) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("customer", sa.Text, nullable=False),
        sa.Column("amount", sa.Numeric(12, 2), nullable=False),
        sa.Column("note", sa.Text, nullable=True),
    )


def upgrade() -> None:
    _orders("bench_capture_plain")
    _orders("bench_capture_orders")
    op.create_table(
        "bench_capture_effects",
        sa.Column("order_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("commit_position", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("bench_capture_effects")
    op.drop_table("bench_capture_orders")
    op.drop_table("bench_capture_plain")
