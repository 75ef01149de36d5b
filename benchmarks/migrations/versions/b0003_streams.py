"""Tables of ``activedb bench streams``.

* ``bench_worker_status`` — the hand-hygiene status per worker; the benchmark's queries
  use Active CEP's names (``workerStatus(workerID, status)``) mapped onto it by the engine's
  ``aliases``;
* ``bench_stream_events`` — the plain write path: one row per event.
"""
import sqlalchemy as sa
from alembic import op

from activedb.migration_ops import assigned_key, drop_tables, texts

revision = "b0003"
down_revision = "b0002"


def upgrade() -> None:
    op.create_table("bench_worker_status", *texts("worker_id", primary_key=True), *texts("status"))
    op.create_table(
        "bench_stream_events",
        assigned_key(),
        *texts("type", "worker"),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("room", sa.Text, nullable=True),
    )


def downgrade() -> None:
    drop_tables("bench_stream_events", "bench_worker_status")
