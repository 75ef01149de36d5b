"""Tables of the Spark bridge's test application (tests/spark_bridge/app_counters.py).

* ``counters``: per key, the running total, the number of events applied and the trail
  of event sequence numbers in the order the rules saw them;
* ``milestones``: one row per multiple of 100 a key's total crossed upwards.

Revision ID: t0002
Revises: t0001
"""
import sqlalchemy as sa
from alembic import op

revision = "t0002"
down_revision = "t0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "counters",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("total", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("events", sa.Integer, nullable=False, server_default="0"),
        sa.Column("trail", sa.Text, nullable=False, server_default=""),
        sa.Column("last_ts", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "milestones",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("threshold", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("milestones")
    op.drop_table("counters")
