"""Change capture (activedb.capture): the change table, commit order, consumer positions.

The tables, functions and triggers it installs: ``migrations/README.md``.
"""
from activedb.migration_ops import sql_steps

revision = "0004_capture"
down_revision = "0003_removed_rules_and_replays"

# pg_advisory_xact_lock(SEQUENCER_LOCK_CLASS, 0) orders capturing commits; consumers lock
# (SEQUENCER_LOCK_CLASS + 1, hash of their name).  0x61646263 is "adbc".
SEQUENCER_LOCK_CLASS = 0x61646263

UPGRADE = f"""
CREATE TABLE activedb_capture_tables (
    table_name text PRIMARY KEY,
    enabled_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE activedb_capture_changes (
    xid xid8 NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    table_name text NOT NULL,
    operation char(1) NOT NULL CHECK (operation IN ('I', 'U', 'D')),
    old_row jsonb,
    new_row jsonb,
    first_of_transaction boolean NOT NULL DEFAULT false,
    PRIMARY KEY (xid, id)
);

CREATE SEQUENCE activedb_capture_position;

CREATE TABLE activedb_capture_commits (
    position bigint PRIMARY KEY,
    xid xid8 NOT NULL UNIQUE,
    committed_at timestamptz NOT NULL
);

CREATE TABLE activedb_capture_consumers (
    name text PRIMARY KEY,
    position bigint NOT NULL DEFAULT 0,
    change_id bigint NOT NULL DEFAULT 0,
    handled bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The row trigger of every captured table.  activedb.capture_xact (transaction-local) is the xid of
-- the transaction once it captured a change, or 'activedb' once activedb's own flush claimed it.
CREATE FUNCTION activedb_capture_row() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $body$
DECLARE
    state text := current_setting('activedb.capture_xact', true);
    xact xid8;
    first boolean;
BEGIN
    IF state = 'activedb' THEN
        RETURN NULL;
    END IF;
    xact := pg_current_xact_id();
    first := state IS DISTINCT FROM xact::text;
    IF first THEN
        PERFORM set_config('activedb.capture_xact', xact::text, true);
    END IF;
    INSERT INTO activedb_capture_changes (xid, table_name, operation, old_row, new_row, first_of_transaction)
    VALUES (xact, TG_TABLE_NAME, left(TG_OP, 1),
            CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
            CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END,
            first);
    RETURN NULL;
END
$body$;

-- Deferred to the commit of a capturing transaction (fired by its first change row): take the
-- sequencer lock, which is held until the commit is visible, so positions follow commit order.
CREATE FUNCTION activedb_capture_sequence() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $body$
BEGIN
    IF current_setting('activedb.capture_xact', true) IS DISTINCT FROM NEW.xid::text THEN
        RETURN NULL;   -- activedb's own flush: its changes were dropped (activedb_capture_own_writes)
    END IF;
    PERFORM pg_advisory_xact_lock({SEQUENCER_LOCK_CLASS}, 0);
    INSERT INTO activedb_capture_commits (position, xid, committed_at)
    VALUES (nextval('activedb_capture_position'), NEW.xid, clock_timestamp());
    PERFORM pg_notify('activedb_capture', 'commit');
    RETURN NULL;
END
$body$;

CREATE CONSTRAINT TRIGGER activedb_capture_sequence
    AFTER INSERT ON activedb_capture_changes
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.first_of_transaction)
    EXECUTE FUNCTION activedb_capture_sequence();

-- activedb's flush inserts its transaction-log row after its write set: a transaction that does is
-- activedb's own, and its changes already raised in-process events.
CREATE FUNCTION activedb_capture_own_writes() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $body$
BEGIN
    IF current_setting('activedb.capture_xact', true) = pg_current_xact_id()::text THEN
        DELETE FROM activedb_capture_changes WHERE xid = pg_current_xact_id();
    END IF;
    PERFORM set_config('activedb.capture_xact', 'activedb', true);
    RETURN NULL;
END
$body$;

CREATE TRIGGER activedb_capture_own_writes
    AFTER INSERT ON activedb_transaction_log
    FOR EACH STATEMENT EXECUTE FUNCTION activedb_capture_own_writes();

-- SECURITY DEFINER functions resolve names in this schema only (never the writer's search_path).
DO $body$
DECLARE
    path text := quote_ident(current_schema()) || ', pg_temp';
BEGIN
    EXECUTE 'ALTER FUNCTION activedb_capture_row() SET search_path = ' || path;
    EXECUTE 'ALTER FUNCTION activedb_capture_sequence() SET search_path = ' || path;
    EXECUTE 'ALTER FUNCTION activedb_capture_own_writes() SET search_path = ' || path;
END
$body$;
"""

DOWNGRADE = """
DO $body$
DECLARE
    captured text;
BEGIN
    FOR captured IN SELECT table_name FROM activedb_capture_tables LOOP
        EXECUTE 'DROP TRIGGER IF EXISTS activedb_capture ON ' || quote_ident(captured);
    END LOOP;
END
$body$;
DROP TRIGGER activedb_capture_own_writes ON activedb_transaction_log;
DROP FUNCTION activedb_capture_own_writes();
DROP TABLE activedb_capture_consumers;
DROP TABLE activedb_capture_commits;
DROP SEQUENCE activedb_capture_position;
DROP TABLE activedb_capture_changes;
DROP FUNCTION activedb_capture_sequence();
DROP FUNCTION activedb_capture_row();
DROP TABLE activedb_capture_tables;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
