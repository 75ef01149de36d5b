"""The store integration through the transaction tree: :func:`apply_batch` (inside a transaction the
caller owns) and :func:`run_batch` (its own transaction).  The package README, "Running a batch in the
store", says what they do and compares them with :func:`apply_at_commit`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Hashable

from activedb import deadletters
from activedb._gc import no_cyclic_gc
from activedb.batch._declare import (BatchEvent, DrawnRow, OpSpec, State, StateTransactions, canonical_key,
                                     inserted_parts, specs_of)
from activedb.batch._result import BatchResult
from activedb.batch._route import touched_states
from activedb.batch._runtime import AUTO, check_processes, execute_batch, prepare
from activedb.batch._state import NestedColumns, WriteCheck
from activedb.batch._strategy import Split, Strategy
from activedb.batch.errors import DeclarationError
from activedb.errors import InvalidKey, InvalidValue, SchemaError, UnknownTable
from activedb.store import Catalog, Json, Key, RowImage, TableInfo
from activedb.txn import BulkLock

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.txn import CommitParticipant, Transaction

DEAD_LETTER_TABLE = deadletters.TABLE
_MISSING = object()


@no_cyclic_gc()        # tens of thousands of small objects: no cyclic collection meanwhile
def apply_batch(tx: Transaction, events: Iterable[object], transactions: StateTransactions, *,
                strategy: str | Strategy = AUTO, processes: int | None = None, split: Split = Split.AUTO,
                lock: BulkLock = BulkLock.WRITE) -> BatchResult:
    """Run ``events`` as one batch of state transactions inside the open transaction ``tx``
    and leave the final rows in its write set.  Does not commit and does not write dead
    letters: ``result.dead_letters`` lists ``(event, reason)`` for the caller to store.
    ``lock``: ``BulkLock.WRITE`` (WRITE row locks on every declared row, taken when they are read) or
    ``BulkLock.TABLE`` (one WRITE lock per table the batch touches)."""
    from activedb.batch._commit import _normalised_keys, _refuse_unstorable      # (_commit imports this module)

    check_processes("apply_batch", processes)
    lock = BulkLock.parse(lock, "apply_batch(lock=...)", allowed=(BulkLock.WRITE, BulkLock.TABLE))
    prepared = prepare(transactions, events)
    started = time.perf_counter()
    catalog = tx.manager.catalog
    declared, states = prepared.declared(), prepared.states_by_table()
    try:
        for table, keys in states.items():
            _normalised_keys(catalog.table_info(table), keys)
    except SchemaError:
        # An event names a row the store cannot name: it is a dead letter alone, as at commit (``_commit.py``).
        kept = _refuse_unstorable(catalog, prepared.batch, {}, declared,
                                  {table: dict.fromkeys(keys) for table, keys in states.items()})
        states = {table: list(keys) for table, keys in kept.items()}
    # (The rows of tables whose key is converted, by their normalised keys: the others cannot be named two ways.)
    infos = {table: catalog.table_info(table) for table in states}
    normalised = {table: {key: infos[table].key(key) for key in keys} for table, keys in states.items()
                  if infos[table].converts_keys}
    computed = {table for specs in prepared.specs for table in touched_states(specs)[1]}
    if name_rows_once(catalog, transactions.declare, prepared.batch, declared, normalised, computed):
        states.update((table, list(keys)) for table, keys in normalised.items())
        split = Split.NEVER          # (a worker would declare its events again)
    check = named_once(catalog, normalised)

    def load(table: str, key: Hashable) -> RowImage | None:
        try:
            info = catalog.table_info(table)
            if info.converts_keys:
                check(table, key, info.key(key))
            return tx.read(table, key)
        except (InvalidKey, InvalidValue, UnknownTable) as error:   # a computed key that cannot name a row: the op fails
            raise DeclarationError(f"the row {key!r} of {table!r} cannot exist: {error}") from None

    base: dict[State, RowImage | None] = {(table, key): image for table, keys in states.items()
                                           for key, image in tx.read_many(table, keys, lock=lock).items()}
    prefetch_seconds = time.perf_counter() - started
    nested = NestedColumns(catalog.table_info)     # (the lean executor's copies of a function's argument)
    result = execute_batch(transactions, prepared.batch, base, loader=load, declared=declared,
                           strategy=strategy, processes=processes, split=split, declare_seconds=prepared.seconds,
                           nested=nested)
    started = time.perf_counter()
    recreated: dict[str, list[Hashable]] = {}
    by_table = _changes(result, base, recreated)
    refused = _unstorable(catalog, by_table, result, recreated)
    if refused is not None:
        # A transaction wrote a value the store cannot hold: run the batch again checking each transaction's
        # values as it ends, so that exactly those transactions abort (as at commit, ``_commit.py``).
        result = execute_batch(transactions, prepared.batch, base, loader=load, declared=declared,
                               strategy="lean", split=Split.NEVER, check=store_check(catalog, result.before, ()),
                               nested=nested)
        result.notes.append(f"ran again checking each transaction's values: {refused}")
        recreated.clear()
        by_table = _changes(result, base, recreated)
    for table, keys in recreated.items():       # deleted first: the tree writes the new row in their place
        tx.write_many(table, dict.fromkeys(keys), lock=lock)
    written = sum(tx.write_many(table, rows, lock=lock)
                  for table, rows in by_table.items())
    for table, rows in result.inserted().items():      # new rows: their keys drawn as tx.insert draws them
        for row in rows:
            tx.insert(table, **row)
        written += len(rows)
    if result.statistics is not None:
        result.statistics.seconds.update(prefetch=prefetch_seconds, write=time.perf_counter() - started)
    result.notes.append(f"{written} rows written")
    return result


def row_aliases(catalog: Catalog, normalised: Mapping[str, Mapping[Hashable, Key]]) -> dict[State, State]:
    """``{state: the state naming its row by its key as PostgreSQL gives it back}`` for the states of a batch that
    name one row by keys that differ in Python (``0.1`` and ``Decimal('0.1')`` of a numeric key, a uuid's text and
    its ``UUID``: ``TableInfo.key`` makes them one key), or ``{}``.  Only a table whose key is converted can have
    them (``TableInfo.converts_keys``): the other tables cost one test each."""
    aliases: dict[State, State] = {}
    for table, keys in normalised.items():
        if len(keys) < 2 or not catalog.table_info(table).converts_keys:
            continue
        by_key: dict[Key, list[Hashable]] = {}
        for given, key in keys.items():
            by_key.setdefault(key, []).append(given)
        aliases.update(((table, given), (table, canonical_key(key)))
                       for key, named in by_key.items() if len(named) > 1 for given in named)
    return aliases


def name_rows_once(catalog: Catalog, declare: Callable[[BatchEvent], list[OpSpec]], batch: list[BatchEvent],
                   declared: dict[int, list[OpSpec] | str], normalised: dict[str, dict[Hashable, Key]],
                   computed: Iterable[str]) -> bool:
    """Name each row the batch names two ways by one state, if there can be such rows: rows of ``normalised``
    (table → {key: normalised key}) named by keys that differ in Python (``row_aliases``), or a key computed at run
    time (a non-deterministic operation's) of a table of ``computed`` whose key is converted.  Then every event is
    declared (an event routed by a plan is declared here, not by the executor), its operations' states, keys, reads
    and candidates renamed, its computed keys renamed as they are computed (``_named_key``), and so ``normalised``
    — else each state would read the row as of before the batch, and the one written last would lose the others'
    changes.  A transaction that so writes one row twice is refused, as ``Ops`` refuses a row written twice.
    Returns whether it renamed (the batch must then run unsplit: a worker would declare its events again)."""
    aliases = row_aliases(catalog, normalised)
    computed = {table for table in computed if _converts_keys(catalog, table)}
    if not aliases and not computed:
        return False
    names = {table: (catalog.table_info(table), {key: aliases.get((table, given), (table, given))[1]
                                                 for given, key in normalised.get(table, {}).items()})
             for table in {*computed, *(table for table in normalised if _converts_keys(catalog, table))}}
    for t, event in enumerate(batch):
        specs = specs_of(declare, event, declared.get(t))
        if isinstance(specs, str):
            declared[t] = specs
            continue
        renamed = [_renamed(spec, aliases, names) for spec in specs]
        written = [spec.state for spec in renamed if spec.state is not None and spec.kind.writes]
        if len(set(written)) < len(written):
            twice = next(state for state in written if written.count(state) > 1)
            declared[t] = (f"DeclarationError: event {event.event_type!r} at position {event.position} writes "
                           f"{twice!r} twice, by two values of its key; a state transaction writes a row at most once")
            continue
        declared[t] = renamed
    for table in {table for table, _ in aliases}:
        normalised[table] = {aliases.get((table, given), (table, given))[1]: key
                             for given, key in normalised[table].items()}
    return True


def _converts_keys(catalog: Catalog, table: str) -> bool:
    try:
        return catalog.table_info(table).converts_keys
    except SchemaError:         # (no such table: its operations fail where they name a row)
        return False


def named_once(catalog: Catalog, normalised: Mapping[str, Mapping[Hashable, Key]]
               ) -> Callable[[str, Hashable, Key], None]:
    """``check(table, key, normalised key)`` for a row a batch loads on demand (a non-deterministic operation's
    computed key, a route plan that missed) of a table whose key is converted (``TableInfo.converts_keys``): raises
    :class:`DeclarationError` (the operation fails) if the batch names that row by another key already
    (``normalised``: its declared rows, table → {key: normalised key}; or an earlier load) — a second state would
    lose one's changes.  It keeps its own index of those tables' rows only, not ``normalised``: a batch's keys are
    dropped once it ran (``PendingBatch._release``), for the collector's sake, whoever keeps its loader."""
    names = {table: {value: given for given, value in keys.items()}      # table -> {normalised key: its name}
             for table, keys in normalised.items() if catalog.table_info(table).converts_keys}

    def check(table: str, key: Hashable, normalised_key: Key) -> None:
        other = names.setdefault(table, {}).setdefault(normalised_key, key)
        if other != key:
            raise DeclarationError(f"the row {key!r} of {table!r} is the row this batch names {other!r}: name a row "
                                   f"by one value of its key (as PostgreSQL gives it back: "
                                   f"{canonical_key(normalised_key)!r})")

    return check


def _renamed(spec: OpSpec, aliases: Mapping[State, State], names: Mapping[str, tuple[TableInfo, dict[Key, Hashable]]]
             ) -> OpSpec:
    """``spec`` naming its rows by ``aliases`` (:func:`name_rows_once`); a non-deterministic operation's computed
    key by ``names`` (``_named_key``)."""
    table, state = spec.table, spec.state
    if state is not None:
        state = aliases.get(state, state)
    candidates = spec.candidates
    if candidates is not None:
        candidates = tuple(dict.fromkeys(aliases.get((table, key), (table, key))[1] for key in candidates))
    key_fn = spec.key_fn
    if key_fn is not None and table in names:
        key_fn = partial(_named_key, *names[table], key_fn)
    return spec._replace(key=spec.key if state is None else state[1], state=state, candidates=candidates,
                         key_fn=key_fn, params=tuple(aliases.get(param, param) for param in spec.params))


def _named_key(info: TableInfo, names: dict[Key, Hashable], key_fn: Callable[..., Hashable],
               *images: RowImage | None) -> Hashable:
    """The key ``key_fn(*images)`` computes, as the batch names its row (``names``: normalised key → that name, a
    row first named so being named by this key from then on); a key that cannot name a row of ``info``'s table as it
    is (the loader says why)."""
    key = canonical_key(key_fn(*images))
    try:
        return names.setdefault(info.key(key), key)
    except SchemaError:
        return key


def _changes(result: BatchResult, base: Mapping[State, RowImage | None], recreated: dict[str, list[Hashable]]
             ) -> dict[str, dict[Hashable, RowImage | None]]:
    """Table → key → the columns the batch changed (None: delete), from ``result``'s final rows; the rows the batch
    deleted and created again (a write keeps every column its row had; only a new row's image is the written columns)
    added to ``recreated``, table → keys, their changes the new row's columns (to be written after a delete)."""
    by_table: dict[str, dict[Hashable, RowImage | None]] = {}
    for (table, key), image in result.final.items():
        old = result.before.get((table, key), base.get((table, key)))
        if image is None:
            if old is not None:
                by_table.setdefault(table, {})[key] = None
            continue
        if old is not None and len(image) < len(old) and not old.keys() <= image.keys():
            recreated.setdefault(table, []).append(key)
            old = None
        if old is None:
            changes = dict(image)
        else:
            changes = {column: value for column, value in image.items() if old.get(column, _MISSING) != value}
        if changes:
            by_table.setdefault(table, {})[key] = changes
    return by_table


def _unstorable(catalog: Catalog, by_table: Mapping[str, Mapping[Hashable, RowImage | None]],
                result: BatchResult, recreated: Mapping[str, list[Hashable]]) -> str | None:
    """Why some changed value or new row of ``result`` cannot be stored (what ``tx.write_many``/``tx.insert``
    or the flush would raise, checked before anything is written), or None.  ``recreated``: rows deleted and created
    again (``_changes``), new rows whose key is their own."""
    try:
        for table, rows in by_table.items():
            info = catalog.table_info(table)
            again = recreated.get(table, ())
            for key, changes in rows.items():
                if changes is not None:
                    if key in again:
                        check_required(info, changes.keys(), f"the new row {key!r} of {table!r}")
                    elif result.before.get((table, key)) is None:
                        info.refuse_new_row_by_key(key)
                        check_required(info, changes.keys(), f"the new row {key!r} of {table!r}")
                    info.check_values(changes, copy=False)
                    check_key_columns(info, key, changes, info.full_key_row(info.key(key)))
        for table, new_rows in result.inserted().items():
            _check_inserted(catalog, table, new_rows, refuse_given_keys=True)
    except SchemaError as error:
        return f"{type(error).__name__}: {error}"
    return None


def _check_inserted(catalog: Catalog, table: str, rows: Sequence[RowImage], refuse_given_keys: bool) -> None:
    """New rows of ``table`` (an INSERT's): each names the NOT NULL columns and holds values the table takes; with
    ``refuse_given_keys``, then, none but a ``DrawnRow`` gives a key ``GENERATED ALWAYS`` (``NO_GIVEN_KEY``)."""
    info = catalog.table_info(table)
    for row in rows:
        check_required(info, row.keys(), f"a row inserted into {table!r}")
        info.check_values(row, copy=False)
    if refuse_given_keys:
        for row in rows:
            if type(row) is not DrawnRow:
                info.refuse_given_identity(row, f"a row inserted into {table!r}", NO_GIVEN_KEY)


def check_required(info: TableInfo, columns: Iterable[str], what: str) -> None:
    """``columns`` (names) of a new row of ``info``'s table must name every NOT NULL column without a default."""
    missing = info.required.difference(columns)
    if missing:
        raise InvalidValue(f"{what} has no value for the NOT NULL column(s) {', '.join(sorted(missing))} of "
                           f"{info.name!r}; give them (nothing was written)")


#: What a row an INSERT operation returned with a key ``GENERATED ALWAYS AS IDENTITY`` is told to do
#: (``TableInfo.refuse_given_identity``): an INSERT leaves keys to the store (the package README).
NO_GIVEN_KEY = "leave {name} out of the INSERT operation's rows: the store draws the key"


def check_key_columns(info: TableInfo, given: Hashable, values: Mapping[str, object], key_row: Mapping[str, object]
                      ) -> None:
    """A written image must keep its row's key columns (``key_row``)."""
    for name, value in key_row.items():
        if name in values and values[name] != value:
            raise InvalidKey(f"a write function of the batch changed {info.name}.{name} of row {given!r} to "
                             f"{values[name]!r}; the key of a row cannot change — write another row instead")



def store_check(catalog: Catalog, before: Mapping[State, RowImage | None] | None = None,
                drawn: Collection[str] | None = None) -> WriteCheck:
    """``check(writes, outputs)`` for ``execute_batch``: why one transaction's written images and new rows
    cannot be stored (the reason of the ``SchemaError`` a write of them would raise), or None.  ``before``: the
    rows' images before the batch (a state absent or None: a new row), when the batch's writes are stored as they
    are (at commit) — a new row of a table whose key is GENERATED ALWAYS is refused; ``drawn``: then too, the tables
    whose inserted rows' keys the batch drew (any other key GENERATED ALWAYS an INSERT gives is refused, unless its
    row is a ``DrawnRow``: drawn by the batch's caller)."""
    def check(writes: list[tuple[State, RowImage | None]], outputs: dict[str, object] | None) -> str | None:
        try:
            for (table, key), image in writes:
                if image is not None:
                    info = catalog.table_info(table)
                    if before is not None and before.get((table, key)) is None:
                        info.refuse_new_row_by_key(key)
                    check_required(info, image.keys(), f"the row {key!r} of {table!r}")
                    info.check_values(image, copy=False)
                    check_key_columns(info, key, image, info.full_key_row(info.key(key)))
            for output in (outputs or {}).values():
                for part in inserted_parts(output):
                    _check_inserted(catalog, part.table, part.rows, drawn is not None and part.table not in drawn)
        except SchemaError as error:
            return f"{type(error).__name__}: {error}"
        return None

    return check


def dead_letter(event: BatchEvent, reason: str) -> deadletters.Letter:
    """The dead letter for ``event``: the event's fields, kept exactly."""
    return deadletters.Letter(reason, {"event_type": event.event_type, "key": event.key, "ts": event.ts,
                                       "payload": event.payload})


def dead_letter_row(event: BatchEvent) -> dict[str, Json]:
    """The readable ``raw`` JSON of a dead letter for ``event``."""
    return dead_letter(event, "").raw()


def run_batch(db: DatabaseHandle, events: Iterable[object], transactions: StateTransactions, *, strategy: str | Strategy = AUTO,
              participants: Iterable[CommitParticipant] = (), query_id: str | None = None, batch_id: int | None = None,
              dead_letters: bool = True, processes: int | None = None, split: Split = Split.AUTO) -> BatchResult:
    """Convenience for users feeding events directly: one top-level transaction that applies the batch and
    inserts its dead letters into ``activedb_dead_letters`` (labelled with ``query_id``/``batch_id`` if
    given); ``participants`` take part in its commit (e.g. a ledger row written in the same PostgreSQL
    transaction); commits on return."""
    with db.transaction(name="batch:tpg", participants=participants) as tx:
        result = apply_batch(tx, events, transactions, strategy=strategy, processes=processes, split=split)
        letters = result.dead_letters
        if dead_letters:
            deadletters.insert(tx, query_id, batch_id,
                               [dead_letter(event, reason) for event, reason in letters])
        tx.info.update(events=len(result.committed), dead_letters=len(letters))
    return result
