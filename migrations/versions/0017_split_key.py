"""The key a scale-out query partitions its batches by: ``activedb_split_queries`` records the key column and its
Spark type beside the partition count, so that a batch re-run after a restart in the same number of partitions
but by another key is refused, not split otherwise. The design note: ``migrations/README.md``."""
from activedb.migration_ops import sql_steps

revision = "0017_split_key"
down_revision = "0016_rule_priority_as_number"

UPGRADE = """
ALTER TABLE activedb_split_queries ADD COLUMN partition_key text, ADD COLUMN partition_key_type text;
"""

DOWNGRADE = """
ALTER TABLE activedb_split_queries DROP COLUMN partition_key_type, DROP COLUMN partition_key;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
