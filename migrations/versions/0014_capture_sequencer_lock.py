"""Capturing commits take their turn on a table lock only activedb's role may take, not an advisory lock any
role may hold.

The design note: ``migrations/README.md``.
"""
from activedb.migration_ops import sql_steps

revision = "0014_capture_sequencer_lock"
down_revision = "0013_capture_trust"

ADVISORY = "PERFORM pg_advisory_xact_lock(1633968739, 0);"
TABLE_LOCK = "LOCK TABLE {schema}.activedb_capture_sequencer IN SHARE ROW EXCLUSIVE MODE;"


def _sequencer_line(old: str, new: str, revision_hint: str) -> str:
    """Replace the line ``old`` by ``new`` in the sequencer's definition (its SECURITY DEFINER, search_path and
    privileges kept); ``{schema}`` in either is activedb's schema, quoted by the server."""
    old, new = old.replace("'", "''"), new.replace("'", "''")
    return f"""
DO $body$
DECLARE
    schema text := quote_ident(current_schema());
    definition text := pg_get_functiondef('activedb_capture_sequence()'::regprocedure);
    old text := replace('{old}', '{{schema}}', schema);
BEGIN
    IF position(old IN definition) = 0 THEN
        RAISE EXCEPTION 'activedb_capture_sequence() was changed outside activedb''s migrations: restore the '
            'definition revision {revision_hint} created, then run the migration again';
    END IF;
    EXECUTE replace(definition, old, replace('{new}', '{{schema}}', schema));
END
$body$;
"""


# SHARE ROW EXCLUSIVE conflicts with itself (one capturing commit at a time, as before) and not with the
# readers of the change and commit tables; the table has no rows and no other use.  LOCK TABLE needs a
# privilege on the table, which no other role has; a failed attempt to read it releases its lock at once.
UPGRADE = """
CREATE TABLE activedb_capture_sequencer ();
COMMENT ON TABLE activedb_capture_sequencer IS
    'no rows: activedb_capture_sequence() locks it so that capturing commits take their turn (revision 0014)';
""" + _sequencer_line(ADVISORY, TABLE_LOCK, "0013_capture_trust")

DOWNGRADE = _sequencer_line(TABLE_LOCK, ADVISORY, "0014_capture_sequencer_lock") + """
DROP TABLE activedb_capture_sequencer;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
