"""Tables of the stream-transaction tests (tests/streams).

* ``workerstatus`` — Active CEP §3.1's ``workerStatus(workerID, status)``; created with the
  names PostgreSQL gives the paper's unquoted identifiers, so Q1 and R1 run as printed;
* ``stream_alerts`` — rows inserted by rule actions;
* ``stream_cells`` — the store of the randomised query/rule sets.

Revision ID: t0003
Revises: t0002
"""
import sqlalchemy as sa
from alembic import op

revision = "t0003"
down_revision = "t0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workerstatus",
        sa.Column("workerid", sa.Text, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),
    )
    op.create_table(
        "stream_alerts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("location", sa.Text, nullable=True),
        sa.Column("at", sa.Float, nullable=True),
    )
    op.create_table(
        "stream_cells",
        sa.Column("cell", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.Integer, nullable=False, server_default="0"),
        sa.Column("note", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("stream_cells")
    op.drop_table("stream_alerts")
    op.drop_table("workerstatus")
