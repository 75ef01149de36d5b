"""Dead letters keep their original row exactly.

* ``activedb_dead_letters.original`` (``jsonb``, NULL for letters written before): the row as its writer
  had it, in a lossless encoding (``activedb.deadletters.encode_original``: values through
  ``activedb.store.exact_json`` — NUL characters, lone surrogates, NaN, datetimes and decimals come back
  as they were — or an Arrow IPC stream of the one-row table Spark delivered).  ``raw`` stays the readable
  form the CLI shows; a replay submits ``original``.

The downgrade drops the column (letters then replay their readable ``raw``, as before).
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009_dead_letter_originals"
down_revision = "0008_split_batches"


def upgrade() -> None:
    op.add_column("activedb_dead_letters", sa.Column("original", postgresql.JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("activedb_dead_letters", "original")
