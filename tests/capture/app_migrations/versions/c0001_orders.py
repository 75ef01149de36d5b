"""Tables of the capture tests.

* ``orders`` — written by raw SQL "external" writers (and by activedb, to check its own writes are not
  delivered twice);
* ``order_log`` — one row per rule firing on a captured change, in firing order (identity ``id``);
* ``order_totals`` — per customer, a running total and the trail of order ids in the order the rules saw
  them (a read-modify-write: a lost or repeated reaction shows);
* ``typed_samples`` — one column per common PostgreSQL type, to compare captured rows with activedb reads.

Revision ID: c0001
Revises:
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "c0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("customer", sa.Text, nullable=False),
        sa.Column("amount", sa.Numeric(12, 2), nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="new"),
    )
    op.create_table(
        "order_log",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("rule", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("order_id", sa.BigInteger, nullable=True),
        sa.Column("xid", sa.BigInteger, nullable=True),
        sa.Column("commit_position", sa.BigInteger, nullable=True),
        sa.Column("change_id", sa.BigInteger, nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
    )
    op.create_table(
        "order_totals",
        sa.Column("customer", sa.Text, primary_key=True),
        sa.Column("total", sa.Numeric(14, 2), nullable=False, server_default="0"),
        sa.Column("orders", sa.Integer, nullable=False, server_default="0"),
        sa.Column("trail", sa.Text, nullable=False, server_default=""),
    )
    op.create_table(
        "typed_samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("small", sa.SmallInteger),
        sa.Column("big", sa.BigInteger),
        sa.Column("exact", sa.Numeric(20, 6)),
        sa.Column("real", sa.Float),
        sa.Column("flag", sa.Boolean),
        sa.Column("label", sa.Text),
        sa.Column("at", sa.DateTime(timezone=True)),
        sa.Column("naive", sa.DateTime),
        sa.Column("day", sa.Date),
        sa.Column("clock", sa.Time),
        sa.Column("span", sa.Interval),
        sa.Column("doc", postgresql.JSONB),
        sa.Column("uid", postgresql.UUID),
        sa.Column("blob", sa.LargeBinary),
        sa.Column("tags", postgresql.ARRAY(sa.Text)),
    )


def downgrade() -> None:
    op.drop_table("typed_samples")
    op.drop_table("order_totals")
    op.drop_table("order_log")
    op.drop_table("orders")
