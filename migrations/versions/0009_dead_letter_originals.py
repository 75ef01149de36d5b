"""Dead letters keep their original row exactly. The design note: ``migrations/README.md``."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009_dead_letter_originals"
down_revision = "0008_split_batches"


def upgrade() -> None:
    op.add_column("activedb_dead_letters", sa.Column("original", postgresql.JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("activedb_dead_letters", "original")
