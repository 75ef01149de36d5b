"""Per-key counters for ``activedb bench rules``: the table the counter rule upserts, and the PL/pgSQL
peer's event table whose row trigger does the same upsert.
"""
import sqlalchemy as sa
from alembic import op

from activedb.migration_ops import assigned_key, drop_tables

revision = "b0006"
down_revision = "b0005"


def upgrade() -> None:
    op.create_table(
        "bench_counters",
        assigned_key("key"),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "bench_counter_events",
        sa.Column("key", sa.Integer, nullable=False),
    )
    op.execute("""
        CREATE FUNCTION bench_count_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO bench_counters (key, n) VALUES (NEW.key, 1)
            ON CONFLICT (key) DO UPDATE SET n = bench_counters.n + 1;
            RETURN NULL;   -- the event row itself is not kept
        END $$
    """)
    op.execute("""
        CREATE TRIGGER bench_count_event BEFORE INSERT ON bench_counter_events
        FOR EACH ROW EXECUTE FUNCTION bench_count_event()
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER bench_count_event ON bench_counter_events")
    op.execute("DROP FUNCTION bench_count_event()")
    drop_tables("bench_counter_events", "bench_counters")
