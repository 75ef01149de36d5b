"""A table with an enum column: ``moods``, whose ``mood`` is a PostgreSQL enum that takes its labels only
(tests/activedb/test_transactions.py, "awkward tables").

Revision ID: t0011
Revises: t0010
"""
import sqlalchemy as sa
from alembic import op

revision = "t0011"
down_revision = "t0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "moods",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("mood", sa.Enum("happy", "sad", name="mood")),
    )


def downgrade() -> None:
    op.drop_table("moods")
    sa.Enum(name="mood").drop(op.get_bind())
