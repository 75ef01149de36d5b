"""Event ids the Spark bridge has ingested, per query name (duplicate detection).

When an ingestion's mapping names an event-id column (``EventMapping(id_column=...)``), the id of every
event a batch processed is written here in the batch's own PostgreSQL transaction (with its ledger row),
and an event whose id is already here — a source that re-sends — becomes a dead letter instead of being
applied twice.  Keyed by the query's stable name, so a new checkpoint of the same query still knows them.
"""
import sqlalchemy as sa
from alembic import op

revision = "0006_ingested_events"
down_revision = "0005_outbox"


def upgrade() -> None:
    op.create_table(
        "activedb_ingested_events",
        sa.Column("query_name", sa.Text, primary_key=True),
        sa.Column("event_id", sa.Text, primary_key=True),
        sa.Column("query_id", sa.Text, nullable=False),
        sa.Column("batch_id", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("activedb_ingested_events")
