"""Tables of the TPG batch workloads (activedb.batch.workloads): Streaming Ledger accounts and
assets, GrepSum states, Toll Processing segment speed and count.
"""
import sqlalchemy as sa
from alembic import op

revision = "b0002"
down_revision = "b0001"


def upgrade() -> None:
    # Three tables of one shape: an integer key and one BIGINT value.
    for table, value in (("tpg_accounts", "balance"), ("tpg_assets", "value"), ("tpg_grep", "value")):
        op.create_table(
            table,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column(value, sa.BigInteger, nullable=False, server_default="0"),
        )
    op.create_table(
        "tpg_toll_speed",
        sa.Column("segment", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("avg_speed", sa.Float, nullable=False, server_default="0"),
        sa.Column("reports", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "tpg_toll_count",
        sa.Column("segment", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("vehicles", sa.Integer, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    for table in ("tpg_toll_count", "tpg_toll_speed", "tpg_grep", "tpg_assets", "tpg_accounts"):
        op.drop_table(table)
