"""Batches in progress, as the process running each reports it (``activedb status``), and the position of a dead
letter written ahead of its batch (a rule past its deadline). The design note: ``migrations/README.md``."""
from activedb.migration_ops import sql_steps

revision = "0015_batches_in_progress"
down_revision = "0014_capture_sequencer_lock"

UPGRADE = """
CREATE TABLE activedb_batches_in_progress (
    query_id text PRIMARY KEY,
    query_name text NOT NULL,
    batch_id bigint NOT NULL,
    rows integer NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    started_at timestamptz NOT NULL,
    reported_at timestamptz NOT NULL,
    deadline_at timestamptz,
    firing_rule text,
    firing_event text,
    firing_started_at timestamptz
);

ALTER TABLE activedb_dead_letters ADD COLUMN position integer;
"""

DOWNGRADE = """
ALTER TABLE activedb_dead_letters DROP COLUMN position;
DROP TABLE activedb_batches_in_progress;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
