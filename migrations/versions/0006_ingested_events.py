"""Event ids the Spark bridge has ingested, per query name (duplicate detection; ``migrations/README.md``)."""
import sqlalchemy as sa
from alembic import op

from activedb.migration_ops import batch_key, texts

revision = "0006_ingested_events"
down_revision = "0005_outbox"


def upgrade() -> None:
    op.create_table(
        "activedb_ingested_events",
        *texts("query_name", "event_id", primary_key=True),
        *batch_key(),
    )


def downgrade() -> None:
    op.drop_table("activedb_ingested_events")
