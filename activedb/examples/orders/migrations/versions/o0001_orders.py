"""``orders``, captured (every committed change of any client reaches rules on ``db.captured("orders", …)``),
and ``order_log``, which the README's rule writes.
"""
import sqlalchemy as sa
from alembic import op

from activedb.capture.migration_ops import disable_capture, enable_capture

revision = "o0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("customer", sa.Text, nullable=False),
        sa.Column("amount", sa.Numeric(12, 2), nullable=False),
    )
    op.create_table(
        "order_log",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("rule", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("order_id", sa.BigInteger, nullable=True),
        sa.Column("commit_position", sa.BigInteger, nullable=True),
    )
    enable_capture(op, "orders")


def downgrade() -> None:
    disable_capture(op, "orders")
    op.drop_table("order_log")
    op.drop_table("orders")
