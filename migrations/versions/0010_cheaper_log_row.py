"""A cheaper transaction-log row: no statement trigger, the transaction id its primary key.

The design note: ``migrations/README.md``.
"""
from activedb.migration_ops import sql_steps

revision = "0010_cheaper_log_row"
down_revision = "0009_dead_letter_originals"

# The line of activedb_capture_sequence() (0004_capture) that handles activedb's own flush, before and after.
DROPPED = "RETURN NULL;   -- activedb's own flush: its changes were dropped (activedb_capture_own_writes)"
DROPS = "DELETE FROM activedb_capture_changes WHERE xid = NEW.xid; RETURN NULL;   -- activedb's own flush"


def _own_flush_line(old: str, new: str) -> str:
    """Replace ``old`` by ``new`` in the sequencer's definition (its SECURITY DEFINER and search_path kept)."""
    old, new = old.replace("'", "''"), new.replace("'", "''")
    return f"""
DO $body$
DECLARE
    definition text := pg_get_functiondef('activedb_capture_sequence()'::regprocedure);
BEGIN
    IF position('{old}' IN definition) = 0 THEN
        RAISE EXCEPTION 'activedb_capture_sequence() was changed outside activedb''s migrations: restore the '
            'definition revision 0004_capture created (or revision 0010''s, on a downgrade), then run the '
            'migration again';
    END IF;
    EXECUTE replace(definition, '{old}', '{new}');
END
$body$;
"""


UPGRADE = """
DROP TRIGGER activedb_capture_own_writes ON activedb_transaction_log;
ALTER TABLE activedb_transaction_log DROP CONSTRAINT activedb_transaction_log_pkey,
    DROP CONSTRAINT activedb_transaction_log_transaction_id_key, ADD PRIMARY KEY (transaction_id);
""" + _own_flush_line(DROPPED, DROPS)

DOWNGRADE = """
ALTER TABLE activedb_transaction_log DROP CONSTRAINT activedb_transaction_log_pkey,
    ADD CONSTRAINT activedb_transaction_log_pkey PRIMARY KEY (id),
    ADD CONSTRAINT activedb_transaction_log_transaction_id_key UNIQUE (transaction_id);
CREATE TRIGGER activedb_capture_own_writes AFTER INSERT ON activedb_transaction_log
    FOR EACH STATEMENT EXECUTE FUNCTION activedb_capture_own_writes();
""" + _own_flush_line(DROPS, DROPPED)

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
