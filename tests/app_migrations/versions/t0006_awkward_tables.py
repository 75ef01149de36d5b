"""Tables a new user's schema may well have, each awkward for SQL built by hand (tests/activedb/test_transactions.py,
"awkward tables"):

* ``Tallies``: a mixed-case name with a generated (identity) key ``Id``;
* ``rate%``: ``%`` in the table's name and in a column's (``50% off``), which a driver with ``%s`` parameters must
  be sent doubled — once;
* ``tokens``: a ``uuid`` key and a ``uuid`` column, written as ``uuid.UUID`` or as its text;
* ``measures``: ``double precision`` and ``numeric`` columns, which hold ``NaN``;
* ``stamps``: a ``timestamptz`` key;
* ``documents``: a ``json`` (not ``jsonb``) column, which has no equality operator in PostgreSQL.

Revision ID: t0006
Revises: t0005
"""
import sqlalchemy as sa
from alembic import op

revision = "t0006"
down_revision = "t0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "Tallies",
        sa.Column("Id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("Label", sa.Text),
    )
    op.create_table(
        "rate%",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("50% off", sa.Integer, nullable=False),
        sa.Column("note", sa.Text),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Uuid, primary_key=True),
        sa.Column("owner", sa.Uuid),
        sa.Column("uses", sa.Integer),
    )
    op.create_table(
        "measures",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("reading", sa.Float),
        sa.Column("exact", sa.Numeric),
    )
    op.create_table(
        "stamps",
        sa.Column("at", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("count", sa.Integer),
    )
    op.create_table(
        "documents",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("body", sa.JSON),
    )


def downgrade() -> None:
    for table in ("documents", "stamps", "measures", "tokens", "rate%", "Tallies"):
        op.drop_table(table)
