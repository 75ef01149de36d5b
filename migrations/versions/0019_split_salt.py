"""The salt a scale-out run splits its batches with: ``activedb_split_queries.salt``, chosen once at the run's first
batch and recorded with its partition count and key, so that every batch of the run — and a batch Spark re-runs after
a restart — lands in the partitions the recorded salt gives. The design note: ``migrations/README.md``."""
from activedb.migration_ops import sql_steps

revision = "0019_split_salt"
down_revision = "0018_ledger_row_count"

UPGRADE = """
ALTER TABLE activedb_split_queries ADD COLUMN salt integer;
"""

DOWNGRADE = """
ALTER TABLE activedb_split_queries DROP COLUMN salt;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
