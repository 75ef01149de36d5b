"""Stream engine state: reorder buffer, matcher partitions, punctuations (activedb.streams)."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from activedb.migration_ops import texts

revision = "0002_stream_state"
down_revision = "0001_initial"


def upgrade() -> None:
    op.create_table(
        "activedb_stream_state",
        *texts("engine", "kind", "item", primary_key=True),     # kind: meta | buffer | partition
        sa.Column("value", postgresql.JSONB, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("activedb_stream_state")
