"""The stream engines' saved state stored without compression (a batch's buffer chunk is rewritten every batch).

The design note: ``migrations/README.md``.
"""
from activedb.migration_ops import sql_steps

revision = "0011_uncompressed_stream_state"
down_revision = "0010_cheaper_log_row"

upgrade, downgrade = sql_steps(
    "ALTER TABLE activedb_stream_state ALTER COLUMN value SET STORAGE EXTERNAL;",
    "ALTER TABLE activedb_stream_state ALTER COLUMN value SET STORAGE EXTENDED;",
)
