"""Lineage of atomic batches (activedb.atomic): which batches each top-level transaction consumed and
produced, which transactions triggered it, what undoes it, and which transaction compensated it.

Table by table: ``migrations/README.md``.
"""
from activedb.migration_ops import sql_steps

revision = "0007_lineage"
down_revision = "0006_ingested_events"

UPGRADE = """
CREATE TABLE activedb_lineage (
    transaction_id text PRIMARY KEY,
    name text,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    parents text[] NOT NULL DEFAULT '{}',
    compensates text UNIQUE,
    notes jsonb NOT NULL DEFAULT '[]'
);
CREATE INDEX activedb_lineage_parents ON activedb_lineage USING gin (parents);
CREATE INDEX activedb_lineage_recorded_at ON activedb_lineage (recorded_at);

CREATE TABLE activedb_lineage_batches (
    transaction_id text NOT NULL REFERENCES activedb_lineage ON DELETE CASCADE,
    role char(1) NOT NULL CHECK (role IN ('C', 'P')),
    query_id text NOT NULL,
    batch_id text NOT NULL,
    PRIMARY KEY (transaction_id, role, query_id, batch_id)
);
CREATE INDEX activedb_lineage_batches_by_batch ON activedb_lineage_batches (query_id, batch_id, role);

CREATE TABLE activedb_lineage_undo (
    transaction_id text NOT NULL REFERENCES activedb_lineage ON DELETE CASCADE,
    seq integer NOT NULL,
    table_name text NOT NULL,
    row_key jsonb NOT NULL,
    before_image jsonb,
    after_image jsonb,
    PRIMARY KEY (transaction_id, seq)
);
CREATE INDEX activedb_lineage_undo_by_row ON activedb_lineage_undo (table_name, row_key);
"""

DOWNGRADE = """
DROP TABLE activedb_lineage_undo;
DROP TABLE activedb_lineage_batches;
DROP TABLE activedb_lineage;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
