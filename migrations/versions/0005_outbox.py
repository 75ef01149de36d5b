"""The outbox of detached-family rule firings (``activedb/outbox/README.md``; ``migrations/README.md``)."""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from activedb.migration_ops import counter, identity_key, stamped, texts

revision = "0005_outbox"
down_revision = "0004_capture"


def upgrade() -> None:
    op.create_table(
        "activedb_outbox",
        identity_key(),
        *texts("rule", "coupling"),
        sa.Column("event", postgresql.JSONB, nullable=False),
        sa.Column("chain", postgresql.ARRAY(sa.Text), nullable=False, server_default="{}"),
        sa.Column("trigger_id", sa.Text, nullable=False),
        sa.Column("trigger_log_id", sa.Text, nullable=True),
        sa.Column("trigger_outcome", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("owner", sa.BigInteger, nullable=True),
        counter("attempts"),
        *texts("error", "transaction_id", nullable=True),
        stamped(),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'done', 'failed')", name="activedb_outbox_status"),
        sa.CheckConstraint("trigger_outcome IN ('committed', 'aborted')", name="activedb_outbox_outcome"),
    )
    op.create_index("ix_activedb_outbox_pending", "activedb_outbox", ["owner", "id"],
                    postgresql_where=sa.text("status = 'pending'"))
    op.create_index("ix_activedb_outbox_failed", "activedb_outbox", ["rule"],
                    postgresql_where=sa.text("status = 'failed'"))


def downgrade() -> None:
    op.drop_index("ix_activedb_outbox_failed", table_name="activedb_outbox")
    op.drop_index("ix_activedb_outbox_pending", table_name="activedb_outbox")
    op.drop_table("activedb_outbox")
