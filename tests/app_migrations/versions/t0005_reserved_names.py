"""A table whose columns are named as the row-writing calls name their own parameters
(tests/activedb/test_transactions.py, "columns named key, table, name").

* ``settings``: ``id`` is the key; ``key``, ``table`` and ``name`` are ordinary columns, as a
  key-value settings table or a catalogue of tables has them.  ``tx.write(table, key, **values)`` and
  ``tx.insert(table, **values)`` take them as values (their own parameters are positional-only).

Revision ID: t0005
Revises: t0004
"""
import sqlalchemy as sa
from alembic import op

revision = "t0005"
down_revision = "t0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "settings",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.Text),
        sa.Column("table", sa.Text),
        sa.Column("name", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("settings")
