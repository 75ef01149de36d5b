"""Event ids the Spark bridge has ingested, per query name (duplicate detection).

When an ingestion's mapping names an event-id column (``EventMapping(id_column=...)``), the id of every
event a batch processed is written here in the batch's own PostgreSQL transaction (with its ledger row),
and an event whose id is already here — a source that re-sends — becomes a dead letter instead of being
applied twice.  Keyed by the query's stable name, so a new checkpoint of the same query still knows them.
"""
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
