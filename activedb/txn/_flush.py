"""The top-level commit: one PostgreSQL transaction for the whole tree, with commit participants.

Its steps, what it validates and why the result is serializable although it runs at READ COMMITTED:
``README.md``, "What the flush validates, and why the result is serializable".  PostgreSQL's
serialization failures are retried (bounded, jittered back-off, re-validating); a broken connection is
settled through the transaction log; any other database error names the SQLSTATE, never the parameters.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import TYPE_CHECKING, AbstractSet, Iterable, Mapping, Sequence

import sqlalchemy as sa

from activedb.errors import (DISK_FULL, DISK_FULL_ADVICE, LOCK_NOT_AVAILABLE, PROGRAM_LIMIT_EXCEEDED, DatabaseError,
                             DatabaseUnavailable, DiskFull, DuplicateKey, Failure,
                             SerializationConflict, ServerDiskFull, classify, disk_full_panic, own_table_missing,
                             reflected_table_changed, sqlstate_of)
from activedb.store import (EntryKind, IsolationLevel, Key, TableInfo, apply_write_set, fetch_rows,
                            is_connection_failure, jsonable, same_image)
from activedb.txn._rowlocks import LOCK_TIMEOUT, RowLocks
from activedb.txn._view import scan_rows

if TYPE_CHECKING:  # pragma: no cover
    import datetime

    from activedb.store import Catalog, Entry, Row
    from activedb.txn._participants import CommitParticipant
    from activedb.txn._tree import Transaction

    Writes = Mapping[Row, Entry]                       # the root's write set
    Reads = Mapping[Row, "dict[str, object] | None"]   # images relied on (None: no row)
    Scans = list[tuple[str, object, "dict[Key, dict[str, object]]"]]   # (table, where, rows seen)
    Locked = Mapping[Row, "dict[str, object] | None"]   # rows read for update -> image when locked

logger = logging.getLogger("activedb.transaction")

_RETRIED = (Failure.SERIALIZATION_CONFLICT, Failure.DEADLOCK)      # SQLSTATE 40001 and 40P01 (classify)


def flush(root: "Transaction") -> None:
    """Commit ``root``'s tree to PostgreSQL.  Precondition: ``root`` is top-level, COMMITTING, every child
    ended, its holds retained.  Raises (nothing written) or returns (everything written)."""
    manager = root.manager
    catalog = manager.catalog
    with root._mutex:
        writes, reads, scans = dict(root._writes), dict(root._db_reads), list(root._scans)
        participants = list(root._participants)
    for participant in participants:
        participant.before_flush(root)
    names = {row[0] for row in writes} | {row[0] for row in reads} | {scan[0] for scan in scans}
    infos = {name: catalog.table_info(name) for name in names}
    needs_predicates = bool(scans) or any(image is None for image in reads.values())
    isolation = IsolationLevel.SERIALIZABLE if needs_predicates else IsolationLevel.READ_COMMITTED
    rowlocks = RowLocks.of(root, create=False)
    locked = dict(rowlocks.rows) if rowlocks is not None else {}
    held = rowlocks.take_connection() if rowlocks is not None else None
    if held is not None and needs_predicates:
        # SERIALIZABLE cannot start inside the held transaction: let its locks go, lock again below.  (A session
        # lost meanwhile let them go already: the rows are validated all the same.)
        try:
            held.rollback()
        except sa.exc.DBAPIError:
            held.invalidate()
        held.close()
        held = None
    recorder = manager.recorder
    if held is not None:
        if not recorder:
            # With a history recorded, the lock manager keeps the rows until the flush is recorded (Rule 3, after
            # ``record_flush``): handed over, another tree's read would return at the COMMIT and could be recorded
            # before the flush, as read from the writer before this one (README "Reads for update").
            rowlocks.hand_over()  # type: ignore[union-attr]  # (held: taken from it)
        _flush_in_held(root, held, infos, writes, reads, scans, participants, locked)
    else:
        _flush_with_retries(root, isolation, infos, writes, reads, scans, participants, locked)
    if recorder:
        recorder.record_flush(root.id, writes)


def _write_all(root: Transaction, connection: sa.Connection,
               infos: Mapping[str, TableInfo], writes: Writes, reads: Reads, scans: Scans,
               participants: list[CommitParticipant], locked: Locked, *, held: bool) -> None:
    """Every step of the flush inside ``connection``'s open transaction (the module docstring's 2–5).  Unless a
    participant acts at ``about_to_commit`` (``acts_before_commit``), the write set's last statement carries the
    COMMIT (``apply_write_set(commit=True)``): the caller's own commit then finds nothing open.  The participants'
    statements along (``CommitParticipant.statements_along``) go in that statement's round trip, before it; a
    failure one of them claims (``Along.refused``) is raised instead of the database error."""
    catalog = root.manager.catalog
    # Rows read and then written are locked FOR UPDATE at the validation, like rows read for update: two
    # flushes of such a row queue there (the second sees the first's commit and fails its check at once)
    # instead of both taking FOR SHARE and deadlocking when both UPDATE it (PostgreSQL's detector only
    # breaks that after deadlock_timeout).
    validated = {row: image for row, image in reads.items() if not (held and row in locked)}
    for row in reads.keys() - validated.keys():
        # Held since it was locked, so current; but a node may have relied on an earlier committed image (a plain
        # read while another tree's flush held the row, README "Reads for update"), which is compared here.
        if not same_image(reads[row], locked[row]):
            raise SerializationConflict(
                f"commit of {root.id}: row {row[1]!r} of {row[0]!r} was changed by another transaction after this "
                f"transaction read it; nothing was written — re-run the transaction (Database.run(fn, retries=N) does)")
    _validate(root, connection, infos, validated, scans, locked.keys() | (reads.keys() & writes.keys()))
    _check_generated_keys(catalog, connection, infos, writes, root.began_at)
    for participant in participants:
        participant.write(root, connection)
    acting = [participant for participant in participants if participant.acts_before_commit(root)]
    along = [statement for participant in participants for statement in participant.statements_along(root)]
    try:
        _apply(catalog, connection, infos, writes, _log_row(root, writes), commit=not acting,
               leading=[(statement.sql, statement.parameters) for statement in along])
    except sa.exc.DBAPIError as error:
        for statement in along:
            claimed = statement.refused(error) if statement.refused is not None else None
            if claimed is not None:
                raise claimed from error
        raise
    for participant in acting:
        participant.about_to_commit(root, connection)


def _flush_in_held(root: Transaction, connection: sa.Connection,
                   infos: Mapping[str, TableInfo], writes: Writes, reads: Reads, scans: Scans,
                   participants: list[CommitParticipant], locked: Locked) -> None:
    """The flush inside the transaction that holds the tree's rows read for update (``_rowlocks``): those rows
    are the current committed ones already (locked since they were read), the rest is validated as usual.
    A serialization failure cannot be retried on this transaction: the tree is re-run instead.

    The connection is in autocommit at the driver (``RowLocks``); the COMMIT rides with the write set's last
    statement as in every flush (``_write_all``)."""
    try:
        try:
            _write_all(root, connection, infos, writes, reads, scans, participants, locked, held=True)
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
        finally:
            root.manager.catalog.idle.give_back(connection)
    except sa.exc.OperationalError as error:
        # (Never SERIALIZABLE, so no NOWAIT: the validation's own lock timeout is a SerializationConflict raised by
        # ``_validate``; a 55P03 here is another statement's, the database's: a DatabaseError, as in any flush.)
        sqlstate = getattr(error.orig, "sqlstate", None)
        if classify(error) in _RETRIED:
            raise SerializationConflict(
                f"commit of {root.id} failed on concurrent updates by another process (SQLSTATE {sqlstate}); "
                f"nothing was written — re-run the transaction (Database.run(fn, retries=N) does)"
            ) from error
        _raise_database_error(root, error)
    except sa.exc.DBAPIError as error:
        _raise_database_error(root, error)


def _flush_with_retries(root: Transaction, isolation: IsolationLevel,
                        infos: Mapping[str, TableInfo], writes: Writes, reads: Reads, scans: Scans,
                        participants: list[CommitParticipant], locked: Locked) -> None:
    manager = root.manager
    attempt = 0
    while True:
        attempt += 1
        try:
            with manager.catalog.connect(isolation) as connection:
                with manager.server_waits.holding(connection, root.id), connection.begin():
                    _write_all(root, connection, infos, writes, reads, scans, participants, locked, held=False)
            return
        except sa.exc.OperationalError as error:
            # 55P03 at SERIALIZABLE: a row locked elsewhere, NOWAIT (retried).  (The validation's own lock timeout
            # is a SerializationConflict raised by ``_validate``; any other is the database's: a DatabaseError.)
            retried = classify(error) in _RETRIED or (sqlstate_of(error) == LOCK_NOT_AVAILABLE
                                                      and isolation is IsolationLevel.SERIALIZABLE)
            if retried and attempt <= manager.flush_retries:      # (flush_retries re-runs: that many more attempts)
                # Jittered back-off between retries of the flush (not used to order threads).
                time.sleep(random.uniform(0.5, 1.5) * min(0.2, 0.002 * 2 ** attempt))
                continue
            if retried:
                raise SerializationConflict(
                    f"commit of {root.id} failed {attempt} times on concurrent updates by another process; "
                    f"nothing was written — re-run the transaction (Database.run(fn, retries=N) does)"
                ) from error
            _raise_database_error(root, error)   # returns only if the log proves the commit happened
            return
        except sa.exc.DBAPIError as error:
            _raise_database_error(root, error)
            return


def _validate(root: "Transaction", connection: sa.Connection, infos: Mapping[str, TableInfo], reads: Reads,
              scans: Scans, for_update: AbstractSet[Row] = frozenset()) -> None:
    """Re-read every relied-on image and compare; rows the tree read for update are locked ``FOR UPDATE``
    first, table by table in name order (so two flushes take them in the same order), the rest ``FOR SHARE``."""
    predicate_tables = sorted({scan[0] for scan in scans}
                              | {name for (name, _), image in reads.items() if image is None})
    if predicate_tables:
        # Absence and predicates: row locks cannot hold them, and SERIALIZABLE orders this flush only
        # against other SERIALIZABLE transactions, not against a READ COMMITTED flush of another process
        # that inserts blindly (a phantom).  So take the tables first, before any row: writers of them that
        # are committing finish first (and are seen by the checks below), the next ones wait for COMMIT.
        # SHARE ROW EXCLUSIVE conflicts with itself, so two such flushes of one table cannot both lock it
        # and then deadlock on their writes.
        # (Driver SQL: the preparer doubles a name's ``%`` for the driver already, which ``sa.text`` would double again.)
        preparer = connection.dialect.identifier_preparer
        connection.exec_driver_sql(f"LOCK TABLE {', '.join(preparer.quote(name) for name in predicate_tables)} "
                                   f"IN SHARE ROW EXCLUSIVE MODE")
    # Holding those table locks, this flush must not wait for a row: a writer holding that row (its own
    # flush, between its row locks and its first write of one of these tables) waits for the table lock, and
    # PostgreSQL would break the cycle only after its deadlock_timeout (a second).  So its row locks do not
    # wait (NOWAIT): a row locked by another transaction fails the attempt with SQLSTATE 55P03, and the flush is
    # tried again (``_flush_with_retries``) after the other has committed — as a wait would have, without the cycle.
    nowait = bool(predicate_tables)
    owners = root.manager.row_lock_owners
    by_table: dict[tuple[int, str], list[Key]] = {}
    for (table_name, key) in reads:
        by_table.setdefault((0 if (table_name, key) in for_update else 1, table_name), []).append(key)
    for (shared, table_name), keys in sorted(by_table.items()):
        # A row another tree of this process holds locked in PostgreSQL: that tree may wait in the lock manager for
        # this one, so the wait is said to the lock manager (``RowLockOwners.validating``), statement by statement.
        with owners.validating(root, {(table_name, key) for key in keys}, (), connection) as flight:
            try:
                current = fetch_rows(connection, infos[table_name], keys, lock="share" if shared else "update",
                                     nowait=nowait, lock_timeout=None if nowait else LOCK_TIMEOUT)
            except sa.exc.OperationalError as error:
                if flight.victim is not None:
                    raise flight.victim from None   # (cancelled: a deadlock's victim, or its tree aborted)
                if nowait or sqlstate_of(error) != LOCK_NOT_AVAILABLE:
                    raise
                # Its own bound: the holder may be a tree of this process waiting for this one (README "Reads for
                # update"), so the tree is re-run rather than the flush retried.
                raise SerializationConflict(
                    f"commit of {root.id}: a row of {table_name!r} it read stayed locked by another transaction for "
                    f"longer than {LOCK_TIMEOUT}; nothing was written — re-run the transaction (Database.run(fn, "
                    f"retries=N) does)") from error
        for key in keys:
            if not same_image(current.get(key), reads[(table_name, key)]):
                raise SerializationConflict(
                    f"commit of {root.id}: row {key!r} of {table_name!r} was changed by another process "
                    f"after this transaction read it; nothing was written — re-run the transaction "
                    f"(Database.run(fn, retries=N) does)"
                )
    for table_name, where, fetched in scans:
        # FOR SHARE: the scanned rows stay locked until COMMIT, like every relied-on row.  SERIALIZABLE's
        # predicate locks alone do not order this flush against another process's READ COMMITTED flush
        # (PostgreSQL detects serialization anomalies only among SERIALIZABLE transactions): without the
        # row locks the two could each miss the other's write (write skew; found by the list-append
        # history test across two processes).
        with owners.validating(root, set(), (table_name,), connection) as flight:
            try:
                rows = scan_rows(connection, infos[table_name], where, lock="share", nowait=nowait)
            except sa.exc.OperationalError:
                if flight.victim is not None:
                    raise flight.victim from None
                raise
        if not same_image(rows, fetched):
            raise SerializationConflict(
                f"commit of {root.id}: rows of {table_name!r} it scanned were changed by another process; "
                f"nothing was written — re-run the transaction"
            )


def _check_generated_keys(catalog: Catalog, connection: sa.Connection, infos: Mapping[str, TableInfo],
                          writes: Writes, began_at: datetime.datetime | None) -> None:
    """Generated keys the tree inserts must not have been given away again by a reset sequence
    (:meth:`activedb.store.Catalog.check_generated_keys`; raises ``GeneratedKeysReset``, retryable)."""
    by_table: dict[str, list[object]] = {}
    for (table_name, key), entry in writes.items():
        if entry.kind is EntryKind.INSERT and len(key) == 1:
            by_table.setdefault(table_name, []).append(key[0])
    if not by_table:
        return
    used: dict[str, list[int]] = {}
    for table_name, values in by_table.items():
        info = infos[table_name]
        sequence = catalog.sequence_of(info, info.key_columns[0])
        if sequence is not None:
            used.setdefault(sequence, []).extend(value for value in values if isinstance(value, int))
    if used:
        catalog.check_generated_keys(connection, used, began_at)


def _apply(catalog: Catalog, connection: sa.Connection, infos: Mapping[str, TableInfo], writes: Writes,
           log_row: tuple[str, tuple[object, ...]], *, commit: bool = False,
           leading: Sequence[tuple[str, tuple[object, ...] | dict[str, object]]] = ()) -> None:
    try:
        apply_write_set(connection, infos, writes, along=log_row, commit=commit, leading=leading)
    except DuplicateKey as error:
        # A generated key may have collided (a sequence reset the check could not see, e.g. setval to a
        # value and back up): never hand out the rest of that block.
        info = infos.get(error.table) if error.table else None
        if info is not None and len(info.key_columns) == 1:
            sequence = catalog.sequence_of(info, info.key_columns[0])
            if sequence is not None:
                catalog.invalidate_key_blocks(sequence)
        raise


# Driver SQL, sent with the write set's last statement (``apply_write_set``'s ``along``: no round trip of
# its own): the table names travel as one text[] literal and the JSON as text (cast by PostgreSQL; the
# driver's list adaptation costs more than the rest of the row).  Its RETURNING marks the transaction as
# activedb's own for change capture (``activedb/capture/README.md``, "Activedb's own writes").
_LOG_ROW = ("INSERT INTO activedb_transaction_log (transaction_id, began_at, subtransactions, rows_written, tables, "
            "info) VALUES (%s, %s, %s, %s, %s::text[], %s::jsonb) "
            "RETURNING set_config('activedb.capture_xact', 'activedb', true)")


def _text_array(values: Iterable[str]) -> str:
    """``values`` (strings) as a PostgreSQL text[] literal: every element quoted, ``\\`` and ``"`` escaped."""
    return "{" + ",".join('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values) + "}"


def _log_row(root: "Transaction", writes: Writes) -> tuple[str, tuple[object, ...]]:
    """The tree's transaction-log row (statement and parameters)."""
    return _LOG_ROW, (root.log_id, root.began_at, root.subtransactions_committed, len(writes),
                      _text_array(sorted({row[0] for row in writes})),
                      json.dumps(jsonable(root.info)) if root.info else "{}")


def _raise_database_error(root: "Transaction", error: sa.exc.DBAPIError) -> None:
    """Raise what ``error`` means for the commit of ``root``; return only if the connection broke and the
    transaction log shows that the commit happened."""
    if is_connection_failure(error):
        _raise_unknown_outcome(root, error)
        return
    sqlstate = getattr(error.orig, "sqlstate", None)
    message = str(error.orig).strip().splitlines()[0] if error.orig is not None else type(error).__name__
    detail = getattr(getattr(error.orig, "diag", None), "message_detail", None)
    if detail:          # (which row: "Key (code)=(7) already exists.", "… is not present in table …")
        message = f"{message} ({detail.strip().rstrip('.')})"
    kind = DiskFull if classify(error) is Failure.DISK_FULL else DatabaseError
    server_log = root.manager.catalog.server_log() if kind is DiskFull else None
    raise kind(
        f"PostgreSQL refused the commit of {root.id} (SQLSTATE {sqlstate}): {message}; nothing was written. "
        f"{_hint(error, sqlstate)}{f' The server log is {server_log}.' if server_log else ''}",
        sqlstate=sqlstate,
    ) from None


def _hint(error: sa.exc.DBAPIError, sqlstate: str | None) -> str:
    """What to do about a commit PostgreSQL refused with ``error`` (SQLSTATE ``sqlstate``), as a sentence."""
    gone = own_table_missing(error) or reflected_table_changed(error)     # (undefined_column, undefined_table)
    if gone:
        return f"{gone}."
    if sqlstate == DISK_FULL:
        return "The server's disk is full: free space, then re-run the transaction."
    if sqlstate == PROGRAM_LIMIT_EXCEEDED:
        return "A value is too large for PostgreSQL (e.g. an indexed value beyond the index row limit): store less."
    if sqlstate and sqlstate.startswith("23"):
        return "A constraint of the schema rejected a row: check the values written."
    if sqlstate and sqlstate.startswith("22"):
        return "A value does not fit its column: check the values written."
    return "Check the message above; the transaction can be re-run once the cause is fixed."


class OutcomeUnknown:
    """The slot of a root whose flush lost the connection and could not read its transaction-log row either, so that
    it ends ABORTED in memory although PostgreSQL may have committed it (``lowlevel.outcome_unknown``): set just
    before its commit raises ``DatabaseUnavailable`` with ``unknown_outcome``; a tree whose outcome is known never
    has one (no cost to it)."""

    __slots__ = ()


def _raise_unknown_outcome(root: "Transaction", error: BaseException) -> None:
    """The connection broke during the flush: find out from the log whether it committed."""
    catalog = root.manager.catalog
    server_log = catalog.server_log()
    describe = catalog.describe() + (f"; the server's log is {server_log}" if server_log else "")
    panic = disk_full_panic(server_log)        # a full disk under the WAL: the server stopped, no SQLSTATE
    kind: type[DatabaseUnavailable]
    if panic is not None:
        lost, kind = f"PostgreSQL stopped because its disk is full ({describe}: {panic})", ServerDiskFull
        advice = f" {DISK_FULL_ADVICE}"
    else:
        lost, kind, advice = f"lost the connection to PostgreSQL ({describe})", DatabaseUnavailable, ""
    try:
        log = catalog.table("activedb_transaction_log")
        with catalog.engine.connect() as connection:
            committed = connection.execute(
                sa.select(log.c.id).where(log.c.transaction_id == root.log_id)).first() is not None
    except (sa.exc.DBAPIError, DatabaseUnavailable):
        unknown = kind(
            f"{lost} while committing {root.id}, and the outcome is unknown: PostgreSQL applied all of it or nothing "
            f"— look for transaction_id {root.log_id!r} in activedb_transaction_log once the server is back (there: "
            f"committed; absent: nothing was written, re-run the transaction).{advice}")
        unknown.unknown_outcome = root.log_id      # (the outbox settles the tree's firings by that row)
        root._set_slot(OutcomeUnknown, OutcomeUnknown())    # (what the hooks of its abort ask: outcome_unknown)
        raise unknown from error
    if committed:
        logger.warning("connection lost after %s committed; the log confirms the commit", root.id)
        return
    raise kind(
        f"{lost} while committing {root.id}; nothing was written (activedb_transaction_log has no "
        f"{root.log_id!r}) — re-run the transaction.{advice}"
    ) from error
