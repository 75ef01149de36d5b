"""Stream engine state: reorder buffer, matcher partitions, punctuations (activedb.streams)."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002_stream_state"
down_revision = "0001_initial"


def upgrade() -> None:
    op.create_table(
        "activedb_stream_state",
        sa.Column("engine", sa.Text, primary_key=True),
        sa.Column("kind", sa.Text, primary_key=True),        # meta | buffer | partition
        sa.Column("item", sa.Text, primary_key=True),
        sa.Column("value", postgresql.JSONB, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("activedb_stream_state")
