"""Tables of ``activedb bench capture``.

* ``bench_capture_plain`` and ``bench_capture_orders`` — the same shape; the benchmark captures the
  second one (``db.capture``) and writes both in the same run;
* ``bench_capture_effects`` — what the benchmark's rule writes, one row per captured change.
"""
import sqlalchemy as sa
from alembic import op

from activedb.migration_ops import assigned_key, drop_tables, texts

revision = "b0004"
down_revision = "b0003"


def _orders(name: str) -> None:
    op.create_table(
        name,
        assigned_key("id", sa.BigInteger),
        *texts("customer"),
        sa.Column("amount", sa.Numeric(12, 2), nullable=False),
        sa.Column("note", sa.Text, nullable=True),
    )


def upgrade() -> None:
    _orders("bench_capture_plain")
    _orders("bench_capture_orders")
    op.create_table(
        "bench_capture_effects",
        assigned_key("order_id", sa.BigInteger),
        sa.Column("commit_position", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    drop_tables("bench_capture_effects", "bench_capture_orders", "bench_capture_plain")
