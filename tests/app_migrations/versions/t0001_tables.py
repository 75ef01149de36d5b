"""Tables used by the test suite.

Revision ID: t0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "t0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("owner", sa.Text, nullable=True),
        sa.Column("balance", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "items",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Integer, nullable=True),
        sa.Column("note", sa.Text, nullable=True),
    )
    op.create_table(
        "pairs",
        sa.Column("a", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("b", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("value", sa.Text, nullable=True),
    )
    op.create_table(
        "events_seen",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("rule", sa.Text, nullable=False),
        sa.Column("detail", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("events_seen")
    op.drop_table("pairs")
    op.drop_table("items")
    op.drop_table("accounts")
