"""activedb's own tables: rule registry, transaction log, ingestion ledger, dead letters."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001_initial"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "activedb_rules",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("coupling", sa.Text, nullable=False),
        sa.Column("action_coupling", sa.Text, nullable=False),
        sa.Column("priority", sa.Integer, nullable=True),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("definition_hash", sa.Text, nullable=False),
        sa.Column("definition", postgresql.JSONB, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="1"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "activedb_transaction_log",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("transaction_id", sa.Text, nullable=False, unique=True),
        sa.Column("began_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("subtransactions", sa.Integer, nullable=False, server_default="0"),
        sa.Column("rows_written", sa.Integer, nullable=False, server_default="0"),
        sa.Column("tables", postgresql.ARRAY(sa.Text), nullable=False, server_default="{}"),
        sa.Column("query_id", sa.Text, nullable=True),
        sa.Column("batch_id", sa.BigInteger, nullable=True),
        sa.Column("info", postgresql.JSONB, nullable=False, server_default="{}"),
    )
    op.create_table(
        "activedb_ingestion_ledger",
        sa.Column("query_id", sa.Text, primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True),
        sa.Column("transaction_id", sa.Text, nullable=False),
        sa.Column("events", sa.Integer, nullable=False, server_default="0"),
        sa.Column("dead_letters", sa.Integer, nullable=False, server_default="0"),
        sa.Column("watermark", sa.DateTime(timezone=True), nullable=True),
        sa.Column("rule_firings", postgresql.JSONB, nullable=False, server_default="{}"),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "activedb_dead_letters",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("query_id", sa.Text, nullable=True),
        sa.Column("batch_id", sa.BigInteger, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("raw", postgresql.JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_activedb_dead_letters_batch", "activedb_dead_letters", ["query_id", "batch_id"])


def downgrade() -> None:
    op.drop_index("ix_activedb_dead_letters_batch", table_name="activedb_dead_letters")
    op.drop_table("activedb_dead_letters")
    op.drop_table("activedb_ingestion_ledger")
    op.drop_table("activedb_transaction_log")
    op.drop_table("activedb_rules")
