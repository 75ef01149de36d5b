"""Tables of ``activedb bench streams``.

* ``bench_worker_status`` — the hand-hygiene status per worker; the benchmark's queries
  use Active CEP's names (``workerStatus(workerID, status)``) mapped onto it by the engine's
  ``aliases``;
* ``bench_stream_events`` — the plain write path: one row per event.
"""
import sqlalchemy as sa
from alembic import op

revision = "b0003"
down_revision = "b0002"


def upgrade() -> None:
    op.create_table(
        "bench_worker_status",
        sa.Column("worker_id", sa.Text, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),
    )
    op.create_table(
        "bench_stream_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("room", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("bench_stream_events")
    op.drop_table("bench_worker_status")
