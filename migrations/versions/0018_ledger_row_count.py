"""How many rows each batch was delivered with: ``activedb_ingestion_ledger.row_count``, so that a batch delivered
again with another number of rows (a source re-fed with other batch boundaries) is refused, not skipped while the
batches after it apply rows a second time. The design note: ``migrations/README.md``."""
from activedb.migration_ops import sql_steps

revision = "0018_ledger_row_count"
down_revision = "0017_split_key"

UPGRADE = """
ALTER TABLE activedb_ingestion_ledger ADD COLUMN row_count bigint;
"""

DOWNGRADE = """
ALTER TABLE activedb_ingestion_ledger DROP COLUMN row_count;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
