"""``customers``: each customer's running figures, which the rules of ``activedb.examples.orders.totals`` keep as
orders arrive (``total``, the sum of the amounts; ``orders``, how many).
"""
import sqlalchemy as sa
from alembic import op

from activedb.migration_ops import drop_tables, texts

revision = "o0002"
down_revision = "o0001"


def upgrade() -> None:
    op.create_table(
        "customers",
        *texts("name", primary_key=True),
        sa.Column("total", sa.Numeric(12, 2), nullable=False, server_default="0"),
        sa.Column("orders", sa.Integer, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    drop_tables("customers")
