"""Split batches of the Spark scale-out path: the policy each query declared for a partition that fails for
good, and every such failure with how it was settled (the states it goes through: ``migrations/README.md``).
"""
from activedb.migration_ops import sql_steps

revision = "0008_split_batches"
down_revision = "0007_lineage"

UPGRADE = """
CREATE TABLE activedb_split_queries (
    query_id text PRIMARY KEY,
    query_name text NOT NULL,
    partitions integer NOT NULL CHECK (partitions > 0),
    on_partition_failure text NOT NULL CHECK (on_partition_failure IN ('forward', 'compensate')),
    declared_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE activedb_split_failures (
    query_id text NOT NULL,
    batch_id bigint NOT NULL,
    partition integer NOT NULL,
    partitions integer NOT NULL,
    policy text NOT NULL CHECK (policy IN ('forward', 'compensate')),
    state text NOT NULL CHECK (state IN ('pending completion', 'completed', 'compensating', 'compensated')),
    error text NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    settled_at timestamptz,
    compensated integer,
    PRIMARY KEY (query_id, batch_id, partition)
);
"""

DOWNGRADE = """
DROP TABLE activedb_split_failures;
DROP TABLE activedb_split_queries;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
