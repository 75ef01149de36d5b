"""Tables whose keys a user may give as another Python value than PostgreSQL gives back, and a table outside the
default schema (tests/activedb/test_transactions.py, "awkward tables"):

* ``days``: a ``date`` key and a ``date`` column, given a ``datetime``;
* ``prices``: a ``numeric`` key, given an ``int``, a ``float`` or a ``Decimal``;
* ``elsewhere.things``: a table in a schema of its own, named ``elsewhere.things``.

Revision ID: t0007
Revises: t0006
"""
import sqlalchemy as sa
from alembic import op

revision = "t0007"
down_revision = "t0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "days",
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("due", sa.Date),
        sa.Column("count", sa.Integer),
    )
    op.create_table(
        "prices",
        sa.Column("amount", sa.Numeric, primary_key=True),
        sa.Column("label", sa.Text),
    )
    op.execute("CREATE SCHEMA elsewhere")
    op.create_table(
        "things",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("note", sa.Text),
        schema="elsewhere",
    )


def downgrade() -> None:
    op.drop_table("things", schema="elsewhere")
    op.execute("DROP SCHEMA elsewhere")
    op.drop_table("prices")
    op.drop_table("days")
