"""Rules can be removed and pruned per application; dead letters remember their replay.

* ``activedb_rules.removed_at``: set by ``db.rules.remove(name)`` and ``activedb rules remove``
  (the row stays, so its versions and firing history remain readable; a later declaration of the
  rule clears it); ``activedb rules remove --purge`` deletes rows.
* ``activedb_rules.module``: the Python module that declared the rule (the action function's, or the
  ``Rule`` subclass's), so that rules of one application can be listed and pruned on a database that
  several applications share (``activedb rules list --module PREFIX``).
* ``activedb_dead_letters.replayed_at`` / ``replay_query_id``: set, in the same PostgreSQL
  transaction as the replay's effects, when ``activedb dead-letters replay`` re-submitted the row.
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
