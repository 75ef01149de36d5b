"""``orders``, captured (every committed change of any client reaches rules on ``db.captured("orders", …)``),
and ``order_log``, which the rule of the change-capture how-to (docs/howto/change-capture.md) writes.
"""
import sqlalchemy as sa
from alembic import op

from activedb.capture.migration_ops import disable_capture, enable_capture
from activedb.migration_ops import assigned_key, drop_tables, identity_key, texts

revision = "o0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "orders",
        assigned_key("id", sa.BigInteger),
        *texts("customer"),
        sa.Column("amount", sa.Numeric(12, 2), nullable=False),
    )
    op.create_table(
        "order_log",
        identity_key(),
        *texts("rule", "kind"),
        sa.Column("order_id", sa.BigInteger, nullable=True),
        sa.Column("commit_position", sa.BigInteger, nullable=True),
    )
    enable_capture(op, "orders")


def downgrade() -> None:
    disable_capture(op, "orders")
    drop_tables("order_log", "orders")
