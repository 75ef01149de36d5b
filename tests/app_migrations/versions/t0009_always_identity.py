"""A table whose key is ``GENERATED ALWAYS AS IDENTITY``: ``tickets``, which PostgreSQL gives no row a key the
application chose (SQLSTATE 428C9) — activedb draws the key from the identity's own sequence and inserts it
``OVERRIDING SYSTEM VALUE`` (tests/activedb/test_transactions.py, "awkward tables").

Revision ID: t0009
Revises: t0008
"""
import sqlalchemy as sa
from alembic import op

revision = "t0009"
down_revision = "t0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tickets",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("note", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("tickets")
