"""activedb's own tables: rule registry, transaction log, ingestion ledger, dead letters."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from activedb.migration_ops import batch_key, counter, drop_tables, identity_key, stamped, texts

revision = "0001_initial"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "activedb_rules",
        *texts("name", primary_key=True),
        *texts("event", "coupling", "action_coupling"),
        sa.Column("priority", sa.Integer, nullable=True),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        *texts("definition_hash"),
        sa.Column("definition", postgresql.JSONB, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="1"),
        stamped("created_at"),
        stamped("updated_at"),
    )
    op.create_table(
        "activedb_transaction_log",
        identity_key(),
        sa.Column("transaction_id", sa.Text, nullable=False, unique=True),
        sa.Column("began_at", sa.DateTime(timezone=True), nullable=False),
        stamped("committed_at"),
        counter("subtransactions"),
        counter("rows_written"),
        sa.Column("tables", postgresql.ARRAY(sa.Text), nullable=False, server_default="{}"),
        *batch_key(nullable=True),
        sa.Column("info", postgresql.JSONB, nullable=False, server_default="{}"),
    )
    op.create_table(
        "activedb_ingestion_ledger",
        *batch_key(primary_key=True),
        *texts("transaction_id"),
        counter("events"),
        counter("dead_letters"),
        sa.Column("watermark", sa.DateTime(timezone=True), nullable=True),
        sa.Column("rule_firings", postgresql.JSONB, nullable=False, server_default="{}"),
        stamped("committed_at"),
    )
    op.create_table(
        "activedb_dead_letters",
        identity_key(),
        *batch_key(nullable=True),
        *texts("reason"),
        sa.Column("raw", postgresql.JSONB, nullable=False),
        stamped(),
    )
    op.create_index("ix_activedb_dead_letters_batch", "activedb_dead_letters", ["query_id", "batch_id"])


def downgrade() -> None:
    op.drop_index("ix_activedb_dead_letters_batch", table_name="activedb_dead_letters")
    drop_tables("activedb_dead_letters", "activedb_ingestion_ledger", "activedb_transaction_log", "activedb_rules")
