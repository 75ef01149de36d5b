"""Execute at commit: a batch run inside the top-level transaction's one PostgreSQL transaction.

:func:`apply_at_commit` → :class:`PendingBatch`, a commit participant (or the batch at once through the
tree when a rule observes a written table).  What ``write`` does, why it is serializable, what a retried
flush does: the package README, "Running a batch in the store" and "Why at-commit is serializable".

Thread-safety: a :class:`PendingBatch` belongs to one transaction; its state is read by the
transaction's thread (and by whoever reads ``result`` after the commit).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import operator
import struct
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias, TypeVar, cast

import psycopg
import sqlalchemy as sa
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.rows import TupleRow
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from activedb import lowlevel
from activedb import deadletters
from activedb._gc import no_cyclic_gc
from activedb.batch._declare import BatchEvent, DrawnRow, OpSpec, State, StateTransactions
from activedb.batch._result import BatchResult
from activedb.batch._route import RoutePlan, add_touched, keyed_states, touched_states, written_tables
from activedb.batch._runtime import AUTO, check_events, check_processes, execute_batch, runtime_of, timed_batch
from activedb.batch._state import Loader, NestedColumns
from activedb.batch._store import (DEAD_LETTER_TABLE, NO_GIVEN_KEY, apply_batch, check_key_columns, check_required,
                                   dead_letter, name_rows_once, named_once, store_check)
from activedb.batch._strategy import Split, Strategy
from activedb.batch.errors import BatchNotCommitted, DeclarationError
from activedb.errors import InvalidKey, InvalidValue, SchemaError
from activedb.store import Catalog, Key, KeysCheck, RowImage, TableInfo, array_literal, driver_error, rows_by_key
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn import Transaction

_MISSING = object()
#: ``drawn`` of ``_new_rows`` and ``store_check`` at commit: no table's rows are taken as drawn as a whole — only a row
#: marked ``DrawnRow`` may give a key ``GENERATED ALWAYS`` (``heard=`` names tables rules hear, not keys drawn).
_MARKED_ONLY: frozenset[str] = frozenset()


class PendingState(enum.Enum):
    """``PENDING`` (enlisted; runs inside the commit) → ``COMMITTED`` | ``ABORTED``."""

    PENDING = "pending"
    COMMITTED = "committed"
    ABORTED = "aborted"


class PendingBatch(CommitParticipant):
    """A batch that runs inside the commit of the transaction it is enlisted in (module
    docstring).  ``result`` is its :class:`BatchResult` once the transaction committed;
    ``state`` says where it is; ``mode`` is ``"at commit"`` or ``"through the tree"`` (a rule
    observes a table it writes); ``seconds`` = time per phase of the last run."""

    def __init__(self, transactions: StateTransactions, batch: list[BatchEvent], declared: dict[int, list[OpSpec] | str],
                 keys: dict[str, dict[Hashable, Key]], unbounded: set[str], options: _Options,
                 ready: BatchResult | None = None) -> None:
        self.transactions = transactions
        self.batch = batch
        self._declared = declared
        self._keys = keys                 # table -> {declared key: normalised key tuple}
        self._unbounded = unbounded       # tables of ND operations without candidates
        self._options = options
        self._ready = ready               # computed through the tree (a rule observes a table)
        self._result: BatchResult | None = ready
        self.mode = "through the tree" if ready is not None else "at commit"
        # Invariant: PENDING until the transaction ends; then COMMITTED or ABORTED, never again PENDING.
        self.state = PendingState.PENDING
        self.error: BaseException | None = None
        self.seconds: dict[str, float] = {}
        self.rows_written = 0

    @property
    def result(self) -> BatchResult:
        """The batch's result; only once the transaction committed."""
        if self.state is not PendingState.COMMITTED:
            error = f" ({type(self.error).__name__}: {self.error})" if self.error is not None else ""
            raise BatchNotCommitted(f"the batch's transaction is {self.state.value}{error}; read pending.result after "
                                    f"the transaction committed (after its `with` block)")
        assert self._result is not None
        return self._result

    # --- the commit -----------------------------------------------------------------------

    @no_cyclic_gc()        # tens of thousands of small objects: no cyclic collection meanwhile
    def write(self, transaction: Transaction, connection: sa.Connection) -> None:
        if self.state is not PendingState.PENDING:
            raise BatchNotCommitted(f"a {self.state.value} batch cannot be written again; apply the events again")
        catalog, options = transaction.manager.catalog, self._options
        seconds: dict[str, float] = {}
        if self._ready is not None:
            result = self._ready
            started = time.perf_counter()
            letters = self._letters(result)
            if options.dead_letters is not None and letters:
                deadletters.insert_in_flush(transaction, connection, options.query_id, options.batch_id, letters,
                                            table=options.dead_letters)
            seconds["dead_letters"] = time.perf_counter() - started
            if options.on_sent is not None:
                options.on_sent(result)
        else:
            started = time.perf_counter()
            base = self._lock_and_read(catalog, connection)
            seconds["lock_and_read"] = time.perf_counter() - started
            loader = _on_demand(catalog, connection, self._keys)
            nested = NestedColumns(catalog.table_info)     # (the lean executor's copies of a function's argument)
            early = _EarlyWrites.when_worth_it(catalog, connection, self.batch, base, self._keys, self._unbounded, options)
            try:
                result = execute_batch(self.transactions, self.batch, base,
                                       loader=early.guard(loader) if early is not None else loader,
                                       declared=self._declared, strategy=options.strategy,
                                       processes=options.processes, split=options.split, nested=nested, progress=early)
            except _Unplanned:
                # A row no declaration named, after rows went out: those undone, the batch runs as without early writes.
                assert early is not None
                early.roll_back()
                early = None
                result = execute_batch(self.transactions, self.batch, base, loader=loader, declared=self._declared,
                                       strategy=options.strategy, processes=options.processes, split=options.split,
                                       nested=nested)
            except BaseException as error:
                if early is not None:
                    early.abandon(error)
                raise
            if result.statistics is not None:
                seconds.update(result.statistics.seconds)
            started = time.perf_counter()
            statements = early.remaining(result) if early is not None else None
            if statements is None and early is not None:
                early.roll_back()           # (an irregular run: what went out undone, and written as without)
                early = None
            try:
                if statements is None:
                    statements = _planned_writes(catalog, result, self._keys)
            except SchemaError as error:
                # A transaction wrote a value the store cannot hold: run the batch again checking each transaction's
                # values as it ends, so that exactly those transactions abort (each a dead letter with the reason) —
                # and the rows a function made checked as it made them (``check_rows``), as ``tx.insert`` checks them:
                # a rule that catches the error, or one that would not run after it, runs as firing runs it.
                if options.check_rows is not None:
                    options.check_rows()
                result = execute_batch(self.transactions, self.batch, base, loader=loader, declared=self._declared,
                                       strategy="lean", split=Split.NEVER,
                                       check=store_check(catalog, result.before, _MARKED_ONLY), nested=nested)
                result.notes.append(f"ran again checking each transaction's values: {type(error).__name__}: {error}")
                statements = _planned_writes(catalog, result, self._keys)
            check = options.keys_check() if options.keys_check is not None else None
            letters = []

            def letters_insert() -> deadletters.LettersInsert | None:
                """The dead letters, made and encoded while PostgreSQL runs the rows' statements, and their statement
                for the same round trip."""
                nonlocal letters
                began = time.perf_counter()
                letters = self._letters(result)
                statement = None if options.dead_letters is None or not letters else deadletters.insert_statement(
                    transaction, connection.dialect, options.query_id, options.batch_id, letters,
                    table=options.dead_letters)
                seconds["dead_letters"] = time.perf_counter() - began
                return statement

            raised: list[Exception] = []

            def meanwhile() -> None:
                """``on_sent(result)`` while PostgreSQL runs the statements; its error is raised after they synced."""
                try:
                    options.on_sent(result)  # type: ignore[misc]  # (passed only when set)
                except Exception as error:
                    raised.append(error)

            try:
                self.rows_written = _send(connection, statements, check, then=letters_insert,
                                          meanwhile=meanwhile if options.on_sent is not None else None,
                                          opened=early.opened() if early is not None else None)
            except sa.exc.DBAPIError:
                if early is None:
                    raise
                # PostgreSQL refused a statement: perhaps one of a row sent early whose final image differs.  Rolled
                # back to before every row (``_send``), the batch's rows are written as without early writes: a refusal
                # there is the batch's own.
                raised.clear()
                statements = _planned_writes(catalog, result, self._keys)
                early = None
                self.rows_written = _send(connection, statements, check, then=letters_insert,
                                          meanwhile=meanwhile if options.on_sent is not None else None)
            if early is not None:
                self.rows_written += early.rows + early.recounted
            seconds["write"] = time.perf_counter() - started - seconds["dead_letters"]
            if raised:
                raise raised[0]
        if options.on_result is not None:
            options.on_result(result, connection)
        transaction.info["batch"] = {"events": result.committed_count, "dead_letters": len(letters),
                                     "rows_written": self.rows_written, "mode": self.mode}
        self._result = result
        self.seconds = {"apply": self.seconds.get("apply", 0.0), **seconds}

    def _letters(self, result: BatchResult) -> list[deadletters.Letter]:
        options = self._options
        return options.letters(result) if options.letters is not None else [
            dead_letter(event, reason) for event, reason in result.dead_letters]

    def committed(self, transaction: Transaction) -> None:
        self.state = PendingState.COMMITTED
        self._release()

    def aborted(self, transaction: Transaction, error: BaseException | None) -> None:
        if self.state is PendingState.PENDING:
            self.state = PendingState.ABORTED
            self.error = error
            self._result = None
            self._release()

    def _release(self) -> None:
        """Once the transaction ended, drop what only ``write`` needs: the declarations, the keys and the caller's
        callbacks (whose closures hold the caller's own copy of the events).  A caller that keeps this object
        for its ``result`` then keeps that alone, and the collector's young pass after a batch has that much
        less to scan."""
        self._declared = {}
        self._keys = {}
        self._options = replace(self._options, letters=None, on_result=None, keys_check=None, on_sent=None,
                                check_rows=None)

    def _lock_and_read(self, catalog: Catalog, connection: sa.Connection) -> dict[State, RowImage | None]:
        """Lock every declared row ``FOR UPDATE`` (tables in name order, keys in key order) and
        return their images; a table with absent rows is locked against writers and those rows
        read again (the package README, "Running a batch in the store")."""
        for table in sorted(self._unbounded):
            _lock_table(catalog, connection, table)
        base: dict[State, RowImage | None] = {}
        for table in sorted(self._keys):
            keys = self._keys[table]
            info = catalog.table_info(table)
            found = _select_for_update(connection, info, list(keys.values()))
            if len(found) < len(keys) and table not in self._unbounded:
                _lock_table(catalog, connection, table)
                found.update(_select_for_update(connection, info, [key for key in keys.values() if key not in found]))
            # (Each declared key's image, None if absent: ``base[(table, given)] = found.get(key)``, in C.)
            base.update(zip(zip(itertools.repeat(table), keys), map(found.get, keys.values())))
        return base


#: Early writes (:class:`_EarlyWrites`): the fewest events per part of the run (a batch needs two parts at least), the
#: parts per batch, the least share of the batch's events that name rows of their own, and the savepoint that undoes
#: what went out.
_EARLY_MIN_EVENTS = 200
_EARLY_PARTS = 4
_EARLY_DISTINCT = 0.9
_EARLY_SAVEPOINT = "activedb_early_writes"


class _Unplanned(Exception):
    """The run asked the loader for a row no declaration named after rows went out early (``_EarlyWrites.guard``)."""


class _EarlyWrites:
    """The rows of a batch sent while its lean run goes on (the package README, "Rows sent while the batch runs"): told
    the run's progress (``run_lean(progress=)``), each part's newly written states go out as their images are then —
    planned as the final rows are, into a pipeline left open, under a savepoint — and :meth:`remaining` plans what
    the end must still write: each state whose final image is not the one sent, against the one sent.  Anything
    irregular — a state that is no longer final as sent (a run that restarted), a row the loader must read, a value
    the store cannot hold — ends the early writes; what went out is then rolled back to the savepoint
    (:meth:`roll_back`, which releases the locks its statements took) and the batch is written as without them."""

    def __init__(self, catalog: Catalog, connection: sa.Connection, base: Mapping[State, RowImage | None],
                 normalised: Mapping[str, Mapping[Hashable, Key]], every: int) -> None:
        self.every = every
        self._catalog, self._connection, self._base, self._normalised = catalog, connection, base, normalised
        self._sent: dict[State, RowImage | None] = {}     # state -> the image sent (the store's now)
        self._pipeline: contextlib.AbstractContextManager[psycopg.Pipeline] | None = None   # open once a row went out
        self._written: Mapping[State, None] | None = None  # the run's, to tell a restart
        self._position = 0                                # states of ``_written`` looked at
        self.stopped = False                              # nothing more goes out
        self.irregular = False                            # what went out must be undone
        self.rows = 0                                     # rows sent
        self.recounted = 0      # what makes the rows counted sent and again at the end the rows the batch changed

    @classmethod
    def when_worth_it(cls, catalog: Catalog, connection: sa.Connection, batch: Sequence[BatchEvent],
                      base: Mapping[State, RowImage | None], keys: Mapping[str, Mapping[Hashable, Key]],
                      unbounded: Collection[str], options: _Options) -> _EarlyWrites | None:
        """Early writes for a batch whose rows are of one table without triggers or unique indexes besides its key,
        each named by its declarations or route plans (none read on demand), mostly one per event (a row written early
        and again later costs a second write), with no generated keys to check first and no column drawing from a
        sequence, of two parts at least; None otherwise."""
        if (options.keys_check is not None or unbounded or len(keys) != 1
                or len(batch) < 2 * _EARLY_MIN_EVENTS or len(base) < len(batch) * _EARLY_DISTINCT):
            return None
        table = next(iter(keys))
        info = catalog.table_info(table)
        if info.nested or _draws_from_sequences(info) or _seen_part_by_part(catalog, connection, table):
            return None     # (a list or dict in an image sent may be one a later image shares: the end could not tell)
        return cls(catalog, connection, base, keys, max(_EARLY_MIN_EVENTS, -(-len(batch) // _EARLY_PARTS)))

    def __call__(self, images: Mapping[State, RowImage | None], written: Mapping[State, None]) -> None:
        """A part of the run done: the states first written in it go out, as their images are now."""
        if self.stopped:
            return
        if written is not self._written:
            if self._pipeline is not None:    # (the run restarted, keeping versions: what went out may not hold)
                self.stopped = self.irregular = True
                return
            self._written, self._position = written, 0
        states = list(itertools.islice(written, self._position, None))
        self._position += len(states)
        if not states:
            return
        final = {state: images[state] for state in states}
        try:
            statements = _final_rows(self._catalog, final, self._base, self._normalised)
        except SchemaError:      # (the end decides, as without early writes)
            self.stopped = True
            self.irregular = self._pipeline is not None
            return
        self._sent.update(final)
        if not statements:
            return
        driver = _driver(self._connection)
        try:
            if self._pipeline is None:
                self._pipeline = driver.pipeline()
                self._pipeline.__enter__()
                driver.execute(f"SAVEPOINT {_EARLY_SAVEPOINT}")
            for statement in statements:
                _execute(self._connection, statement)
        except (driver.Error, sa.exc.DBAPIError):
            # PostgreSQL refused a row sent (its error arrives with a later statement): perhaps an image a later event
            # changes — the end decides, as without early writes.
            self.stopped = self.irregular = True
            return
        self.rows += sum(len(rows) for _, _, _, rows in statements)

    def guard(self, loader: Loader) -> Loader:
        """``loader``, ending the early writes: before any went out, it loads as it would; after, it raises
        :class:`_Unplanned` (the row's table lock would come after the rows' writes, an order that can deadlock
        with another process doing the same: the batch runs again without early writes)."""
        def load(table: str, key: Hashable) -> RowImage | None:
            if self._pipeline is not None:
                raise _Unplanned(f"the row {key!r} of {table!r} was read on demand after rows went out early")
            self.stopped = True
            return loader(table, key)

        return load

    def remaining(self, result: BatchResult) -> list[_Statement] | None:
        """The statements that write the rest of ``result``: each state whose final image is not the one sent, against
        the one sent (the store's now), and the new rows; None when nothing went out, or what did must be undone
        (irregular, a state sent that is no final state of the result, a value the store cannot hold)."""
        return None if self._pipeline is None or self.irregular else self._rest(result)

    def _rest(self, result: BatchResult) -> list[_Statement] | None:
        final, sent, before = result.final, self._sent, result.before
        if not sent.keys() <= final.keys():
            return None
        rest: dict[State, RowImage | None] = {}
        against: dict[State, RowImage | None] = {}
        recounted = 0
        for state, image in final.items():
            old = sent.get(state, _MISSING)
            if old is _MISSING:
                rest[state] = image
                against[state] = before.get(state)
            elif old is not image and old != image:
                rest[state] = image
                against[state] = old           # type: ignore[assignment]  # (an image or None)
                # (``rows_written`` counts the rows the batch changed, as without early writes: a row sent unchanged,
                # or deleted and made again, is not one row sent and one again.)
                first = before.get(state)
                recounted += (_rows_planned(first, image) - _rows_planned(first, old)   # type: ignore[arg-type]
                              - _rows_planned(old, image))                              # type: ignore[arg-type]
        self.recounted = recounted
        try:
            return (_final_rows(self._catalog, rest, against, self._normalised)
                    + _new_rows(self._catalog, result.inserted(), _MARKED_ONLY))
        except SchemaError:
            self.recounted = 0
            return None

    def opened(self) -> tuple[contextlib.AbstractContextManager[psycopg.Pipeline], str] | None:
        """The pipeline the rows went out in and their savepoint, for the end's statements (``_send(opened=)``)."""
        return (self._pipeline, _EARLY_SAVEPOINT) if self._pipeline is not None else None

    def roll_back(self) -> None:
        """Undo what went out: the pipeline synced (a refusal of a row sent is dropped with it) and the transaction
        rolled back to the savepoint, which also releases the locks those statements took."""
        pipeline, self._pipeline = self._pipeline, None
        self.rows = self.recounted = 0
        if pipeline is None:
            return
        driver = _driver(self._connection)
        try:
            pipeline.__exit__(None, None, None)
        except driver.Error:
            pass                # (the rows refused are undone below: the batch's own writes decide)
        try:
            driver.execute(f"ROLLBACK TO SAVEPOINT {_EARLY_SAVEPOINT}")
            driver.execute(f"RELEASE SAVEPOINT {_EARLY_SAVEPOINT}")
        except driver.Error as error:
            raise driver_error("rolling back the rows sent early", None, error, driver) from None

    def abandon(self, error: BaseException) -> None:
        """The run failed: the pipeline ended (its errors logged by the driver, ``error`` raised by the caller)."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.__exit__(type(error), error, error.__traceback__)


@contextlib.contextmanager
def _exiting(pipeline: contextlib.AbstractContextManager[psycopg.Pipeline]) -> Iterator[None]:
    """A pipeline entered already, exited (synced) at the end of the ``with`` block, as its own ``with`` would."""
    try:
        yield
    except BaseException as error:
        pipeline.__exit__(type(error), error, error.__traceback__)
        raise
    pipeline.__exit__(None, None, None)


def _execute(connection: sa.Connection, statement: _Statement) -> None:
    """Send one planned statement (``_planned_writes``')."""
    function, info, names, rows = statement
    if names is None:
        function(connection, info, rows)
    else:
        function(connection, info, names, rows)


def _draws_from_sequences(info: TableInfo) -> bool:
    """Whether a new row of the table takes a column's value from a sequence (an identity, or a ``serial``'s
    ``nextval`` default): a row sent early and deleted, or undone, later would have drawn a value no rollback
    returns, and the batch's rows would take other values than without early writes."""
    return any(column.identity is not None or "nextval(" in getattr(getattr(column.server_default, "arg", None),
                                                                    "text", "")
               for column in info.columns.values())


def _seen_part_by_part(catalog: Catalog, connection: sa.Connection, table: str) -> bool:
    """Whether another transaction could see, or wait on, a row's intermediate image in ``table``: it has a trigger (a
    user's, or a foreign key's: each would see, or lock, the batch's rows part by part), or a unique or exclusion
    index besides its primary key (an intermediate value would take an index entry another transaction's row waits on,
    or that waits on one of its — a wait, or a deadlock, no batch written at its end has).  Asked per batch, in its
    transaction: a trigger or index made since the last batch (``CREATE TRIGGER``, a foreign key, ``db.capture``,
    ``CREATE UNIQUE INDEX``) must not see a row's intermediate image."""
    name = catalog.table_info(table).table
    preparer = connection.dialect.identifier_preparer
    return bool(connection.exec_driver_sql(
        "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = %(name)s::regclass) OR EXISTS (SELECT FROM pg_index "
        "WHERE indrelid = %(name)s::regclass AND (indisunique OR indisexclusion) AND NOT indisprimary)",
        {"name": preparer.format_table(name)}).scalar())


def _on_demand(catalog: Catalog, connection: sa.Connection, keys: Mapping[str, Mapping[Hashable, Key]]) -> Loader:
    """The loader of rows no declaration named (ND operations without candidates, a route plan that
    missed): lock their table against writers (``SHARE ROW EXCLUSIVE``: an absent row stays absent),
    then read the row ``FOR UPDATE``.  ``keys``: the batch's declared rows (table → {key: normalised key}), a row
    the batch names by another key already being refused (``named_once``)."""
    locked: set[str] = set()
    check = named_once(catalog, keys)

    def load(table: str, key: Hashable) -> RowImage | None:
        info = catalog.table_info(table)
        try:
            normalised = info.key(key)
        except (InvalidKey, InvalidValue) as error:   # a computed key that cannot name a row: the op fails
            raise DeclarationError(f"the row {key!r} of {table!r} cannot exist: {error}") from None
        if info.converts_keys:
            check(table, key, normalised)
        if table not in locked:
            _lock_table(catalog, connection, table)
            locked.add(table)
        return _select_for_update(connection, info, [normalised]).get(normalised)

    return load


def _lock_table(catalog: Catalog, connection: sa.Connection, table: str) -> None:
    name = catalog.table_info(table).table
    preparer = connection.dialect.identifier_preparer
    # (Driver SQL: the preparer doubles a name's ``%`` for the driver already, which ``sa.text`` would double again.)
    connection.exec_driver_sql(f"LOCK TABLE {preparer.format_table(name)} IN SHARE ROW EXCLUSIVE MODE")


def _select_for_update(connection: sa.Connection, info: TableInfo, keys: list[Key]) -> dict[Key, RowImage]:
    """The images of ``keys`` (normalised key tuples), locked ``FOR UPDATE`` in key order."""
    if not keys:
        return {}
    columns = [info.table.c[name] for name in info.key_columns]
    names = info.key_columns
    if len(columns) == 1:
        column = columns[0]
        def statement() -> sa.Select[tuple[object, ...]]:
            return (sa.select(info.table)
                    .where(column == sa.any_(sa.bindparam("keys", type_=postgresql.ARRAY(column.type))))
                    .order_by(column).with_for_update())

        bound = sorted(map(_FIRST, keys))     # (first values, of one column: comparable)
        python_type = _array_type(column)
        parameter = (_array_of(python_type, bound) if python_type is not None and set(map(type, bound)) == {python_type}
                     else bound)
        rows, fields = _run(connection, statement, {"keys": parameter},  # type: ignore[misc]
                            fetch=True, shape=("select for update", info.table))  # (fetch: rows)
        if info.reals:
            # (read in binary, a real is the single-precision number widened, 0.10000000149011612: the image and
            # the key are what the store reads, in text, 0.1 — ``TableInfo.normalised``)
            images = [dict(zip(fields, row)) for row in rows]
            for image in images:
                for name in info.reals & image.keys():
                    image[name] = info.normalised(name, image[name])
            return {(image[names[0]],): image for image in images}
        if fields[0] == names[0]:
            # ``{(row[0],): dict(zip(fields, row)) for row in rows}``, in C (a batch reads a row per event).
            return dict(zip(zip(map(_FIRST, rows)), map(dict, map(zip, itertools.repeat(fields), rows))))
        return {(image[names[0]],): image for image in (dict(zip(fields, row)) for row in rows)}
    found: dict[Key, RowImage] = {}
    ordered = sorted(keys)
    select = info.select_by_keys().order_by(*columns).with_for_update()
    for start in range(0, len(ordered), 5000):    # bounded bind parameters per statement
        rows_by_key(connection.execute(select, {"keys": ordered[start:start + 5000]}), names, found)
    return found


_ARRAY_DUMPERS = "activedb.batch: float8[] and int8[] dumpers"    # ``connection.info``: registered on this driver connection

#: (statement kind, table, columns) → its SQL as ``_run`` sends it: compiling a statement costs about a
#: millisecond of SQLAlchemy, more than PostgreSQL's work for a small batch, and a stream repeats a few shapes.
_SQL: dict[tuple[Hashable, ...], str] = {}
_SQL_KEPT = 512


def _run(connection: sa.Connection, statement: sa.ClauseElement | Callable[[], sa.ClauseElement],
         parameters: Mapping[str, object], *, fetch: bool = False, shape: tuple[Hashable, ...] | None = None
         ) -> tuple[list[TupleRow], list[str]] | None:
    """Run ``statement`` on the connection's own driver cursor, its array parameters sent in binary
    (``%(name)b``); with ``fetch``, its rows as plain tuples and the column names: the batch reads
    tens of thousands of rows here, and a SQLAlchemy row object per row would cost more than
    PostgreSQL's work for it.  ``statement`` may be a function that builds it; with ``shape`` (what
    determines its SQL) the compiled SQL is kept and the function called only the first time.  The driver's
    errors are raised as SQLAlchemy's (``activedb.store.driver_error``), as for a statement SQLAlchemy ran."""
    sql = _SQL.get(shape) if shape is not None else None
    if sql is None:
        built = statement() if callable(statement) else statement
        sql = str(built.compile(dialect=connection.dialect))
        for name in parameters:
            sql = sql.replace(f"%({name})s", f"%({name})b")
        if shape is not None:
            if len(_SQL) >= _SQL_KEPT:
                _SQL.clear()
            _SQL[shape] = sql
    driver = _driver(connection)
    if not connection.info.get(_ARRAY_DUMPERS):
        driver.adapters.register_dumper(_Float8Array, _Float8ArrayDumper)
        driver.adapters.register_dumper(_Int8Array, _Int8ArrayDumper)
        connection.info[_ARRAY_DUMPERS] = True
    cursor = driver.cursor(binary=True)
    try:
        # A statement of a kept shape runs prepared on the server from its first batch on (its parse and plan once per
        # connection, not per batch; the driver prepares one by itself only after some runs, and none it runs in a
        # pipeline, where ``_send`` runs the writes) — unless the driver prepares nothing (``prepare_threshold=None``,
        # e.g. behind a pooler in transaction mode).
        cursor.execute(sql, parameters,
                       prepare=True if shape is not None and driver.prepare_threshold is not None else None)
        if fetch:
            return cursor.fetchall(), [description.name for description in cursor.description or ()]
        return None
    except driver.Error as error:       # SQLAlchemy's, as for a statement it ran: the flush classifies it
        raise driver_error(sql, None, error, driver) from None
    finally:
        cursor.close()


#: A statement of a batch's writes, checked and ready: (``_delete``/``_update``/``_insert``, table info, columns
#: (None for a delete), rows).
_Statement: TypeAlias = "tuple[Callable[..., None], TableInfo, list[str] | None, list[RowImage]]"


def _driver(connection: sa.Connection) -> psycopg.Connection[TupleRow]:
    """The psycopg connection under ``connection`` (the store's driver)."""
    return cast("psycopg.Connection[TupleRow]", connection.connection.driver_connection)


def _planned_writes(catalog: Catalog, result: BatchResult, normalised: Mapping[str, Mapping[Hashable, Key]]
                    ) -> list[_Statement]:
    """The statements that write the batch's final rows and its new rows, every value checked first (a
    value the store cannot hold raises a ``SchemaError`` before anything is sent)."""
    return (_final_rows(catalog, result.final, result.before, normalised)
            + _new_rows(catalog, result.inserted(), _MARKED_ONLY))


def _send(connection: sa.Connection, statements: list[_Statement], check: KeysCheck | None = None, *,
          savepoint: str | None = None, then: Callable[[], deadletters.LettersInsert | None] | None = None,
          meanwhile: Callable[[], None] | None = None,
          opened: tuple[contextlib.AbstractContextManager[psycopg.Pipeline], str] | None = None) -> int:
    """Send ``statements`` (:func:`_planned_writes`) in one pipeline of the driver: PostgreSQL runs each one while
    the next one's arrays are made here (they need no result); the number of rows they write.  ``check``: the
    generated keys' check, sent first and judged once the pipeline synced (it raises ``GeneratedKeysReset``: the
    caller must not commit).  ``savepoint``: the statements, and the dead letters' of ``then``, run under that
    savepoint, set and released in the same pipeline; after a failure the transaction is rolled back to it.  ``then()``: called once the statements are
    sent (PostgreSQL runs them meanwhile), a last statement for the same round trip — the batch's dead letters —
    whose row count is checked once the pipeline synced.  ``meanwhile()``: called last, before the pipeline syncs —
    Python work that overlaps PostgreSQL's (it must run no statement on the connection).  The driver's errors,
    raised when the pipeline syncs, become SQLAlchemy's, as when a statement runs on its own.  ``opened``: a pipeline
    entered already and the savepoint set in it (the rows sent while the batch ran, ``_EarlyWrites``): the statements
    go on in it, under that savepoint, released at the end; on a failure rolled back to (as ``savepoint``)."""
    driver = _driver(connection)
    checking = letters = None
    inserting: list[psycopg.Cursor[TupleRow]] = []
    if opened is not None:
        assert savepoint is None
        savepoint = opened[1]
    try:
        with driver.pipeline() if opened is None else _exiting(opened[0]):
            if savepoint is not None and opened is None:
                driver.execute(f"SAVEPOINT {savepoint}")
            if check is not None:
                checking = driver.execute(check.sql, check.parameters)
            for statement in statements:
                _execute(connection, statement)
            letters = then() if then is not None else None
            if letters is not None:
                inserting = [driver.execute(letters.sql, parameters) for parameters in letters.chunks]
            if savepoint is not None:
                # (After the dead letters: a refusal of theirs is rolled back to the savepoint too, which a released
                # one no longer is.)
                driver.execute(f"RELEASE SAVEPOINT {savepoint}")
            if meanwhile is not None:
                meanwhile()
    except (driver.Error, sa.exc.DBAPIError) as error:
        # (A statement's error arrives at the pipeline's sync, or — when PostgreSQL answered already — at a later
        # statement's send, as SQLAlchemy's (``_run``): either way the savepoint is rolled back to.)
        if savepoint is not None:
            driver.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
        if isinstance(error, sa.exc.DBAPIError):
            raise
        raise driver_error("the batch's writes (one pipeline)", None, error, driver) from None
    if check is not None and checking is not None:
        check.judge(checking.fetchall())
    if letters is not None and inserting:
        letters.done(sum(cursor.rowcount for cursor in inserting))
    return sum(len(rows) for _, _, _, rows in statements)


def _final_rows(catalog: Catalog, final: Mapping[State, RowImage | None], before: Mapping[State, RowImage | None],
                normalised: Mapping[str, Mapping[Hashable, Key]]) -> list[_Statement]:
    """The statements that make the rows of ``final`` (state → image, None: no row) of the rows ``before`` (the
    store's, as this transaction sees them), one per table and kind (the package README, "Running a batch in the
    store"); ``normalised[table][key]``: the key tuples checked when the batch was applied."""
    statements: list[_Statement] = []
    before_get = before.get
    # The states of each table, in the order of ``final``: its items as they are when every state is of one table (a
    # stream's usual batch), without a step per state here.
    tables = set(map(_FIRST, final))
    by_table: Mapping[str, Iterable[tuple[State, RowImage | None]]]
    if len(tables) == 1:
        by_table = {table: final.items() for table in tables}
    else:
        grouped: dict[str, list[tuple[State, RowImage | None]]] = {table: [] for table in tables}
        for item in final.items():
            grouped[item[0][0]].append(item)
        by_table = grouped
    for table in sorted(by_table):
        info = catalog.table_info(table)
        items = by_table[table]
        if type(items) is list:
            states, images = list(map(_FIRST, items)), list(map(_SECOND, items))
        else:
            states, images = list(final), list(final.values())
        uniform = _uniform_updates(info, images, list(map(before_get, states)))
        if uniform is not None:
            statements.extend(uniform)
            continue
        known = normalised.get(table, {})
        key_columns = info.key_columns
        key_set = frozenset(key_columns)
        single = key_columns[0] if len(key_columns) == 1 else None
        deletes: list[RowImage] = []
        updates: dict[tuple[str, ...], list[tuple[RowImage, RowImage]]] = {}   # changed columns -> (key columns + those, image)
        inserts: dict[frozenset[str], list[RowImage]] = {}
        recreated: dict[frozenset[str], list[RowImage]] = {}      # rows deleted and created again
        for state, image in by_table[table]:
            given = state[1]
            old = before_get(state)
            key = known.get(given)
            if key is None:
                key = info.key(given)
            key_row: RowImage = {single: key[0]} if single is not None else info.full_key_row(key)
            if image is None:
                if old is not None:
                    deletes.append(key_row)
                continue
            if old is not None and len(image) < len(old) and not old.keys() <= image.keys():
                # Deleted and created again in the batch (a write keeps every column its row had; only a new row's
                # image is the written columns): the row deleted, then the new one inserted with its other columns
                # at their defaults, as the tree writes a delete followed by a write (a REPLACE).  Its key is the
                # row's own, not one the application chose: inserted as a drawn key is.
                deletes.append(dict(key_row))
                check_key_columns(info, given, image, key_row)
                check_required(info, image, f"the new row {given!r}")
                row = {**image, **key_row}
                recreated.setdefault(frozenset(row), []).append(row)
                continue
            if old is None:
                info.refuse_new_row_by_key(given)
                check_key_columns(info, given, image, key_row)
                check_required(info, image, f"the new row {given!r}")
                row = {**image, **key_row}
                inserts.setdefault(frozenset(row), []).append(row)
                continue
            old_get = old.get
            changed = tuple([name for name, value in image.items() if old_get(name, _MISSING) != value])
            if not changed:
                continue
            if not key_set.isdisjoint(changed):
                check_key_columns(info, given, image, key_row)
            pairs = updates.get(changed)
            if pairs is None:
                updates[changed] = pairs = []
            for name in changed:
                key_row[name] = image[name]
            pairs.append((key_row, image))
        if deletes:
            statements.append((_delete, info, None, deletes))
        for columns, rows in _one_update(info, updates).items():
            names = sorted(columns)
            _check_columns(info, names, rows)
            statements.append((_update, info, names, rows))
        for insert, new_rows in ((_insert, inserts), (_insert_drawn, recreated)):
            for columns, rows in new_rows.items():
                names = sorted(columns)
                _check_columns(info, [name for name in names if name not in key_set], rows)
                statements.append((insert, info, names, rows))
    return statements


def _rows_planned(old: RowImage | None, image: RowImage | None) -> int:
    """The rows :func:`_final_rows` plans to make ``image`` of ``old`` (None: no row) — none when it is unchanged, two
    when it is deleted and made again — its branches, for one row."""
    if image is None or old is None:
        return 0 if image is old else 1
    if len(image) < len(old) and not old.keys() <= image.keys():
        return 2
    old_get = old.get
    return 0 if all(old_get(name, _MISSING) == value for name, value in image.items()) else 1


_FIRST = operator.itemgetter(0)         # a state's table, a key tuple's first value, a pair's first
_SECOND = operator.itemgetter(1)        # a pair's second

_INT = {int}                            # ``set(map(type, values)) == _INT``: every value an exact int (in C)


def _uniform_updates(info: TableInfo, images: list[RowImage | None], olds: list[RowImage | None]
                     ) -> list[_Statement] | None:
    """The statements ``_final_rows`` plans for one table's final ``images`` (``olds``: the rows as the batch read
    them, in the same order), made a column at a time rather than a row at a time, when every row was there before
    and is there after with the same columns, no key column changed, and the rows that changed set one set of columns
    (at most one ``UPDATE``: a stream's usual batch); None otherwise (the row-at-a-time plan then decides).  The
    statement's rows are the final images themselves: ``_update`` reads only their key columns — unchanged: each row's
    key as the store gave it — and the changed ones."""
    if not images:
        return None
    # (Typed as rows: a None among them — a row deleted, or new — makes ``len`` raise TypeError, and the plan None.)
    rows, before = cast("list[RowImage]", images), cast("list[RowImage]", olds)
    try:
        widths = set(map(len, rows))
        widths.update(map(len, before))
    except TypeError:
        return None
    names = list(rows[0])
    if widths != {len(names)} or not rows[0].keys() >= set(info.key_columns):
        return None         # (other columns; or no key columns: rows the batch created, sent early)
    columns = info.table.c
    changed: list[str] = []
    mixed: list[list[object]] = []        # per column some rows changed and others did not: whose
    try:
        for name in names:
            getter = operator.itemgetter(name)
            differ = list(map(operator.ne, map(getter, rows), map(getter, before)))   # (KeyError: other columns)
            if not any(differ):
                continue
            if name in info.key_columns:
                return None        # (the row-at-a-time plan says which row's key changed)
            changed.append(name)
            if not all(differ):
                mixed.append(differ)
    except KeyError:
        return None
    if not changed:
        return []
    if mixed and any(name not in columns or _array_type(columns[name]) is None for name in changed):
        return None        # (``_one_update`` gives such rows a statement per set of changed columns)
    if mixed and len(mixed) == len(changed):      # (a column every row changed: every row is written)
        rows = list(itertools.compress(rows, map(any, zip(*mixed))))
    names = sorted(changed)
    _check_columns(info, names, rows)
    return [(_update, info, names, rows)]


def _one_update(info: TableInfo, updates: Mapping[tuple[str, ...], list[tuple[RowImage, RowImage]]]
                ) -> dict[frozenset[str], list[RowImage]]:
    """The updated rows (``updates``: changed columns → (key columns and those values, the row's image)) as few
    statements: when every changed column of the table has an array form, every row sets the union of the
    changed columns, each from its image — a column a row did not change is set to the value it has, locked
    since the batch read it — so that one statement serves the table (a stream's rows change a few different
    sets of columns: one statement each cost more than PostgreSQL's work for them); a row whose image lacks a
    column of the union keeps its own statement."""
    union = frozenset(name for changed in updates for name in changed)
    columns = info.table.c
    if len(updates) <= 1 or any(name not in columns or _array_type(columns[name]) is None for name in union):
        # (Two rows may name one set of columns in two orders — a row the batch created and sent early, against one
        # read: one statement for both.)
        by_set: dict[frozenset[str], list[RowImage]] = {}
        for changed, rows in updates.items():
            by_set.setdefault(frozenset(changed), []).extend(map(_FIRST, rows))
        return by_set
    merged: dict[frozenset[str], list[RowImage]] = {}
    one: list[RowImage] = []
    for changed, rows in updates.items():
        for row, image in rows:
            if union <= image.keys():
                row.update((name, image[name]) for name in union if name not in row)
                one.append(row)
            else:
                merged.setdefault(frozenset(changed), []).append(row)
    if one:
        merged.setdefault(union, []).extend(one)
    return merged


def _new_rows(catalog: Catalog, inserted: Mapping[str, list[RowImage]], drawn: Collection[str] | None = None
              ) -> list[_Statement]:
    """The new rows of the batch's INSERT operations, one statement per table and set of columns (columns left
    out take their defaults: a generated key is drawn by PostgreSQL; a key given was drawn from the table's sequence,
    a keyed table's: :func:`_insert_drawn`).  ``drawn``: the tables whose rows' keys were drawn so (None: every
    table's); a key ``GENERATED ALWAYS`` given for a row of another table is the application's, refused
    (``InvalidKey``: an INSERT leaves keys to the store), unless the row is a ``DrawnRow`` (its key drawn by the
    batch's caller: a learned rule's insert)."""
    statements: list[_Statement] = []
    for table in sorted(inserted):
        info = catalog.table_info(table)
        given = bool(info.always_generated) and drawn is not None and table not in drawn
        by_columns: dict[frozenset[str], list[RowImage]] = {}
        # (A row with the columns of the row before it joins that row's list without a set made of its columns: the
        # rows one rule inserts come one after the other, and ``keys() ==`` compares them as sets, in C.)
        previous: RowImage = {}
        group: list[RowImage] = []
        for row in inserted[table]:
            if given and type(row) is not DrawnRow:
                info.refuse_given_identity(row, f"a row inserted into {table!r}", NO_GIVEN_KEY)
            if not group or row.keys() != previous.keys():
                group = by_columns.setdefault(frozenset(row), [])
            group.append(row)
            previous = row
        for columns, rows in by_columns.items():
            names = sorted(columns)
            check_required(info, columns, f"a row inserted into {table!r}")
            _check_columns(info, names, rows)
            statements.append((_insert_drawn, info, names, rows))
    return statements


def insert_rows(connection: sa.Connection, catalog: Catalog, inserted: Mapping[str, list[RowImage]],
                check: KeysCheck | None = None, *, savepoint: str | None = None) -> int:
    """Insert ``inserted`` (table -> new rows, in one pipeline, set-at-a-time as the batch's own new rows); the number
    of rows; their keys, where given, drawn from the tables' sequences as ``tx.insert`` draws them.  Raises
    ``SchemaError`` for a row the table cannot hold (before anything is sent), the driver's error as SQLAlchemy's.
    ``check`` and ``savepoint``: as :func:`_send` takes them."""
    return _send(connection, _new_rows(catalog, inserted), check, savepoint=savepoint)


def _check_columns(info: TableInfo, names: list[str], rows: list[RowImage]) -> None:
    """``info.check_value`` for every value written (an unknown column, a wrong type, an integer
    out of range fail here, naming the column, as a write through the tree would), checking a
    column of plain ints by its extremes."""
    for name in names:
        values = list(map(operator.itemgetter(name), rows))
        column = info.columns.get(name)
        if column is not None and isinstance(column.type, sa.Integer) and values and set(map(type, values)) == _INT:
            info.check_value(name, min(values))
            info.check_value(name, max(values))
            continue
        info.check_column(name, values)


# Column types whose Python values PostgreSQL takes as arrays through ``unnest``, and the one
# Python type every value must have (or None) for the driver to send the array in binary.
_ARRAY_TYPES = ((sa.Integer, int), (sa.Float, float), (sa.Text, str), (sa.Boolean, bool))
_NONE = type(None)


def _arrays(info: TableInfo, names: list[str], rows: list[RowImage]) -> dict[str, object] | None:
    """The parameters ``a0, a1, …`` of ``unnest(:a0, :a1, …) AS v(names…)`` (:func:`_unnest`), or None if a
    column's values have no plain array form (then the caller executes the statement once per row).  A column of
    strings or ints without NULLs is one array literal (:func:`_array_of`)."""
    parameters: dict[str, object] = {}
    for number, name in enumerate(names):
        python_type = _array_type(info.table.c[name])
        if python_type is None:
            return None
        values = list(map(operator.itemgetter(name), rows))
        kinds = set(map(type, values))
        if python_type is float and int in kinds:
            values = [float(value) if type(value) is int else value for value in values]
            kinds = set(map(type, values))
        if not kinds <= {python_type, _NONE}:
            return None
        parameters[f"a{number}"] = values if _NONE in kinds else _array_of(python_type, values)
    return parameters


def _array_of(python_type: type, values: Sequence[object]) -> object:
    """``values`` (all of ``python_type``, no None) as the driver sends them fastest: floats and ints in PostgreSQL's
    binary array format (:func:`_binary_array`: ``float8[]``, ``int8[]``, which the statement's cast reads as the
    column's type — an int beyond 64 bits, which no integer column holds, as the literal below), strings as one array
    literal (``activedb.store.array_literal``, which the statement's cast reads), anything else — bools — as the list
    itself (the driver encodes it element by element)."""
    if python_type is float:
        return _binary_array(_Float8Array, cast("list[float]", values))
    if python_type is int:
        try:
            return _binary_array(_Int8Array, cast("list[int]", values))
        except struct.error:        # (beyond 64 bits: the literal, as before)
            pass
    if python_type is int or python_type is str:
        literal = array_literal(values, False)
        if literal is not None:
            return literal
    return values


_ELEMENT_LENGTH = struct.pack(">i", 8)


class _Float8Array(bytes):
    """A ``float8[]`` in PostgreSQL's binary array format, ready to send (:func:`_binary_array`)."""

    element_oid, packed = 701, "d"


class _Int8Array(bytes):
    """An ``int8[]`` in PostgreSQL's binary array format, ready to send (:func:`_binary_array`)."""

    element_oid, packed = 20, "q"


class _Float8ArrayDumper(Dumper):
    """Sends a :class:`_Float8Array` as it is: a ``float8[]`` in binary (registered on a connection by ``_run``)."""

    format = Format.BINARY
    oid = 1022

    def dump(self, obj: bytes) -> bytes:
        return obj


class _Int8ArrayDumper(_Float8ArrayDumper):
    """Sends an :class:`_Int8Array` as it is: an ``int8[]`` in binary (registered on a connection by ``_run``)."""

    oid = 1016


_Packed = TypeVar("_Packed", _Float8Array, _Int8Array)


def _binary_array(kind: type[_Packed], values: Sequence[float] | Sequence[int]) -> _Packed:
    """``values`` (no None; floats for a :class:`_Float8Array`, ints for an :class:`_Int8Array`) as one array of
    ``kind`` in PostgreSQL's binary array format: a header (one dimension, no NULLs, element type, length, lower
    bound 1), then per element its length (8) and its eight bytes, big-endian.  Made by slicing one packed string,
    without a Python step per value (the driver's list dumper takes one per value, and the text literal a ``str`` of
    each int; a batch sends many).  Raises ``struct.error`` for an int beyond 64 bits."""
    count = len(values)
    packed = struct.pack(f">{count}{kind.packed}", *values)
    body = bytearray(12 * count)
    for offset in range(4):                      # every element's length, 8, as a big-endian int32
        body[offset::12] = _ELEMENT_LENGTH[offset:offset + 1] * count
    for offset in range(8):                      # then its eight bytes
        body[4 + offset::12] = packed[offset::8]
    return kind(struct.pack(">iiIii", 1, 0, kind.element_oid, count, 1) + body)


def _array_type(column: sa.ColumnElement[object]) -> type | None:
    return next((kind for sql_type, kind in _ARRAY_TYPES if not isinstance(column.type, sa.Enum)
                 and isinstance(column.type, sql_type)), None)


def _unnest(info: TableInfo, names: list[str]) -> sa.TableValuedAlias:
    """``unnest(:a0, :a1, …) AS v(names…)``, its binds typed as arrays of the columns' types."""
    binds = [sa.bindparam(f"a{number}", type_=postgresql.ARRAY(info.table.c[name].type))
             for number, name in enumerate(names)]
    return sa.func.unnest(*binds).table_valued(*names).render_derived(name="v")


def _key_match(info: TableInfo, derived: sa.TableValuedAlias) -> sa.ColumnElement[bool]:
    return sa.and_(*[info.table.c[name] == derived.c[name] for name in info.key_columns])


def _delete(connection: sa.Connection, info: TableInfo, rows: list[RowImage]) -> None:
    names = list(info.key_columns)
    parameters = _arrays(info, names, rows)
    if parameters is None:
        connection.execute(info.delete(), [{f"k_{name}": value for name, value in row.items()} for row in rows])
    else:
        _run(connection, lambda: sa.delete(info.table).where(_key_match(info, _unnest(info, names))), parameters,
             shape=("delete", info.table, tuple(names)))


def _update(connection: sa.Connection, info: TableInfo, columns: list[str], rows: list[RowImage]) -> None:
    names = [*info.key_columns, *columns]
    parameters = _arrays(info, names, rows)
    if parameters is None:
        connection.execute(info.update(frozenset(columns)), [
            {**{f"k_{name}": row[name] for name in info.key_columns}, **{f"v_{name}": row[name] for name in columns}}
            for row in rows])
    else:
        def statement() -> sa.Update:
            derived = _unnest(info, names)
            return sa.update(info.table).where(_key_match(info, derived)).values(
                {name: derived.c[name] for name in columns})

        _run(connection, statement, parameters, shape=("update", info.table, tuple(names)))


def _insert(connection: sa.Connection, info: TableInfo, columns: list[str], rows: list[RowImage], *,
            overriding: bool = False) -> None:
    parameters = _arrays(info, columns, rows)
    insert = _InsertOverriding if overriding else sa.Insert
    if parameters is None:
        # (``inline``: no RETURNING of the generated key — one row alone would be executed asking for it, and in
        # ``_send``'s pipeline no result is there to read until it syncs: SQLAlchemy raised ResourceClosedError.)
        connection.execute(insert(info.table).inline(), rows)
    else:
        def statement() -> sa.Insert:
            derived = _unnest(info, columns)
            return insert(info.table).from_select(columns, sa.select(*[derived.c[name] for name in columns]))

        _run(connection, statement, parameters, shape=("insert", info.table, tuple(columns), overriding))


class _InsertOverriding(sa.Insert):
    """An INSERT that says ``OVERRIDING SYSTEM VALUE`` after its column list (SQLAlchemy has no option for it)."""

    inherit_cache = True


@compiles(_InsertOverriding)
def _compile_overriding(element: _InsertOverriding, compiler: SQLCompiler, **kw: object) -> str:
    sql: str = compiler.visit_insert(element, **kw)  # type: ignore[no-untyped-call]  # (SQLAlchemy's, untyped)
    for after in (") SELECT ", ") VALUES ("):
        head, found, rest = sql.partition(after)
        if found:
            return f"{head}) OVERRIDING SYSTEM VALUE {after[2:]}{rest}"
    raise AssertionError(f"an INSERT without SELECT or VALUES: {sql}")


def _insert_drawn(connection: sa.Connection, info: TableInfo, columns: list[str], rows: list[RowImage]) -> None:
    """``_insert`` of rows whose keys, where given, were drawn from the table's sequence (``tx.insert``'s way:
    :func:`_new_rows`): a key ``GENERATED ALWAYS AS IDENTITY`` among them is the identity's own value,
    inserted ``OVERRIDING SYSTEM VALUE`` (PostgreSQL refuses it otherwise, SQLSTATE 428C9)."""
    _insert(connection, info, columns, rows, overriding=not info.always_generated.isdisjoint(columns))


# --- applying ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Options:
    """The keyword arguments of :func:`apply_at_commit`: how the batch runs and where its dead letters go."""

    strategy: str | Strategy
    processes: int | None
    split: Split
    dead_letters: str | None
    query_id: str | None
    batch_id: int | None
    letters: Callable[[BatchResult], list[deadletters.Letter]] | None
    on_result: Callable[[BatchResult, sa.Connection], None] | None
    keys_check: Callable[[], KeysCheck | None] | None = None
    on_sent: Callable[[BatchResult], None] | None = None
    check_rows: Callable[[], None] | None = None


@no_cyclic_gc()
def apply_at_commit(tx: Transaction, events: Iterable[object], transactions: StateTransactions, *,
                    strategy: str | Strategy = AUTO, processes: int | None = None, split: Split = Split.AUTO,
                    dead_letters: str | None = DEAD_LETTER_TABLE, query_id: str | None = None,
                    batch_id: int | None = None,
                    letters: Callable[[BatchResult], list[deadletters.Letter]] | None = None,
                    on_result: Callable[[BatchResult, sa.Connection], None] | None = None,
                    keys_check: Callable[[], KeysCheck | None] | None = None,
                    on_sent: Callable[[BatchResult], None] | None = None,
                    heard: Collection[str] = (), check_rows: Callable[[], None] | None = None) -> PendingBatch:
    """Enlist ``events`` as a batch that runs inside the commit of ``tx`` (the package README) and
    return its :class:`PendingBatch`.  ``dead_letters``: the table its dead letters go to (None:
    none are stored), labelled ``query_id``/``batch_id``; ``letters(result)`` → ``[Letter]``
    (``activedb.deadletters``) replaces the default ones (``dead_letter``); ``on_result(result, connection)`` is
    called inside the commit once the batch's rows and its dead letters were written; ``on_sent(result)`` before it,
    while PostgreSQL runs those statements (Python work that overlaps the server's: it must run no statement on the
    commit's connection, and an error it raises is raised once the statements were written, as ``on_result``'s
    would be); ``keys_check()`` once the batch ran: the check of the generated keys it drew
    (``Catalog.generated_keys_check``; raises for a reset found already), sent with its writes and judged before
    anything else is written (a key given out again fails the commit: a conflict).  A table rules observe makes the
    batch run through the transaction tree, whose writes they hear, unless it is one of ``heard``: tables the batch
    only inserts into whose new rows' data events the caller records itself (``apply_lowered``).  ``heard`` changes
    nothing else: a key ``GENERATED ALWAYS AS IDENTITY`` a transaction gives is refused in a heard table too, as in any
    other (a dead letter: insert without the key); only the keys ``apply_lowered``'s learned rules drew are kept.
    ``check_rows()``: for a caller whose functions leave the checks of their new rows' values to the commit's check of
    each column (``apply_lowered``'s learned rules), makes them check each row as they make it, as ``tx.insert``
    does — called before the batch runs again because a value cannot be stored, and before a batch that runs
    through the transaction tree (which checks no column at once)."""
    tx_started = time.perf_counter()
    check_processes("apply_at_commit", processes)
    options = _Options(strategy, processes, split, dead_letters, query_id, batch_id, letters, on_result, keys_check,
                       on_sent, check_rows)
    check_events("apply_at_commit", events)
    events = list(events)
    batch, refused = timed_batch(events, owner="apply_at_commit")
    runtime = runtime_of(transactions)
    router = runtime.router
    plans = router.plans
    declare = transactions.declare
    declared: dict[int, list[OpSpec] | str] = dict(refused)      # (the refused come last: the loop stops before them)
    states: dict[str, dict[Hashable, None]] = {}
    unbounded: set[str] = set()
    written: set[str] = set()
    merged: set[RoutePlan] = set()           # the plans whose tables are in ``unbounded`` and ``written`` already
    timed = batch[:len(batch) - len(refused)] if refused else batch
    keyed = keyed_states(plans, timed) if plans else None
    if keyed is not None:           # (every event's row named by its key, predicted at once)
        states = keyed[0]
        for used in keyed[1]:
            unbounded.update(used.unbounded)
            written |= used.written
        timed = []
    for t, event in enumerate(timed):
        plan = plans.get(event[0])
        predicted = plan.states(event) if plan is not None else None
        if plan is not None and predicted is not None:
            try:
                for table, key in predicted:
                    keys = states.get(table)
                    if keys is None:
                        states[table] = {key: None}
                    else:
                        keys[key] = None
            except TypeError:          # an unhashable key: declare the event instead
                predicted = None
            else:
                if plan not in merged:
                    merged.add(plan)
                    unbounded.update(plan.unbounded)
                    written |= plan.written
                continue
        try:
            specs = declare(event)
        except Exception as error:
            declared[t] = f"{type(error).__name__}: {error}"
            continue
        declared[t] = specs
        if event[0] not in plans and event[0] not in router.unroutable:
            router.learn(event, specs)
        add_touched(specs, states, unbounded, written)
    extensions = tx.manager.extensions
    observed = sorted(table for table in written if table not in heard and extensions.any("wants_old_images", table))
    if observed:
        if check_rows is not None:
            check_rows()
        result = apply_batch(tx, events, transactions, strategy=options.strategy, processes=options.processes,
                             split=options.split)
        result.notes.append(f"ran through the transaction tree: {', '.join(observed)} observed by rules")
        pending = PendingBatch(transactions, batch, declared, {}, set(), options, ready=result)
    else:
        catalog = tx.manager.catalog
        try:
            normalised = {table: _normalised_keys(catalog.table_info(table), given) for table, given in states.items()}
            for table in (*written, *unbounded):   # the tables only inserted into, or named by computed keys, too
                catalog.table_info(table)
        except SchemaError:
            normalised = _refuse_unstorable(catalog, batch, plans, declared, states, written, unbounded)
        if name_rows_once(catalog, declare, batch, declared, normalised, unbounded):
            options = replace(options, split=Split.NEVER)     # (a worker would declare its events again)
        pending = PendingBatch(transactions, batch, declared, normalised, unbounded, options)
        pending.seconds["apply"] = time.perf_counter() - tx_started
    lowlevel.enlist(tx, pending)
    return pending


def _refuse_unstorable(catalog: Catalog, batch: list[BatchEvent], plans: Mapping[str, RoutePlan],
                       declared: dict[int, list[OpSpec] | str], states: Mapping[str, Mapping[Hashable, None]],
                       written: Iterable[str] = (), unbounded: set[str] | None = None
                       ) -> dict[str, dict[Hashable, Key]]:
    """Some declared row cannot be named in the store (a table that does not exist, a key of the wrong type or
    one PostgreSQL cannot hold): refuse the events that touch such a row or write such a table, or name one by a key
    computed at run time (``declared[t]`` the reason, so that each is a dead letter alone, as a transaction that could
    not be declared is) and return the normalised keys of the rest; such a table leaves ``unbounded``."""
    bad_tables: dict[str, str] = {}
    for table in {*written, *(unbounded or ())}:
        try:
            catalog.table_info(table)
        except SchemaError as error:
            bad_tables[table] = f"{type(error).__name__}: {error}"
    bad: dict[State, str] = {}
    for table, given in states.items():
        try:
            info = catalog.table_info(table)
        except SchemaError as error:
            bad.update(((table, key), f"{type(error).__name__}: {error}") for key in given)
            continue
        for key in given:
            try:
                info.key(key)
            except SchemaError as error:
                bad[(table, key)] = f"{type(error).__name__}: {error}"
    kept: dict[str, dict[Hashable, None]] = {}
    for t, event in enumerate(batch):
        known = declared.get(t)
        if isinstance(known, str):
            continue
        touched = (plans[event[0]].states(event) or []) if known is None else touched_states(known)[0]
        reason = next((bad[state] for state in touched if state in bad), None)
        if reason is None and bad_tables:
            plan = plans[event[0]] if known is None else None
            tables = ((*plan.written, *plan.unbounded) if plan is not None
                      else (*written_tables(known), *touched_states(known)[1]))    # type: ignore[arg-type]
            reason = next((bad_tables[table] for table in tables if table in bad_tables), None)
        if reason is not None:
            declared[t] = reason
            continue
        for table, key in touched:
            kept.setdefault(table, {})[key] = None
    if unbounded is not None:
        unbounded.difference_update(bad_tables)
    return {table: _normalised_keys(catalog.table_info(table), given) for table, given in kept.items()}


def _normalised_keys(info: TableInfo, given_keys: Iterable[Hashable]) -> dict[Hashable, Key]:
    """``{key as declared: key tuple}``, checked as ``info.key`` checks (a column of plain ints by
    its extremes)."""
    given = list(given_keys)
    if len(info.key_columns) == 1 and given and set(map(type, given)) == _INT:
        info.key(min(given))  # type: ignore[type-var]  # (ints)
        info.key(max(given))  # type: ignore[type-var]
        return dict(zip(given, zip(given)))        # ({key: (key,) for key in given}, in C)
    return {key: info.key(key) for key in given}
