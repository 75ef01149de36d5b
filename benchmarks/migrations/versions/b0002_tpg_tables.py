"""Tables of the TPG batch workloads (benchmarks.workloads): Streaming Ledger accounts and
assets, GrepSum states, Toll Processing segment speed and count.
"""
import sqlalchemy as sa
from alembic import op

from activedb.migration_ops import assigned_key, counter, drop_tables

revision = "b0002"
down_revision = "b0001"


def upgrade() -> None:
    # Three tables of one shape: an integer key and one BIGINT value.
    for table, value in (("tpg_accounts", "balance"), ("tpg_assets", "value"), ("tpg_grep", "value")):
        op.create_table(table, assigned_key(), counter(value, sa.BigInteger))
    op.create_table(
        "tpg_toll_speed",
        assigned_key("segment"),
        counter("avg_speed", sa.Float),
        counter("reports"),
    )
    op.create_table("tpg_toll_count", assigned_key("segment"), counter("vehicles"))


def downgrade() -> None:
    drop_tables("tpg_toll_count", "tpg_toll_speed", "tpg_grep", "tpg_assets", "tpg_accounts")
