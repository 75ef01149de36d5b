"""The outbox's SQL: writing records (their events as exact JSON), claiming them, marking them done or
failed, reading them back (``pending`` → ``done``, or ``failed`` → ``pending`` again on a retry).  Design note: the package's
``README.md`` ("Recovery and several processes").

Every function takes the connection it runs on and never commits: the callers decide which PostgreSQL
transaction a statement belongs to.  Marking done or failed requires ``owner = me AND status =
'pending'`` of every record marked.  :class:`LivenessLock` holds the lock that keeps this process's
records its own.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping, Sequence

import sqlalchemy as sa

from activedb.errors import INVALID_TEXT_REPRESENTATION, OutboxError, RecordsTakenOver, sqlstate_of
from activedb.events import Event, EventKind
from activedb.store import (Catalog, close_detached, detached_connection, exact_json, from_exact_json, in_one_statement,
                            statement_spans)

logger = logging.getLogger("activedb.outbox")

TABLE = "activedb_outbox"
STATUSES = ("pending", "done", "failed")
ERROR_LIMIT = 4000      # characters of an error kept in a failed record

#: The most records one statement inserts; the most bytes of their JSON together is the store's
#: :data:`~activedb.store.STATEMENT_BYTES`: a flush's records beyond either bound go out in more statements, one after
#: another in the same transaction (:func:`~activedb.store.statement_spans`).  A statement's records travel as one JSON
#: document, one value, which PostgreSQL takes at most 1 GB of.  Read at each insert (a test may lower it).
RECORDS_PER_STATEMENT = 10_000

#: The most bytes of JSON one record may take (its event, encoded, most of it).  A record is not cut — its event is
#: its rule's input — and one beyond PostgreSQL's 1 GB for a value could never be inserted: :func:`insert` refuses a
#: record larger than this with an ``OutboxError`` before any statement, and the trigger's tree aborts with it.  Well
#: below 1 GB (the statement's document adds its own bytes).  Read at each insert (a test may lower it).
RECORD_BYTES = 256 * 2**20


@dataclass
class NewRecord:
    """A record to insert (its id drawn from the table's sequence beforehand: ``Outbox.draw_ids``).  Not frozen: one
    is made per recorded firing in its trigger's flush, and a frozen one's fields cost a call each."""

    id: int
    rule: str
    coupling: str
    event: dict[str, object]
    chain: list[str]
    trigger_id: str
    trigger_log_id: str | None
    trigger_outcome: str          # committed | aborted


# A rule run from a record must see the event it would have seen in memory: every field goes through
# ``exact_json`` (``event.ts`` stays a ``datetime``, a composite key a tuple, a string with a NUL character
# comes back with its NUL).
def encode_event(event: Event) -> dict[str, object]:
    """``event`` as one JSON object (every field)."""
    return {"kind": event.kind.value, "source": exact_json(event.source), "key": exact_json(event.key),
            "old": exact_json(event.old), "new": exact_json(event.new), "payload": exact_json(event.payload),
            "ts": exact_json(event.ts), "transaction": exact_json(event.transaction)}


def decode_event(data: Mapping[str, object]) -> Event:
    return Event(EventKind(str(data["kind"])), from_exact_json(data["source"]), key=from_exact_json(data["key"]),
                 old=from_exact_json(data["old"]), new=from_exact_json(data["new"]),
                 payload=from_exact_json(data["payload"]) or {}, ts=from_exact_json(data["ts"]),
                 transaction=from_exact_json(data["transaction"]))


# One statement for a flush's records, up to their bounds (``RECORDS_PER_STATEMENT``, ``STATEMENT_BYTES``): a JSON
# array of them, one object a record, made by one call of the C encoder (an array per column cost the driver a Python
# call per element); ``jsonb_to_recordset`` turns a record's ``chain``, a JSON array, into ``text[]`` in order.
_INSERT = (
    "INSERT INTO activedb_outbox (id, rule, coupling, event, chain, trigger_id, trigger_log_id, trigger_outcome, "
    "owner) "
    "SELECT v.id, v.rule, v.coupling, v.event, v.chain, v.trigger_id, v.trigger_log_id, v.trigger_outcome, %s "
    "FROM jsonb_to_recordset(%s::jsonb) "
    "AS v(id bigint, rule text, coupling text, event jsonb, chain text[], trigger_id text, trigger_log_id text, "
    "trigger_outcome text) WHERE " + Catalog.STILL_DRAWN)


# One encoder (not one a call), no cycle check (a dict insert and delete per container; ``exact_json``'s output
# has no cycle).
_ENCODER = json.JSONEncoder(allow_nan=False, check_circular=False, separators=(",", ":"))


def insert(connection: sa.Connection, records: Sequence[NewRecord], owner: int, sequence: str, storage: int) -> bool:
    """Insert ``records`` as pending, owned by ``owner``: one statement, one round trip, within
    :data:`RECORDS_PER_STATEMENT` records and :data:`~activedb.store.STATEMENT_BYTES` of JSON — beyond, as many
    statements as the bounds take, one after another on ``connection`` (its transaction's: all or nothing).  False if
    ``sequence``, which gave their ids with ``storage``, was reset since (``Catalog.STILL_DRAWN``): nothing inserted,
    or, by a reset between two of the statements, a part — the caller's transaction must roll back.  (Every value is
    plain JSON: the event went through ``exact_json``; a text PostgreSQL cannot hold — a NUL, a lone surrogate — is
    refused by it as in any text column.)"""
    if not records:
        return True
    highest = max(record.id for record in records)
    # (ASCII: the encoder escapes the rest, so the document's characters are its bytes)
    document = _ENCODER.encode([record.__dict__ for record in records])
    # (A document within ``RECORD_BYTES`` holds no record beyond it; one beyond ``STATEMENT_BYTES`` is split anyway.)
    if len(document) <= RECORD_BYTES and in_one_statement(len(records), len(document), RECORDS_PER_STATEMENT):
        documents = [document]
    else:       # (each record encoded again, alone, for its size; its text joined into its statement's document)
        encoded = [encode_record(record) for record in records]
        documents = ["[" + ",".join(encoded[start:stop]) + "]"
                     for start, stop in statement_spans(list(map(len, encoded)), RECORDS_PER_STATEMENT)]
    inserted = 0
    for part in documents:
        inserted += connection.exec_driver_sql(_INSERT, (owner, part, storage, highest, sequence)).rowcount
    return inserted == len(records)


def encode_record(record: NewRecord) -> str:
    """``record``'s JSON alone (ASCII); :func:`too_large`'s ``OutboxError`` if it is beyond :data:`RECORD_BYTES`."""
    text = _ENCODER.encode(record.__dict__)
    if len(text) > RECORD_BYTES:
        raise too_large(record, len(text))
    return text


def too_large(record: NewRecord, size: int) -> OutboxError:
    """The refusal of ``record``, ``size`` bytes of JSON, beyond :data:`RECORD_BYTES`."""
    event = record.event
    described = Event(EventKind(str(event["kind"])), from_exact_json(event["source"]),
                      key=from_exact_json(event["key"]), transaction=from_exact_json(event["transaction"])).describe()
    return OutboxError(
        f"detached rule {record.rule!r} fired on {described}: its outbox record is {size} bytes of JSON, more than the "
        f"{RECORD_BYTES} an outbox record may take (RECORD_BYTES, activedb/outbox/_records.py; PostgreSQL takes at "
        f"most 1 GB in a value), so it is not recorded: a trigger's transaction that is committing aborts with "
        f"nothing of it written, and a firing of one that already ended fails for good — the event of a detached-family firing is recorded whole: put a reference to the data in "
        f"it (a row's key, a file's path) rather than the data, and let the rule read the data")


# Fails unless it marked every record: no row count to read, so it can ride in another statement's round trip
# (``GroupMarks``).  It then casts ``_TAKEN_OVER`` to an integer, and the error (22P02, quoting that text) is told
# by ``taken_over`` from any other statement's failure in the same round trip (a rule's write refused with an error
# of its own must not pass for a take-over).  The CASE depends on the rows: never folded.  The ids travel as one
# array literal and the errors as one JSON object by id (the driver's array dumper makes a Python call per element).
_TAKEN_OVER = "activedb outbox: records taken over"
_FINISH = (
    "WITH marked AS (UPDATE activedb_outbox AS o SET status = CASE WHEN f.error IS NULL THEN 'done' ELSE 'failed' "
    "END, finished_at = now(), attempts = o.attempts + 1, error = f.error, transaction_id = %(log_id)s "
    "FROM (SELECT id, CAST(%(errors)s AS jsonb) ->> CAST(id AS text) FROM unnest(CAST(%(ids)s AS bigint[])) AS id) "
    "AS f(id, error) WHERE o.id = f.id AND o.owner = %(owner)s AND o.status = 'pending' RETURNING 1) "
    "SELECT CAST(CASE WHEN count(*) = %(count)s THEN '1' ELSE '" + _TAKEN_OVER + "' END AS integer) FROM marked")


def finishing(owner: int, *, done: Sequence[int] = (), failed: Sequence[tuple[int, str]] = (),
              log_id: str | None = None) -> tuple[str, dict[str, object]]:
    """The statement (driver SQL, parameters) that marks ``done`` records done and ``failed`` ``(id, error)``
    records failed; it fails, and :func:`taken_over` names why, if any of them is no longer a pending record of
    ``owner`` (the caller's transaction must then roll back)."""
    ids = "{" + ",".join(map(str, [*done, *(record_id for record_id, _ in failed)])) + "}"
    errors = json.dumps({str(record_id): error[:ERROR_LIMIT] for record_id, error in failed})
    return _FINISH, {"ids": ids, "errors": errors, "owner": owner, "log_id": log_id, "count": len(done) + len(failed)}


def taken_over(error: BaseException) -> RecordsTakenOver | None:
    """What a failure of :func:`finishing`'s statement means (None: something else)."""
    diag = getattr(getattr(error, "orig", error), "diag", None)     # (the server's message, not the statement's text)
    if (sqlstate_of(error) != INVALID_TEXT_REPRESENTATION
            or _TAKEN_OVER not in str(getattr(diag, "message_primary", None))):
        return None
    return RecordsTakenOver("outbox records this process ran were taken over by another process (or finished) "
                            "meanwhile; nothing of this group was written — the other process runs them")


class LivenessLock:
    """This process's liveness lock: the session-level advisory lock on ``owner``, held on a connection of
    its own (detached from the pool, autocommit) for the life of the process.  Thread-safe: ``_mutex``
    protects the connection and ``_wanted`` (SQL under it; a leaf)."""

    def __init__(self, engine: sa.Engine, owner: int):
        self._engine, self._owner = engine, owner
        self._mutex = threading.Lock()
        self._connection: Any = None
        self._wanted = False        # taken and not released since: the lock is to be held (also while it is not)

    def take(self) -> None:
        with self._mutex:
            self._wanted = True
            if self._connection is not None:
                return
            driver = detached_connection(self._engine)   # ours for the life of the process, not the pool's
            driver.execute("SELECT pg_advisory_lock(%s)", (self._owner,))
            self._connection = driver

    def check(self) -> None:
        """Re-take the lock if its connection broke, or if an attempt to take it again failed (records may have
        been taken over meanwhile; finishing them then fails with ``RecordsTakenOver`` and the other process runs
        them).  Nothing to do once released."""
        with self._mutex:
            if not self._wanted:
                return
            if self._connection is not None:
                try:
                    self._connection.execute("SELECT 1")
                    return
                except Exception:
                    logger.warning("outbox: the liveness connection broke; taking the lock again")
        self.release()
        self.take()

    def release(self) -> None:
        with self._mutex:
            self._wanted = False
            connection, self._connection = self._connection, None
        if connection is not None:
            close_detached(connection)      # (unlocked first: other processes see this one gone at once)


# An owner is alive while some session holds its liveness lock: a session-level advisory lock on the bigint
# ``owner``, which pg_locks shows as classid = high half, objid = low half, objsubid = 1.  (Reading pg_locks,
# unlike trying the lock, never makes a concurrent claimer see a dead owner as alive.)
_CLAIM = sa.text("""
WITH dead AS (
    SELECT owner FROM (SELECT DISTINCT owner FROM activedb_outbox
                       WHERE status = 'pending' AND owner IS NOT NULL AND owner <> :me) AS owners
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_locks AS l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::bigint = (owners.owner >> 32) AND l.objid::bigint = (owners.owner & 4294967295))
), claimable AS (
    SELECT id FROM activedb_outbox
    WHERE status = 'pending' AND rule = ANY(:rules)
      AND (owner IS NULL OR owner IN (SELECT owner FROM dead)
           OR (:mine AND owner = :me AND NOT id = ANY(CAST(:known AS bigint[]))))
    ORDER BY id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE activedb_outbox AS o SET owner = :me
FROM claimable WHERE o.id = claimable.id
RETURNING o.id, o.rule, o.coupling, o.event, o.chain, o.attempts
""")


def claim(connection: sa.Connection, me: int, rules: Iterable[str], limit: int,
          mine_but: Collection[int] | None = None) -> list[Any]:
    """Claim up to ``limit`` pending records of ``rules`` nobody alive owns (unowned, or owned by a process
    whose liveness lock no session holds); they become ``me``'s.  Rows another claimer is claiming are
    skipped.  ``mine_but``: also ``me``'s own pending records but those ids (after a claim whose outcome is
    unknown: ``Outbox.recover``)."""
    rows = connection.execute(_CLAIM, {"me": me, "rules": list(rules), "limit": limit, "mine": mine_but is not None,
                                       "known": sorted(mine_but or ())}).all()
    return sorted(rows, key=lambda row: row.id)


def release(connection: sa.Connection, me: int, ids: Sequence[int]) -> int:
    """Give up ``me``'s claim of the pending records ``ids`` (they become unowned: the next claimer whose rules
    include theirs claims them); returns how many."""
    return connection.execute(sa.text(
        "UPDATE activedb_outbox SET owner = NULL WHERE id = ANY(:ids) AND owner = :me AND status = 'pending'"),
        {"ids": list(ids), "me": me}).rowcount


def logged(connection: sa.Connection, log_id: str) -> bool:
    """Whether the transaction logged as ``log_id`` committed (its ``activedb_transaction_log`` row exists)."""
    return connection.execute(sa.text("SELECT 1 FROM activedb_transaction_log WHERE transaction_id = :id"),
                              {"id": log_id}).first() is not None


def still_owned(connection: sa.Connection, me: int, ids: Sequence[int]) -> set[int]:
    """The ids among ``ids`` that are still pending records of ``me``."""
    rows = connection.execute(sa.text(
        "SELECT id FROM activedb_outbox WHERE id = ANY(:ids) AND owner = :me AND status = 'pending'"),
        {"ids": list(ids), "me": me}).scalars()
    return set(rows)


def counts(connection: sa.Connection) -> dict[str, dict[str, int]]:
    """``{status: {rule: count}}``."""
    result: dict[str, dict[str, int]] = {status: {} for status in STATUSES}
    for status, rule, count in connection.execute(sa.text(
            "SELECT status, rule, count(*) FROM activedb_outbox GROUP BY status, rule")):
        result.setdefault(status, {})[rule] = count
    return result


def failed(connection: sa.Connection, limit: int, ids: Sequence[int] | None = None) -> list[Any]:
    """The failed records (``ids``, or all), the most recently failed first, at most ``limit``."""
    where = "status = 'failed'" + ("" if ids is None else " AND id = ANY(:ids)")
    return list(connection.execute(sa.text(
        "SELECT id, rule, coupling, event, trigger_id, trigger_log_id, trigger_outcome, attempts, error, "
        f"created_at, finished_at FROM activedb_outbox WHERE {where} ORDER BY finished_at DESC, id DESC "
        "LIMIT :limit"),
        {"limit": limit} if ids is None else {"limit": limit, "ids": list(ids)}).all())


def prune_done(connection: sa.Connection, seconds: float) -> int:
    """Delete the done records finished more than ``seconds`` ago; returns how many."""
    return connection.exec_driver_sql(
        "DELETE FROM activedb_outbox WHERE status = 'done' AND finished_at < now() - make_interval(secs => %s)",
        (seconds,)).rowcount


def retry(connection: sa.Connection, ids: Sequence[int] | None) -> int:
    """Failed records (``ids``, or all) become pending and unowned; returns how many."""
    where = "status = 'failed'" + ("" if ids is None else " AND id = ANY(:ids)")
    return connection.execute(sa.text(
        f"UPDATE activedb_outbox SET status = 'pending', owner = NULL, finished_at = NULL WHERE {where}"),
        {} if ids is None else {"ids": list(ids)}).rowcount
