"""The list-append history test's table (tests/scenarios/test_list_append_history.py).

* ``lists``: one list per key, stored as a JSON array of strings.  Each element is unique in the
  whole run (``"<writer>:<n>"``), so every list read names the transactions it came from.

Why ``jsonb`` and not ``int[]`` or ``text[]``: the elements are strings that name their writer
(readable in a failure report), psycopg hands a ``jsonb`` array back as a plain Python list without
any adapter, and the recorded histories (which cross a process boundary as JSON) keep exactly the
same values as the database.  An append replaces the whole value (read the list, write it back with
one more element), which is what the test exercises: a lost or stale base shows up as a missing or
reordered element.

Revision ID: t0004
Revises: t0003
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "t0004"
down_revision = "t0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lists",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", postgresql.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    )


def downgrade() -> None:
    op.drop_table("lists")
