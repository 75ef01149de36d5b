"""The stream engines' saved state as ``json`` (kept as the text written) instead of ``jsonb``.

The design note: ``migrations/README.md``.
"""
from activedb.migration_ops import sql_steps

revision = "0012_stream_state_as_json"
down_revision = "0011_uncompressed_stream_state"

upgrade, downgrade = sql_steps(
    "ALTER TABLE activedb_stream_state ALTER COLUMN value TYPE json USING value::json;"
    " ALTER TABLE activedb_stream_state ALTER COLUMN value SET STORAGE EXTERNAL;",
    "ALTER TABLE activedb_stream_state ALTER COLUMN value TYPE jsonb USING value::jsonb;"
    " ALTER TABLE activedb_stream_state ALTER COLUMN value SET STORAGE EXTERNAL;",
)
