"""Hand-hygiene tables: worker status, alerts, notifications, compensations."""
import sqlalchemy as sa
from alembic import op

revision = "h0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "worker_status",
        sa.Column("worker", sa.Text, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),          # safe | warning | violation
        sa.Column("room", sa.Text, nullable=True),
        sa.Column("last_event", sa.Text, nullable=True),
        sa.Column("last_ts", sa.Float, nullable=True),          # application time, seconds
        sa.Column("changes", sa.Integer, nullable=False, server_default="0"),
    )
    # Three logs of one shape: (id, worker, what, at).
    for table, what in (("alerts", "kind"), ("notifications", "message"), ("compensations", "reason")):
        op.create_table(
            table,
            sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
            sa.Column("worker", sa.Text, nullable=False),
            sa.Column(what, sa.Text, nullable=False),
            sa.Column("at", sa.Float, nullable=False),
        )


def downgrade() -> None:
    for table in ("compensations", "notifications", "alerts", "worker_status"):
        op.drop_table(table)
