"""A cheaper transaction-log row: no statement trigger, the transaction id its primary key.

The design note: ``migrations/README.md``.
"""
from activedb.migration_ops import sql_steps

revision = "0010_cheaper_log_row"
down_revision = "0009_dead_letter_originals"


def _sequencer(own_flush: str) -> str:
    """``activedb_capture_sequence()`` with ``own_flush`` run for activedb's own flush (README, 0004)."""
    return f"""
CREATE OR REPLACE FUNCTION activedb_capture_sequence() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $body$
BEGIN
    IF current_setting('activedb.capture_xact', true) IS DISTINCT FROM NEW.xid::text THEN
        {own_flush}RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(1633968739, 0);
    INSERT INTO activedb_capture_commits (position, xid, committed_at)
    VALUES (nextval('activedb_capture_position'), NEW.xid, clock_timestamp());
    PERFORM pg_notify('activedb_capture', 'commit');
    RETURN NULL;
END
$body$;
DO $body$ BEGIN
    EXECUTE 'ALTER FUNCTION activedb_capture_sequence() SET search_path = ' || quote_ident(current_schema()) || ', pg_temp';
END $body$;
"""


UPGRADE = """
DROP TRIGGER activedb_capture_own_writes ON activedb_transaction_log;
ALTER TABLE activedb_transaction_log DROP CONSTRAINT activedb_transaction_log_pkey,
    DROP CONSTRAINT activedb_transaction_log_transaction_id_key, ADD PRIMARY KEY (transaction_id);
""" + _sequencer("DELETE FROM activedb_capture_changes WHERE xid = NEW.xid;\n        ")

DOWNGRADE = """
ALTER TABLE activedb_transaction_log DROP CONSTRAINT activedb_transaction_log_pkey,
    ADD CONSTRAINT activedb_transaction_log_pkey PRIMARY KEY (id),
    ADD CONSTRAINT activedb_transaction_log_transaction_id_key UNIQUE (transaction_id);
CREATE TRIGGER activedb_capture_own_writes AFTER INSERT ON activedb_transaction_log
    FOR EACH STATEMENT EXECUTE FUNCTION activedb_capture_own_writes();
""" + _sequencer("")

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
