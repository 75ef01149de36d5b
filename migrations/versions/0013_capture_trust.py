"""Capture's trust model: changes recorded by table oid, only through activedb's trigger, by functions no other
role may attach; activedb's own-write mark honoured only for a role that may delete captured changes anyway.

The design note: ``migrations/README.md``; the trust model: ``activedb/capture/README.md``.
"""
from activedb.migration_ops import sql_steps

revision = "0013_capture_trust"
down_revision = "0012_stream_state_as_json"

SEQUENCER_LOCK_CLASS = 0x61646263       # as in 0004_capture

# The functions, as format() strings run in a DO block: %1$I is activedb's schema (current_schema() of the
# migration), so every table they touch is schema-qualified by the server's quoting, and their search_path
# is pg_catalog then pg_temp only: no name they use can resolve to an object another role created.  A
# literal % is %% here.
#
# A session is *trusted* when its role (session_user: SET ROLE does not change it) may delete captured
# changes: it could remove them anyway, so its bookkeeping in the setting activedb.capture_xact is believed
# — 'activedb' (activedb's own flush: nothing of the transaction is captured) or the transaction's id (its
# first change is recorded).  Any other session may set that setting too, so for it the setting means
# nothing: its first change is found in the change table itself.
_TRUSTED = "has_table_privilege(session_user, %2$L::regclass, 'DELETE')"

_ROW = f"""
CREATE OR REPLACE FUNCTION %1$I.activedb_capture_row() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    state text;
    xact xid8;
    first boolean;
BEGIN
    IF TG_NAME <> 'activedb_capture' OR TG_WHEN <> 'AFTER' OR TG_LEVEL <> 'ROW' THEN
        RAISE EXCEPTION 'activedb_capture_row() runs only as the trigger activedb_capture that activedb installs '
                        '(AFTER ... FOR EACH ROW); trigger %% on %% is not', TG_NAME, TG_RELID::regclass
            USING HINT = 'drop that trigger; capture a table with db.capture(table) or enable_capture(op, table)';
    END IF;
    IF {_TRUSTED} THEN
        state := current_setting('activedb.capture_xact', true);
        IF state = 'activedb' THEN
            RETURN NULL;      -- activedb's own flush: its changes already raised in-process events
        END IF;
        xact := pg_current_xact_id();
        first := state IS DISTINCT FROM xact::text;
        IF first THEN
            PERFORM set_config('activedb.capture_xact', xact::text, true);
        END IF;
    ELSE
        xact := pg_current_xact_id();
        first := NOT EXISTS (SELECT FROM %1$I.activedb_capture_changes WHERE xid = xact);
    END IF;
    INSERT INTO %1$I.activedb_capture_changes (xid, table_oid, operation, old_row, new_row, first_of_transaction)
    VALUES (xact, TG_RELID, left(TG_OP, 1),
            CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
            CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END,
            first);
    RETURN NULL;
END
$body$"""

_SEQUENCE = f"""
CREATE OR REPLACE FUNCTION %1$I.activedb_capture_sequence() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $body$
BEGIN
    IF current_setting('activedb.capture_xact', true) = 'activedb' AND {_TRUSTED} THEN
        DELETE FROM %1$I.activedb_capture_changes WHERE xid = NEW.xid; RETURN NULL;   -- activedb's own flush
    END IF;
    PERFORM pg_advisory_xact_lock({SEQUENCER_LOCK_CLASS}, 0);
    INSERT INTO %1$I.activedb_capture_commits (position, xid, committed_at)
    VALUES (nextval(%3$L::regclass), NEW.xid, clock_timestamp());
    PERFORM pg_notify('activedb_capture', 'commit');
    RETURN NULL;
END
$body$"""


def _functions(*definitions: str) -> str:
    formats = ", ".join(f"$format${definition}$format$" for definition in definitions)
    return f"""
DO $install$
DECLARE
    schema text := current_schema();
    definition text;
BEGIN
    FOREACH definition IN ARRAY ARRAY[{formats}] LOOP
        EXECUTE format(definition, schema, format('%I.activedb_capture_changes', schema),
                       format('%I.activedb_capture_position', schema));
    END LOOP;
END
$install$;
"""


UPGRADE = """
ALTER TABLE activedb_capture_tables ADD COLUMN table_oid oid UNIQUE;
UPDATE activedb_capture_tables SET table_oid = to_regclass(quote_ident(table_name));
ALTER TABLE activedb_capture_changes ADD COLUMN table_oid oid;
UPDATE activedb_capture_changes ch
   SET table_oid = coalesce((SELECT t.table_oid FROM activedb_capture_tables t WHERE t.table_name = ch.table_name), 0);
ALTER TABLE activedb_capture_changes ALTER COLUMN table_oid SET NOT NULL, DROP COLUMN table_name;
DROP FUNCTION activedb_capture_own_writes();
""" + _functions(_ROW, _SEQUENCE) + """
REVOKE ALL ON FUNCTION activedb_capture_row(), activedb_capture_sequence() FROM PUBLIC;
"""

# The downgrade restores the functions exactly as revisions 0004_capture and 0010_cheaper_log_row left them
# (0010's downgrade finds its line in the sequencer), executable by PUBLIC again.
_ROW_0004 = """
CREATE OR REPLACE FUNCTION activedb_capture_row() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $body$
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
"""

_SEQUENCE_0010 = f"""
CREATE OR REPLACE FUNCTION activedb_capture_sequence() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $body$
BEGIN
    IF current_setting('activedb.capture_xact', true) IS DISTINCT FROM NEW.xid::text THEN
        DELETE FROM activedb_capture_changes WHERE xid = NEW.xid; RETURN NULL;   -- activedb's own flush
    END IF;
    PERFORM pg_advisory_xact_lock({SEQUENCER_LOCK_CLASS}, 0);
    INSERT INTO activedb_capture_commits (position, xid, committed_at)
    VALUES (nextval('activedb_capture_position'), NEW.xid, clock_timestamp());
    PERFORM pg_notify('activedb_capture', 'commit');
    RETURN NULL;
END
$body$;
"""

_OWN_WRITES_0004 = """
CREATE FUNCTION activedb_capture_own_writes() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $body$
BEGIN
    IF current_setting('activedb.capture_xact', true) = pg_current_xact_id()::text THEN
        DELETE FROM activedb_capture_changes WHERE xid = pg_current_xact_id();
    END IF;
    PERFORM set_config('activedb.capture_xact', 'activedb', true);
    RETURN NULL;
END
$body$;
"""

DOWNGRADE = """
ALTER TABLE activedb_capture_changes ADD COLUMN table_name text;
UPDATE activedb_capture_changes ch
   SET table_name = coalesce((SELECT t.table_name FROM activedb_capture_tables t WHERE t.table_oid = ch.table_oid),
                             (SELECT c.relname FROM pg_class c WHERE c.oid = ch.table_oid), '');
ALTER TABLE activedb_capture_changes ALTER COLUMN table_name SET NOT NULL, DROP COLUMN table_oid;
ALTER TABLE activedb_capture_tables DROP COLUMN table_oid;
""" + _ROW_0004 + _SEQUENCE_0010 + _OWN_WRITES_0004 + """
DO $body$
DECLARE
    path text := quote_ident(current_schema()) || ', pg_temp';
BEGIN
    EXECUTE 'ALTER FUNCTION activedb_capture_row() SET search_path = ' || path;
    EXECUTE 'ALTER FUNCTION activedb_capture_sequence() SET search_path = ' || path;
    EXECUTE 'ALTER FUNCTION activedb_capture_own_writes() SET search_path = ' || path;
END
$body$;
GRANT EXECUTE ON FUNCTION activedb_capture_row(), activedb_capture_sequence() TO PUBLIC;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
