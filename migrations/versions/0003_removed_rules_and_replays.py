"""Rules can be removed and pruned per application; dead letters remember their replay.

The columns and who sets them: ``migrations/README.md``.
"""
import sqlalchemy as sa
from alembic import op

revision = "0003_removed_rules_and_replays"
down_revision = "0002_stream_state"


def upgrade() -> None:
    op.add_column("activedb_rules", sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("activedb_rules", sa.Column("module", sa.Text, nullable=True))
    op.add_column("activedb_dead_letters", sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("activedb_dead_letters", sa.Column("replay_query_id", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("activedb_dead_letters", "replay_query_id")
    op.drop_column("activedb_dead_letters", "replayed_at")
    op.drop_column("activedb_rules", "module")
    op.drop_column("activedb_rules", "removed_at")
