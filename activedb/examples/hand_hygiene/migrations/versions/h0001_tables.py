"""Hand-hygiene tables: worker status, alerts, notifications, compensations.

Revision ID: h0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "h0001"
down_revision = None
branch_labels = None
depends_on = None


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
    op.create_table(
        "alerts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_table(
        "notifications",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_table(
        "compensations",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("compensations")
    op.drop_table("notifications")
    op.drop_table("alerts")
    op.drop_table("worker_status")
