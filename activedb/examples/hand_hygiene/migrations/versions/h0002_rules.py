"""Hand-hygiene rules: pattern state on worker_status, channels, audit trail, badge lights.

* ``worker_status`` gains what the pattern queries of Active CEP (§1) need to remember per
  worker: when the status last changed, the last EXIT (room and time), the last
  SANITIZE and the last MASK (application time, seconds).
* ``notifications.channel``: ``badge`` (the detached real-time reminder) or
  ``infection_control`` (the sequential causally dependent incident report).
* ``compensations.event``: the type of the rejected badge event.
* ``status_changes``: the audit trail written by a deferred rule.
* ``badge_lights``: the light commands sent to the badges (detached causally
  dependent rule), one row per committed status change.
"""
import sqlalchemy as sa
from alembic import op

revision = "h0002"
down_revision = "h0001"


def upgrade() -> None:
    op.add_column("worker_status", sa.Column("status_ts", sa.Float, nullable=True))
    op.add_column("worker_status", sa.Column("last_exit_room", sa.Text, nullable=True))
    op.add_column("worker_status", sa.Column("last_exit_ts", sa.Float, nullable=True))
    op.add_column("worker_status", sa.Column("last_sanitize_ts", sa.Float, nullable=True))
    op.add_column("worker_status", sa.Column("last_mask_ts", sa.Float, nullable=True))
    op.add_column("notifications", sa.Column("channel", sa.Text, nullable=False, server_default="badge"))
    op.add_column("compensations", sa.Column("event", sa.Text, nullable=True))
    op.create_table(
        "status_changes",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("old_status", sa.Text, nullable=False),
        sa.Column("new_status", sa.Text, nullable=False),
        sa.Column("event", sa.Text, nullable=False),          # the badge event type that caused it
        sa.Column("at", sa.Float, nullable=False),            # application time, seconds
    )
    op.create_table(
        "badge_lights",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("color", sa.Text, nullable=False),          # green | yellow | red
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("badge_lights_worker_at", "badge_lights", ["worker", "at"])


def downgrade() -> None:
    op.drop_index("badge_lights_worker_at", table_name="badge_lights")
    op.drop_table("badge_lights")
    op.drop_table("status_changes")
    op.drop_column("compensations", "event")
    op.drop_column("notifications", "channel")
    op.drop_column("worker_status", "last_mask_ts")
    op.drop_column("worker_status", "last_sanitize_ts")
    op.drop_column("worker_status", "last_exit_ts")
    op.drop_column("worker_status", "last_exit_room")
    op.drop_column("worker_status", "status_ts")
