"""The SQL of change capture that is not in activedb's migrations (``0004_capture``, ``0013_capture_trust``,
``0014_capture_sequencer_lock``, ``0020_capture_consumer_ids``): installing and removing the per-table trigger
(:func:`install_statements`, run by ``db.capture(table)`` or ``enable_capture``), and the statements consumers and the
status run.  Every function takes what it runs on; none opens a connection.
"""

from __future__ import annotations

import sqlalchemy as sa
from psycopg import sql

from activedb.errors import UnknownTable

#: The per-table row trigger's name (one per captured table).
TRIGGER_NAME = "activedb_capture"
#: The channel the commit sequencer notifies (payload ``commit``) and stopping consumers use (``stop``).
CHANNEL = "activedb_capture"
#: Advisory-lock class of the commit sequencer until revision ``0014_capture_sequencer_lock`` (since then a
#: table lock on ``activedb_capture_sequencer``); consumers take ``pg_try_advisory_lock(class + 1, id)``, ``id``
#: their name's row's in :data:`CONSUMERS` (revision ``0020_capture_consumer_ids``; until then a hash of the name,
#: which two names could share).
SEQUENCER_LOCK_CLASS = 0x61646263
CONSUMER_LOCK_CLASS = SEQUENCER_LOCK_CLASS + 1
#: Advisory-lock class a consumer standing by holds *shared* on the same id, in its listener session, until it leads
#: or stops (``pg_locks`` then lists who waits: ``db.capture.status()``'s ``standby``).
STANDBY_LOCK_CLASS = SEQUENCER_LOCK_CLASS + 2
#: Advisory-lock class of a name's registration, keyed by a hash of the name (``_position.registration_key``): a
#: consumer making sure of its name's row holds it *shared* for that transaction; ``drop_consumer`` of a name that has
#: no row holds it exclusive for its own, so that no consumer registers the name before the drop has committed.  Of two
#: names of one hash, the registration of one only waits for the drop of the other; they never share a row or a lead.
REGISTRATION_LOCK_CLASS = SEQUENCER_LOCK_CLASS + 3

TABLES = "activedb_capture_tables"
CHANGES = "activedb_capture_changes"
COMMITS = "activedb_capture_commits"
CONSUMERS = "activedb_capture_consumers"
SEQUENCER = "activedb_capture_sequencer"
#: Capture's own tables, which cannot be captured (``_INSTALL`` refuses them).
OWN_TABLES = (TABLES, CHANGES, COMMITS, CONSUMERS, SEQUENCER)


def check_table_name(name: object) -> str:
    """``name`` if it can name a PostgreSQL table (a non-empty string without NUL), else :class:`UnknownTable`."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise UnknownTable(f"not a table name: {name!r}; name the table to capture by a non-empty string without "
                           f"NUL characters, as the table is called in PostgreSQL")
    return name


# The table a DO block below works on travels as the value of this setting (a DO block takes no parameters):
# the name is a bind parameter, and PostgreSQL quotes it (quote_ident, a regclass) wherever SQL needs it.
# No % in them: offline SQL of a dialect with the pyformat paramstyle would double it.
_ARGUMENT = "activedb.capture_table"
# How many of the changes _REMOVE dropped were pending (a transaction-local setting: DO returns nothing).
_DROPPED = "activedb.capture_dropped_pending"
_PASS_TABLE = f"SELECT set_config('{_ARGUMENT}', :table, false)"

_INSTALL = f"""
DO $body$
DECLARE
    captured text := current_setting('{_ARGUMENT}');
    target regclass;
    function regprocedure := to_regprocedure('activedb_capture_row()');
    registry regclass := to_regclass('{TABLES}');
    who text := quote_ident(current_user);
    named text;
    missing text[] := '{{}}';
    grants text[] := '{{}}';
BEGIN
    PERFORM set_config('{_ARGUMENT}', '', false);
    IF to_regclass('{CHANGES}') IS NULL OR to_regprocedure('activedb_capture_row()') IS NULL
       OR NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('{CHANGES}') AND attname = 'table_oid'
                      AND NOT attisdropped) THEN
        RAISE EXCEPTION 'activedb''s capture tables are missing (revision 0004_capture) or older than revision '
                        '0013_capture_trust'
            USING HINT = 'run activedb''s own migrations first: activedb db upgrade, or activedb.connect(), '
                         'which upgrades; an application revision that enables capture needs them';
    END IF;
    target := to_regclass(quote_ident(captured));
    IF target IS NULL THEN
        RAISE EXCEPTION USING MESSAGE = 'no table ' || quote_ident(captured) || ' to capture in the schemas of '
            'the search path (' || current_setting('search_path') || ')',
            HINT = 'create the table first (in an earlier revision)';
    END IF;
    -- (its trigger on capture's own tables would record its own rows: on the change table it fires itself, and
    -- every captured write fails; on the consumers' table each position update is a change to consume)
    IF target IN ({", ".join(f"to_regclass('{own}')" for own in OWN_TABLES)}) THEN
        RAISE EXCEPTION USING MESSAGE = target::text || ' is one of change capture''s own tables, which cannot '
            'be captured (their rows are the capture: capturing them would record its own changes)',
            HINT = 'capture the application''s tables';
    END IF;
    -- What capturing takes, all of it said at once with the GRANTs that give it (PostgreSQL names one refusal).
    SELECT quote_ident(n.nspname) || '.' || quote_ident(r.relname) INTO named
    FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = target;
    IF NOT has_table_privilege(target, 'TRIGGER') THEN
        missing := missing || ('TRIGGER on table ' || named);
        grants := grants || ('GRANT TRIGGER ON TABLE ' || named || ' TO ' || who || ';');
    END IF;
    IF NOT has_function_privilege(function, 'EXECUTE') THEN
        SELECT quote_ident(n.nspname) || '.' || quote_ident(p.proname) || '()' INTO named
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = function;
        missing := missing || ('EXECUTE on function ' || named);
        grants := grants || ('GRANT EXECUTE ON FUNCTION ' || named || ' TO ' || who || ';');
    END IF;
    IF NOT (has_table_privilege(registry, 'SELECT') AND has_table_privilege(registry, 'INSERT')
            AND has_table_privilege(registry, 'UPDATE') AND has_table_privilege(registry, 'DELETE')) THEN
        SELECT quote_ident(n.nspname) || '.' || quote_ident(r.relname) INTO named
        FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = registry;
        missing := missing || ('SELECT, INSERT, UPDATE, DELETE on table ' || named);
        grants := grants || ('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE ' || named || ' TO ' || who || ';');
    END IF;
    IF cardinality(missing) > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'role ' || who || ' lacks what capturing ' || quote_ident(captured) || ' takes: '
                      || array_to_string(missing, '; '),
            HINT = 'capture tables as activedb''s role (the owner of its tables), or have the owners (of the table, '
                   'of activedb''s objects) run: ' || array_to_string(grants, ' ')
                   || ' (a role that may capture is trusted with which tables are captured)';
    END IF;
    EXECUTE 'CREATE OR REPLACE TRIGGER {TRIGGER_NAME} AFTER INSERT OR UPDATE OR DELETE ON ' || target::text
            || ' FOR EACH ROW EXECUTE FUNCTION activedb_capture_row()';
    -- (a table renamed since it was captured: its old name no longer denotes it, and it is captured under the new
    -- one from now on — its pending changes too, which are recorded by oid)
    DELETE FROM {TABLES} WHERE table_oid = target AND table_name <> captured;
    INSERT INTO {TABLES} (table_name, table_oid) VALUES (captured, target)
    ON CONFLICT (table_name) DO UPDATE SET table_oid = EXCLUDED.table_oid;
END
$body$"""



def _owner_only(relation: str) -> str:
    """PL/pgSQL refusing, before anything changes, to drop the capture trigger of ``relation`` (an expression of type
    regclass or oid) for a role that does not own it — DROP TRIGGER takes ownership (or a superuser), where creating it
    took only TRIGGER — saying who may and what to do instead of PostgreSQL's "must be owner of relation"."""
    return f"""
    IF EXISTS (SELECT FROM pg_trigger WHERE tgrelid = {relation} AND tgname = '{TRIGGER_NAME}' AND NOT tgisinternal)
       AND NOT pg_has_role((SELECT relowner FROM pg_class WHERE oid = {relation}), 'USAGE') THEN
        SELECT quote_ident(n.nspname) || '.' || quote_ident(r.relname), quote_ident(pg_get_userbyid(r.relowner))
        INTO named, owner FROM pg_class r JOIN pg_namespace n ON n.oid = r.relnamespace WHERE r.oid = {relation};
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = 'table ' || named || ' is owned by role ' || owner || ': only its owner or a superuser may drop '
                      'its capture trigger (capturing it took only the TRIGGER privilege), and role '
                      || quote_ident(current_user) || ' is neither',
            HINT = 'stop capturing it as role ' || owner || ' or as a superuser (db.capture.remove, activedb capture '
                   'disable, or disable_capture in a revision run as that role); nothing was changed';
    END IF;"""


# Works whether or not activedb's capture tables (still) exist, before revision 0013 (by name) and after
# (by oid), and whether or not the table does.  Only the owner of the table (or a superuser) may run it
# (_owner_only).
_REMOVE = f"""
DO $body$
DECLARE
    captured text := current_setting('{_ARGUMENT}');
    target regclass := to_regclass(quote_ident(captured));
    registered oid;
    named text;
    owner text;
    pending bigint := 0;
BEGIN
    PERFORM set_config('{_ARGUMENT}', '', false);
    PERFORM set_config('{_DROPPED}', '0', true);
    IF target IS NOT NULL THEN{_owner_only("target")}
        EXECUTE 'DROP TRIGGER IF EXISTS {TRIGGER_NAME} ON ' || target::text;
    END IF;
    IF to_regclass('{CHANGES}') IS NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('{CHANGES}') AND attname = 'table_oid'
               AND NOT attisdropped) THEN
        DELETE FROM {TABLES} WHERE table_name = captured RETURNING table_oid INTO registered;
        -- (the table registered under the name, renamed since: its trigger went with it)
        IF registered IS DISTINCT FROM target AND EXISTS (SELECT FROM pg_class WHERE oid = registered) THEN{_owner_only("registered")}
            EXECUTE 'DROP TRIGGER IF EXISTS {TRIGGER_NAME} ON ' || registered::regclass::text;
        END IF;
        -- (pending: a change some consumer has not handled — every one when no consumer is registered; counted
        -- after the triggers are dropped, so no writer adds one uncounted)
        SELECT count(*) INTO pending FROM {CHANGES} ch JOIN {COMMITS} c ON c.xid = ch.xid
        WHERE ch.table_oid IN (registered, target)
          AND (NOT EXISTS (SELECT FROM {CONSUMERS})
               OR EXISTS (SELECT FROM {CONSUMERS} k WHERE (c.position, ch.id) > (k.position, k.change_id)));
        DELETE FROM {CHANGES} WHERE table_oid IN (registered, target);
    ELSE
        SELECT count(*) INTO pending FROM {CHANGES} WHERE table_name = captured;
        DELETE FROM {CHANGES} WHERE table_name = captured;
        DELETE FROM {TABLES} WHERE table_name = captured;
    END IF;
    DELETE FROM {COMMITS} c WHERE NOT EXISTS (SELECT FROM {CHANGES} ch WHERE ch.xid = c.xid);
    PERFORM set_config('{_DROPPED}', pending::text, true);
END
$body$"""


#: After :func:`remove_statements`, in its transaction: the pending changes they dropped (NULL or '' if none ran).
DROPPED_PENDING = f"SELECT current_setting('{_DROPPED}', true)"


def install_statements(table: str) -> list[sa.TextClause]:
    """What capturing ``table`` (a name in the search path) takes: the row trigger on that table and its
    registry row with the table's oid (idempotent; a table created again gets its new oid, a table renamed is
    captured under its new name instead of its old one)."""
    return [sa.text(_PASS_TABLE).bindparams(table=check_table_name(table)), sa.text(_INSTALL)]


def remove_statements(table: str) -> list[sa.TextClause]:
    """What removing capture from ``table`` takes: the trigger (on the table of that name, and on the table
    registered under it if renamed since), the registry row, and the table's captured changes not yet pruned (with
    the commit rows left without changes); how many of those were pending is then :data:`DROPPED_PENDING` in the
    transaction.  Idempotent; works whether or not activedb's capture tables (still) exist and whether or not the
    table does."""
    return [sa.text(_PASS_TABLE).bindparams(table=check_table_name(table)), sa.text(_REMOVE)]


# A registered table's trigger counts only on the table registered (its oid) while the name still denotes it (a name
# that denotes no table: false, not NULL).
CAPTURED_TABLES = f"""
SELECT t.table_name, t.enabled_at,
       coalesce(t.table_oid = to_regclass(quote_ident(t.table_name)), false)
       AND EXISTS (SELECT FROM pg_trigger g
                   WHERE g.tgrelid = t.table_oid AND g.tgname = '{TRIGGER_NAME}' AND NOT g.tgisinternal)
       AS trigger_installed
FROM {TABLES} t ORDER BY t.table_name"""

# What the name denotes (pg_class.relkind: r table, p partitioned table, v view, m materialized view, …; NULL: none),
# found as _INSTALL finds it.
RELATION_KIND = "SELECT relkind FROM pg_class WHERE oid = to_regclass(quote_ident(:name))"

# (A name already registered spends no id: the identity's next value is drawn only for a row to insert.)
REGISTER_CONSUMER = f"""
INSERT INTO {CONSUMERS} (name) SELECT :name WHERE NOT EXISTS (SELECT FROM {CONSUMERS} WHERE name = :name)
ON CONFLICT (name) DO NOTHING"""
#: The id of a consumer name's row: the second key of the name's advisory locks (the leader's, the standby's).  Ids
#: are unique and never given to another row, so no two names share a lock.
CONSUMER_ID = f"SELECT id FROM {CONSUMERS} WHERE name = :name"
#: A registration's lock (:data:`REGISTRATION_LOCK_CLASS`), shared, for the transaction: taken before
#: :data:`REGISTER_CONSUMER`.
LOCK_REGISTRATION = f"SELECT pg_advisory_xact_lock_shared({REGISTRATION_LOCK_CLASS}, :key)"
#: Whether the row of id ``%s`` still holds name ``%s`` (psycopg's placeholders: run on the listener connection),
#: asked once its locks are taken: a row dropped before that (``drop_consumer``) is no longer the name's.
STILL_REGISTERED = f"SELECT EXISTS (SELECT FROM {CONSUMERS} WHERE id = %s AND name = %s)"

#: What a consumer does to capture's tables (positions; reading and pruning changes and commits; the registry).
CONSUMER_PRIVILEGES = ((CONSUMERS, ("SELECT", "INSERT", "UPDATE")), (CHANGES, ("SELECT", "DELETE")),
                       (COMMITS, ("SELECT", "DELETE")), (TABLES, ("SELECT",)))
#: What ``db.capture.status()`` reads of them.
STATUS_PRIVILEGES = ((CONSUMERS, ("SELECT",)), (CHANGES, ("SELECT",)), (COMMITS, ("SELECT",)), (TABLES, ("SELECT",)))
#: What ``db.capture.prune()`` (:data:`PRUNABLE`, :data:`PRUNE_CHANGES`, :data:`PRUNE_COMMITS`) does to them.
PRUNE_PRIVILEGES = ((CONSUMERS, ("SELECT",)), (CHANGES, ("SELECT", "DELETE")), (COMMITS, ("SELECT", "DELETE")))


def privileges_held(needed: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    """A statement of one row: per table of ``needed`` that exists, its schema-qualified name (``name_<i>``; NULL:
    no such table) and whether the session's role holds every privilege listed for it (``held_<i>``); and the
    role's name, quoted (``role``)."""
    return "SELECT quote_ident(current_user) AS role, " + ", ".join(
        f"(SELECT quote_ident(n.nspname) || '.' || quote_ident(r.relname) FROM pg_class r JOIN pg_namespace n "
        f"ON n.oid = r.relnamespace WHERE r.oid = to_regclass('{table}')) AS name_{index}, "
        + " AND ".join(f"coalesce(has_table_privilege(to_regclass('{table}'), '{privilege}'), true)"
                       for privilege in privileges) + f" AS held_{index}"
        for index, (table, privileges) in enumerate(needed))

READ_POSITION = f"SELECT position, change_id FROM {CONSUMERS} WHERE name = :name"

# Advance a consumer's position only from where its batch started (compare and set, under the row lock
# the UPDATE takes until COMMIT): no row back means another process moved it.
ADVANCE_POSITION = f"""
UPDATE {CONSUMERS} SET position = :position, change_id = :change_id, handled = handled + :handled,
       failed = failed + :failed, updated_at = now()
WHERE name = :name AND position = :start_position AND change_id = :start_change_id
RETURNING name"""

# Where the next batch ends: the last of the next :limit changes after (position, change_id), in commit
# order then statement order, and the tables they belong to (one row; none when nothing is pending): per
# table oid, the name it is captured as (NULL: not a captured table) and its schema-qualified name quoted by
# the server (NULL: dropped) and its columns as they are now (NULL: dropped), as a JSON array of
# [oid, name, relation, columns].
# Every step follows an index, whatever the size of the change table: commits by position (at most
# :limit + 1 of them — each has at least one change, and the first may be the one the position is in,
# already handled), each commit's changes by (xid, id).
BATCH_BOUNDS = f"""
WITH next AS (
    SELECT c.position, ch.id, ch.table_oid
    FROM (SELECT position, xid FROM {COMMITS} WHERE position >= :position ORDER BY position LIMIT :limit + 1) c
    CROSS JOIN LATERAL (
        SELECT id, table_oid FROM {CHANGES}
        WHERE xid = c.xid AND id > CASE WHEN c.position = :position THEN :change_id ELSE 0 END
        ORDER BY id LIMIT :limit) ch
    ORDER BY c.position, ch.id
    LIMIT :limit)
SELECT last.position, last.id,
       (SELECT json_agg(json_build_array(o.table_oid, t.table_name, (
                   SELECT quote_ident(s.nspname) || '.' || quote_ident(r.relname)
                   FROM pg_class r JOIN pg_namespace s ON s.oid = r.relnamespace WHERE r.oid = o.table_oid), (
                   SELECT json_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
                   WHERE a.attrelid = o.table_oid AND a.attnum > 0 AND NOT a.attisdropped)))
        FROM (SELECT DISTINCT table_oid FROM next) o LEFT JOIN {TABLES} t ON t.table_oid = o.table_oid) AS tables
FROM (SELECT position, id FROM next ORDER BY position DESC, id DESC LIMIT 1) AS last"""


# The changes of commit ``c`` inside a batch's range, as one index range on (xid, id) per commit ("OFFSET 0"
# keeps the planner from flattening the per-commit lookup into a scan of the whole change table).
_ID_RANGE = """id > CASE WHEN c.position = :first_position THEN :first_change ELSE 0 END
      AND id <= CASE WHEN c.position = :last_position THEN :last_change ELSE 9223372036854775807 END"""


def changes_of(relation: str | None, columns: list[str] | None) -> str:
    """The changes of the table ``:table_oid`` in a batch's range, with their old and new rows as the table's
    own row type: PostgreSQL turns the captured ``jsonb`` back into typed columns (``o_<i>``, ``n_<i>`` for
    each of ``columns``), so an event's rows hold the Python values a read through activedb gives.
    ``relation`` is the table's name as the server quoted it (``BATCH_BOUNDS``); ``columns`` None: the rows as
    captured, ``jsonb`` (``old_row``, ``new_row``: a table that no longer exists or is not captured)."""
    rows, joins = ", ch.old_row, ch.new_row", ""
    if columns is not None and relation is not None:
        quoted = [sql.Identifier(name).as_string() for name in columns]
        rows = ", " + ", ".join([f"o.{name} AS o_{index}" for index, name in enumerate(quoted)]
                                + [f"n.{name} AS n_{index}" for index, name in enumerate(quoted)])
        joins = f"""
LEFT JOIN LATERAL jsonb_populate_record(NULL::{relation}, ch.old_row) o ON ch.old_row IS NOT NULL
LEFT JOIN LATERAL jsonb_populate_record(NULL::{relation}, ch.new_row) n ON ch.new_row IS NOT NULL"""
    return f"""
SELECT c.position, ch.id, ch.xid::text AS xid, ch.operation, c.committed_at{rows}
FROM {COMMITS} c
CROSS JOIN LATERAL (
    SELECT id, xid, operation, old_row, new_row FROM {CHANGES}
    WHERE xid = c.xid AND table_oid = :table_oid AND {_ID_RANGE}
    OFFSET 0) ch{joins}
WHERE c.position BETWEEN :first_position AND :last_position
ORDER BY c.position, ch.id"""


# Commits every consumer has handled completely and older than the retention: their changes and commit rows go.
# A consumer at (position, change_id) has handled every commit below its position, and the commit at it once no
# change of that commit has a larger id (a batch may end inside a commit; a commit row is written at its COMMIT,
# when its changes are all there, so none comes later).  No consumer registered: nothing goes (min is NULL).
# Their age is compared in seconds, never ``now()`` minus the retention: a retention of "for ever"
# (``timedelta.max``, infinity) is no timestamp PostgreSQL can compute.
PRUNABLE = f"""
SELECT c.position, c.xid::text AS xid FROM {COMMITS} c
WHERE c.position <= (SELECT min(position) FROM {CONSUMERS})
  AND NOT EXISTS (SELECT FROM {CONSUMERS} k JOIN {CHANGES} ch ON ch.xid = c.xid AND ch.id > k.change_id
                  WHERE k.position = c.position)
  AND extract(epoch FROM now() - c.committed_at) > CAST(:retention_seconds AS double precision)
ORDER BY c.position
LIMIT :limit"""

PRUNE_CHANGES = f"DELETE FROM {CHANGES} WHERE xid = ANY(CAST(:xids AS xid8[]))"
PRUNE_COMMITS = f"DELETE FROM {COMMITS} WHERE position = ANY(:positions)"

POSITIONS = "activedb_capture_position"
# The position the sequencer handed out last (the commits may be pruned, or dropped when capture stops): the
# sequence's, when the role may read it (the function is called only then: a refusal would end the statement), else
# the largest a commit row or a consumer holds.
LATEST_POSITION = f"""
SELECT greatest(CASE WHEN has_sequence_privilege(to_regclass('{POSITIONS}'), 'SELECT')
                     THEN pg_sequence_last_value(to_regclass('{POSITIONS}')) END,
                (SELECT max(position) FROM {COMMITS}), (SELECT max(position) FROM {CONSUMERS}), 0)"""

# Per table: its captured name, or for changes of a table that is not captured, what its oid names now.
BACKLOG = f"""
SELECT coalesce(t.table_name, ch.table_oid::regclass::text) AS table_name, count(*) AS changes,
       count(DISTINCT c.position) AS transactions, min(c.committed_at) AS oldest
FROM {COMMITS} c JOIN {CHANGES} ch ON ch.xid = c.xid LEFT JOIN {TABLES} t ON t.table_oid = ch.table_oid
WHERE c.position >= :position AND (c.position > :position OR ch.id > :change_id)
GROUP BY 1"""

CONSUMER_ROWS = f"""
SELECT name, position, change_id, handled, failed, created_at, updated_at FROM {CONSUMERS} ORDER BY name"""

RETAINED = f"SELECT count(*) FROM {CHANGES}"


def _consumer_locks(lock_class: int) -> str:
    """A FROM item: the advisory locks of ``lock_class`` granted on a consumer's id (``l``) in this database — one of
    another database on the server is another lock —, each with that consumer's row (``k``)."""
    return f"""pg_locks l JOIN {CONSUMERS} k ON l.objid = k.id::oid
    AND l.locktype = 'advisory' AND l.classid = {lock_class} AND l.objsubid = 2 AND l.granted
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


# The sessions that lead consumer names now: per name, the backend holding its lock.
LEADERS = f"SELECT k.name, l.pid FROM {_consumer_locks(CONSUMER_LOCK_CLASS)}"

# The sessions of consumers standing by now: per name, each backend, the name its session has and where it
# connects from (NULL: a Unix-domain socket, or a role that may not see it).
STANDBYS = f"""
SELECT k.name, l.pid, a.application_name, host(a.client_addr) AS client_address
FROM {_consumer_locks(STANDBY_LOCK_CLASS)} LEFT JOIN pg_stat_activity a ON a.pid = l.pid ORDER BY l.pid"""
