"""Declared state transactions: the data the planner sees (PRE_PROCESS of the paper, §7.1).

:class:`StateTransactions` (``@transactions.on(type)``), the recorder :class:`Ops`, :class:`Abort`,
:data:`DELETE`; what a declaring function may do: the package README, "Declaring".

Thread-safety: registration (``on``) is for set-up time; ``declare`` may run on any thread
and in worker processes (the object pickles its declarations only).
"""

from __future__ import annotations

import enum
import functools
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Hashable, NamedTuple, TypeAlias, TypeVar

from activedb.errors import ActivedbError, check_whole_number
from activedb.batch._strategy import DecisionRule
from activedb.batch.errors import DeclarationError, UnknownEventType
from activedb.store import RowImage

if TYPE_CHECKING:  # pragma: no cover
    from activedb.batch._runtime import Runtime

#: One row a declaration names: ``(table, key)``, the key a scalar or a tuple (hashable, not None).
State: TypeAlias = "tuple[str, Hashable]"
#: A declaring function: ``fn(event, ops)`` records the state transaction of one event.
Declaring: TypeAlias = "Callable[[BatchEvent, Ops], None]"
_D = TypeVar("_D", bound=Declaring)


class Abort(ActivedbError):
    """Raised by an operation's function: its state transaction aborts with this reason."""


class _Delete:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETE"

    def __reduce__(self) -> str:
        return "DELETE"


#: Returned by a write function: delete the row.
DELETE = _Delete()


class OpKind(enum.Enum):
    READ = "read"                     # READ(table, key): output the row
    WRITE = "write"                   # WRITE(table, key, f(own, *reads))
    CHECK = "check"                   # abort_if(predicate(*reads)): reads only, may abort
    WINDOW_READ = "window_read"       # READ(win_f(keys, size)): aggregate versions of earlier txns, time >= t - size
    WINDOW_WRITE = "window_write"     # WRITE(key, win_f(over, size))
    ND_READ = "nd_read"               # READ(f*): key computed at run time
    ND_WRITE = "nd_write"             # WRITE(f1*, f2*): key and value computed at run time
    INSERT = "insert"                 # INSERT(table, f(*reads)): new rows, their keys the store's to generate

    @property
    def writes(self) -> bool:
        return self in WRITING_KINDS

    @property
    def windowed(self) -> bool:
        return self in (OpKind.WINDOW_READ, OpKind.WINDOW_WRITE)


#: The kinds of operation that write (``OpKind.writes``).
WRITING_KINDS = frozenset({OpKind.WRITE, OpKind.WINDOW_WRITE, OpKind.ND_WRITE, OpKind.INSERT})


class Inserted(NamedTuple):
    """The output of an INSERT operation: the rows it adds to ``table`` (each a dict of columns) when its
    transaction commits."""

    table: str
    rows: tuple[RowImage, ...]


class DrawnRow(dict[str, object]):
    """A new row whose key was drawn from its table's sequence by the batch's own caller, as ``tx.insert`` draws it (a
    learned rule's insert into a table whose rows rules hear: ``_learn._RowTransaction.insert``).  The marker is what
    tells such a key from one a transaction gave: at commit a row of a table whose key is ``GENERATED ALWAYS AS
    IDENTITY`` giving its key is inserted with that key only if it is a ``DrawnRow``, and refused otherwise
    (``TableInfo.refuse_given_identity``).  Kept as it is by ``inserted``."""

    __slots__ = ()


class InsertedInto(NamedTuple):
    """The output of an INSERT into several tables (``ops.insert_into``): one :class:`Inserted` per table it adds
    rows to, in the order of its declared tables."""

    parts: tuple[Inserted, ...]


def inserted_parts(output: object) -> tuple[Inserted, ...]:
    """The :class:`Inserted` of an operation's output that add rows (none for any other output)."""
    kind = type(output)
    if kind is Inserted:
        return (output,) if output.rows else ()  # type: ignore[attr-defined,return-value]  # (an Inserted)
    if kind is InsertedInto:
        return output.parts  # type: ignore[attr-defined,no-any-return]  # (an InsertedInto)
    return ()


_EMPTY: Mapping[str, Any] = MappingProxyType({})


class BatchEvent(NamedTuple):
    """One event of a batch, as declaring functions see it.  ``position`` is its index in the
    batch as given; ``ts`` its application time (None: the position stands for it).

    Immutable (a named tuple: cheap to make, to pickle and to read — a batch makes one per event)."""

    event_type: str
    key: Any = None
    ts: Any = None
    payload: Mapping[str, Any] = _EMPTY
    position: int = 0


class OpSpec(NamedTuple):
    """One declared state-access operation.  ``key`` is None for a non-deterministic op (its
    ``key_fn`` computes it); ``params`` are the ``(table, key)`` states its function reads
    (besides its own row); ``size`` is the window size (event-time units) of window ops;
    ``state`` is ``(table, key)`` (None for a non-deterministic op).

    A named tuple: a batch makes one per declared operation, so it is cheap to make."""

    kind: OpKind
    table: str
    key: Any
    params: tuple[State, ...] = ()
    # (None where the kind calls none: a READ has no ``fn``, only non-deterministic ops have a ``key_fn``)
    fn: Callable[..., Any] = None  # type: ignore[assignment]
    key_fn: Callable[..., Hashable] = None  # type: ignore[assignment]
    size: Any = None
    reason: str | None = None
    name: str | None = None
    candidates: tuple[Hashable, ...] | None = None   # ND ops: the keys it may access, if known
    state: State | None = None                  # (None for a non-deterministic op)
    tables: tuple[str, ...] | None = None       # insert_into: its tables (``table`` is the first)


_new_spec = _new_inserted = tuple.__new__
_READ, _WRITE, _CHECK, _INSERT = OpKind.READ, OpKind.WRITE, OpKind.CHECK, OpKind.INSERT


def _bad_pair(pair: object, what: str) -> DeclarationError:
    if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
        return DeclarationError(f"{what} must be (table, key) pairs, got {pair!r}; "
                                f"write reads=[('accounts', 7)] for the row 7 of table accounts")
    if pair[1] is None:
        return DeclarationError(f"a key in {what} is None; name the row by a scalar or a tuple")
    return DeclarationError(f"the key {pair[1]!r} in {what} is not hashable; use a scalar or a tuple (or a list of "
                            f"a key's several values)")


def state_of(spec: OpSpec) -> State:
    """The state ``spec`` names — a deterministic op's (READ, WRITE, CHECK, the window ops): only the
    non-deterministic ops and the inserts have none."""
    state = spec.state
    if state is None:
        raise AssertionError(f"a {spec.kind.value} on {spec.table} declared without its state")
    return state


def canonical_key(key: Hashable) -> Hashable:
    """The key by which a batch's states name a row: a one-tuple names the row of its element, as the store reads
    it (``TableInfo.key`` takes ``"k"`` and ``("k",)`` for one row), so that a batch never holds one row as two
    states — each read as of before the batch, and the one written last would lose the other's changes.  A list of
    several values names the row of their tuple, as the store reads it (``TableInfo.named``: a key of several
    columns; a list of one value stays a list, which no state can be)."""
    if isinstance(key, tuple):
        return key[0] if len(key) == 1 else key
    given: object = key     # (typed Hashable, but a list is taken too)
    return tuple(given) if isinstance(given, list) and len(given) > 1 else key


def _state(pair: object, what: str) -> State:
    if type(pair) is tuple and len(pair) == 2 and type(pair[0]) is str and pair[1] is not None:
        key = canonical_key(pair[1])
        try:
            hash(key)
        except TypeError:
            raise _bad_pair(pair, what) from None
        if key is pair[1]:
            return pair
        if key is None:
            raise _bad_pair((pair[0], None), what)
        return (pair[0], key)
    if isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and pair[1] is not None:
        return _state((str(pair[0]), pair[1]), what)
    raise _bad_pair(pair, what)


class Ops:
    """The recorder a declaring function fills; one per event.  Not thread-safe (one event).

    ``windowed`` is set when the event declared a window operation (the lean executor then
    keeps the versions windows read); ``named_insert`` when it gave an INSERT a name (the declaring paths then call
    :meth:`refuse_names_shared_with_inserts`)."""

    __slots__ = ("event", "specs", "_written", "windowed", "named_insert")

    def __init__(self, event: BatchEvent) -> None:
        self.event = event
        self.specs: list[OpSpec] = []
        self._written: set[State] | None = None
        self.windowed = False
        self.named_insert = False

    def refuse_names_shared_with_inserts(self) -> None:
        """Raise :class:`DeclarationError` if an INSERT shares its name with another operation of the transaction:
        outputs are kept by name, and an INSERT's rows are its output (``BatchResult.inserted``, what a commit
        inserts), so one of the two would be lost."""
        names = [spec.name for spec in self.specs]
        for spec in self.specs:
            if spec.kind is OpKind.INSERT and spec.name is not None and names.count(spec.name) > 1:
                raise DeclarationError(
                    f"event {self.event.event_type!r} at position {self.event.position} names two of its operations "
                    f"{spec.name!r}, one of them an insert: outputs are kept by name, so one would be lost; give each "
                    f"operation its own name=")

    def _params(self, reads: Iterable[object], own: State | None, what: str) -> tuple[State, ...]:
        params: list[State] = []
        for pair in reads:
            if (type(pair) is tuple and len(pair) == 2 and type(pair[0]) is str and pair[1] is not None
                    and not isinstance(pair[1], (tuple, list))):
                try:
                    hash(pair[1])
                except TypeError:
                    raise _bad_pair(pair, what) from None
            else:
                pair = _state(pair, what)
            if pair != own and pair not in params:
                params.append(pair)
        return tuple(params)

    def _insert_params(self, reads: Iterable[object]) -> tuple[State, ...]:
        """An INSERT's ``reads`` as states (no own row)."""
        if (type(reads) is list or type(reads) is tuple) and len(reads) == 1:    # (the common case)
            pair = reads[0]
            if not (type(pair) is tuple and len(pair) == 2 and type(pair[0]) is str and pair[1] is not None
                    and type(pair[1]) in _PLAIN_KEYS):
                pair = _state(pair, "reads")
            return (pair,)
        return self._params(reads, None, "reads")

    def _check_key(self, table: str, key: Hashable) -> State:
        if type(table) is not str:
            if not isinstance(table, str):
                raise DeclarationError(f"a table is named by a string, got {table!r}")
            table = str(table)
        return _state((table, key), "an operation's row")

    def _claim(self, state: State) -> None:
        written = self._written
        if written is None:
            self._written = {state}
            return
        if state in written:
            raise DeclarationError(
                f"event {self.event.event_type!r} at position {self.event.position} writes {state!r} twice; "
                f"a state transaction writes a row at most once: compute both changes in one write function")
        written.add(state)

    def read(self, table: str, key: Hashable, *, name: str | None = None) -> None:
        """READ(table, key): the row as of before this transaction becomes output ``name``."""
        state = self._check_key(table, key)
        self.specs.append(_new_spec(OpSpec, (_READ, state[0], state[1], (), None, None, None, None,
                                             name or f"{table}[{key!r}]", None, state, None)))

    def write(self, table: str, key: Hashable, fn: Callable[..., Mapping[str, object] | _Delete], *, reads: Iterable[State] = (),
              name: str | None = None) -> None:
        """WRITE(table, key, fn(own, *reads)): ``fn`` gets the row's image and the images of
        ``reads`` (in order, own row excluded) and returns the columns to set (a mapping),
        :data:`DELETE`, or raises :class:`Abort`.  The written row is the output ``name`` if given."""
        # The hot path of declaring: the checks of _check_key and _claim, inlined.
        kind = key.__class__
        # (``key`` is typed Hashable, but a list is taken too: the values of a key of several columns.)
        if kind is not str and kind is not int and (
                isinstance(key, list) or isinstance(key, tuple) and len(key) == 1):  # type: ignore[unreachable]
            key = canonical_key(key)
        state = (table, key) if type(table) is str and key is not None else self._check_key(table, key)
        written = self._written
        try:
            if written is None:
                self._written = {state}
            elif state in written:
                self._claim(state)
            else:
                written.add(state)
        except TypeError:
            raise _bad_pair(state, "an operation's row") from None
        self.specs.append(_new_spec(OpSpec, (_WRITE, state[0], key, self._params(reads, state, "reads") if reads
                                             else (), fn, None, None, None, name, None, state, None)))

    def abort_if(self, predicate: Callable[..., object], *, reads: Iterable[State], reason: str) -> None:
        """Abort the transaction with ``reason`` if ``predicate(*images of reads)`` is true."""
        pairs = [_state(pair, "reads") for pair in reads]
        if not pairs:
            raise DeclarationError("abort_if needs at least one (table, key) in reads")
        own = pairs[0]
        self.specs.append(_new_spec(OpSpec, (_CHECK, own[0], own[1], self._params(pairs[1:], own, "reads"),
                                             predicate, None, None, reason, None, None, own, None)))

    def window_read(self, table: str, keys: Iterable[Hashable], *, size: float, aggregate: Callable[..., object],
                    name: str | None = None) -> None:
        """READ(win_f(keys, size)): ``aggregate(windows)`` over, per key, the list of row versions
        written in this batch by earlier transactions with time ≥ ``t - size`` (ties included: an earlier
        transaction at the event's own time ``t`` is in it, so ``size=0`` sees those)."""
        if isinstance(keys, str):       # (an iterable of its letters: their rows, not its own)
            raise DeclarationError(f"window_read({table!r}, keys) takes a collection of keys, got the text {keys!r}; "
                                   f"for that one row: window_read({table!r}, [{keys!r}], ...)")
        keys = list(dict.fromkeys(keys))
        if not keys:
            raise DeclarationError("window_read needs at least one key")
        own = self._check_key(table, keys[0])
        params = self._params([(table, key) for key in keys[1:]], own, "keys")
        _check_size(size, f"window_read({table!r}, keys, ...)")
        self.windowed = True
        self.specs.append(OpSpec(OpKind.WINDOW_READ, own[0], own[1], params, fn=aggregate, size=size,
                                 name=name or _default_name(self.specs, f"window:{table}"), state=own))

    def window_write(self, table: str, key: Hashable, fn: Callable[..., Mapping[str, object] | _Delete], *,
                     over: Iterable[State], size: float,
                     name: str | None = None) -> None:
        """WRITE(key, win_f(over, size)): ``fn(own, windows)``, ``windows`` = per ``over`` state
        the list of its versions written in this batch by earlier transactions with time ≥ ``t - size`` (ties
        included, as in ``window_read``)."""
        state = self._check_key(table, key)
        self._claim(state)
        over = [_state(pair, "over") for pair in over]
        if not over:
            raise DeclarationError("window_write needs at least one (table, key) in over")
        _check_size(size, f"window_write({table!r}, {key!r}, ...)")
        self.windowed = True
        self.specs.append(OpSpec(OpKind.WINDOW_WRITE, state[0], state[1], tuple(dict.fromkeys(over)), fn=fn, size=size,
                                 name=name, state=state))

    def read_any(self, table: str, key_fn: Callable[..., Hashable], *, reads: Iterable[State] = (),
                 candidates: Iterable[Hashable] | None = None, name: str | None = None) -> None:
        """Non-deterministic READ(f*): the key is ``key_fn(*images of reads)`` at run time.
        ``candidates`` (optional) bounds the keys it may yield; without it, any row of ``table``."""
        self._check_key(table, 0)
        self.specs.append(OpSpec(OpKind.ND_READ, table, None, self._params(reads, None, "reads"), key_fn=key_fn,
                                 candidates=_candidates(table, candidates),
                                 name=name or _default_name(self.specs, f"any:{table}")))

    def write_any(self, table: str, key_fn: Callable[..., Hashable], fn: Callable[..., Mapping[str, object] | _Delete],
                  *, reads: Iterable[State] = (),
                  candidates: Iterable[Hashable] | None = None, name: str | None = None) -> None:
        """Non-deterministic WRITE(f1*, f2*): key ``key_fn(*images of reads)``, value
        ``fn(own, *images of reads)`` as for :meth:`write`."""
        self._check_key(table, 0)
        self.specs.append(OpSpec(OpKind.ND_WRITE, table, None, self._params(reads, None, "reads"), fn=fn,
                                 key_fn=key_fn, candidates=_candidates(table, candidates), name=name))

    def insert(self, table: str, rows: Callable[..., object] | Mapping[str, object], *, reads: Iterable[State] = (),
               name: str | None = None) -> None:
        """INSERT(table, rows(*images of reads)): new rows of ``table``, added when the transaction commits.
        ``rows`` is a mapping of columns (one row) or a function of the images of ``reads`` (as of before the
        transaction) that returns a mapping, a list of mappings, or None (no row).  Columns left out take
        their defaults, so a key the store generates (identity, serial) is left out.  New rows are no state:
        no operation of the batch reads them, and none conflicts with another insert.  The output ``name``
        (default ``insert:TABLE#INDEX``) is an :class:`Inserted`."""
        if type(table) is not str:
            table = self._check_key(table, 0)[0]
        if callable(rows):
            fn = rows
        elif isinstance(rows, Mapping):
            fn = functools.partial(_constant, dict(rows))
        else:
            raise DeclarationError(f"ops.insert({table!r}, ...) takes a mapping of columns or a function of the "
                                   f"reads returning one (or a list of them, or None), got {rows!r}")
        specs = self.specs
        params = self._insert_params(reads) if reads else ()
        if name is None:
            name = _INSERT_NAMES.get((table, len(specs))) or _insert_name(table, len(specs))
        else:
            self.named_insert = True
        specs.append(_new_spec(OpSpec, (_INSERT, table, None, params, fn, None, None, None, name, (), None, None)))

    def insert_into(self, tables: Iterable[str], rows: Callable[..., object], *, reads: Iterable[State] = (),
                    name: str | None = None) -> None:
        """INSERT into any of ``tables``: ``rows(*images of reads)`` returns a mapping table → that table's rows
        (each value as :meth:`insert` takes it: a mapping, a list of them, or None), or None for no row.  One
        operation where one :meth:`insert` per table would compute the same decision several times: an
        event whose reads decide an audit row, an alert and a notification.  A table the mapping names
        outside ``tables`` aborts the transaction.  The output ``name`` (default ``insert:T1,T2#INDEX``) is an
        :class:`InsertedInto`; everything else as for :meth:`insert`."""
        if isinstance(tables, str):
            raise DeclarationError(f"ops.insert_into takes the tables as a tuple, got the string {tables!r}; write "
                                   f"ops.insert_into(({tables!r},), ...) or use ops.insert")
        names = self._tables(tables)
        if not callable(rows):
            raise DeclarationError(f"ops.insert_into({names!r}, ...) takes a function of the reads returning a "
                                   f"mapping table -> rows (or None), got {rows!r}")
        params = self._insert_params(reads) if reads else ()
        specs = self.specs
        if name is None:
            name = _INSERT_NAMES.get((names, len(specs))) or _insert_name(names, len(specs))
        else:
            self.named_insert = True
        specs.append(_new_spec(OpSpec, (_INSERT, names[0], None, params, rows, None, None, None, name, (), None,
                                        names)))

    def _tables(self, tables: Iterable[str]) -> tuple[str, ...]:
        """``tables`` as a tuple of names (each once), checked; memoised per tuple given (a batch gives the same
        few tuples thousands of times)."""
        try:
            known = _TABLE_TUPLES.get(tables) if type(tables) is tuple else None
        except TypeError:             # (something unhashable among them: the checks below name it)
            known = None
        if known is not None:
            return known
        names = tuple(dict.fromkeys(self._check_key(table, 0)[0] for table in tables))
        if not names:
            raise DeclarationError("ops.insert_into needs at least one table")
        if type(tables) is tuple and len(_TABLE_TUPLES) < 4096:
            _TABLE_TUPLES[tables] = names
        return names


_INSERT_NAMES: dict[tuple[str | tuple[str, ...], int], str] = {}
_TABLE_TUPLES: dict[tuple[str, ...], tuple[str, ...]] = {}
_PLAIN_KEYS = frozenset({str, int})          # key types known to be hashable


def _default_name(specs: list[OpSpec], name: str) -> str:
    """``name``, the default output name of a window or non-deterministic read (``window:TABLE``, ``any:TABLE``), or
    ``name#INDEX`` (the operation's index) if an operation of the transaction has it already: outputs are kept by
    name, so a second one of that name would lose the first one's output."""
    return f"{name}#{len(specs)}" if any(spec.name == name for spec in specs) else name


def _insert_name(table: str | tuple[str, ...], index: int) -> str:
    """``insert:TABLE#INDEX`` (``insert:T1,T2#INDEX`` into several tables), the default output name of an INSERT
    (kept: a batch names thousands alike)."""
    name = _INSERT_NAMES.get((table, index))
    if name is None:
        name = f"insert:{table if type(table) is str else ','.join(table)}#{index}"
        if len(_INSERT_NAMES) < 4096:
            _INSERT_NAMES[(table, index)] = name
    return name


def _constant(row: RowImage, *images: object) -> RowImage:
    return row


_NO_ROWS = ()
#: Per table, the one ``Inserted`` of no rows (immutable, so shared): most INSERT operations of an application
#: like the hand-hygiene one return None, and a batch keeps its outputs until its result is dropped — a new tuple
#: each would be thousands of allocations per batch, and as many objects for the young collection after it to scan.
_NONE_INSERTED: dict[str, Inserted] = {}


def _none_inserted(table: str) -> Inserted:
    empty = _NONE_INSERTED.get(table)
    if empty is None:
        empty = _new_inserted(Inserted, (table, _NO_ROWS))
        if len(_NONE_INSERTED) < 4096:          # (table names come from declarations: the cache stays bounded)
            _NONE_INSERTED[table] = empty
    return empty


#: The output of an INSERT into several tables that added no row (one object: compared by identity where that is the
#: common case).
NOTHING_INTO = InsertedInto(())


def inserted(spec: OpSpec, result: object) -> Inserted | InsertedInto:
    """What an INSERT's function returned, as rows (dicts, never changed afterwards: the batch only reads them);
    raises DeclarationError for anything else."""
    if spec[11] is not None:
        return _inserted_into(spec[11], result)
    return _rows(spec.table, result)


def _rows(table: str, result: object) -> Inserted:
    if result is None:
        return _NONE_INSERTED.get(table) or _none_inserted(table)
    kind = type(result)
    if kind is dict or kind is DrawnRow:
        return _new_inserted(Inserted, (table, (result,)))
    if kind is list or kind is tuple:         # (the common case of several rows: plain dicts, no ABC check)
        for row in result:  # type: ignore[attr-defined]  # (a list or a tuple)
            if type(row) is not dict and type(row) is not DrawnRow:
                break
        else:
            return _new_inserted(Inserted, (table, tuple(result)))  # type: ignore[arg-type]
    if isinstance(result, Mapping):
        return Inserted(table, (dict(result),))
    if isinstance(result, (list, tuple)) and all(isinstance(row, Mapping) for row in result):
        return Inserted(table, tuple(row if type(row) is dict or type(row) is DrawnRow else dict(row) for row in result))
    raise DeclarationError(f"the function of insert into {table} returned {result!r}; return a mapping of "
                           f"columns, a list of them, or None for no row")


def _inserted_into(tables: tuple[str, ...], result: object) -> InsertedInto:
    """An ``insert_into``'s result (table → rows, or None) as one :class:`Inserted` per table given rows, in the
    order of ``tables``."""
    if result is None or (type(result) is dict and not result):
        return NOTHING_INTO
    if type(result) is not dict and not isinstance(result, Mapping):
        raise DeclarationError(f"the function of insert_into {', '.join(tables)} returned {result!r}; return a "
                               f"mapping table -> rows, or None for no row")
    for table in result:
        if table not in tables:
            raise DeclarationError(f"the function of insert_into {', '.join(tables)} returned rows for {table!r}, "
                                   f"which it does not declare; name it in the tables of ops.insert_into")
    parts = []
    for table in tables:
        rows = result.get(table)
        if rows is not None:
            part = _rows(table, rows)
            if part.rows:
                parts.append(part)
    return _new_inserted(InsertedInto, (tuple(parts),)) if parts else NOTHING_INTO


def _check_size(size: object, what: str) -> None:
    """Refuse a window ``size`` that is no number of at least 0: it is subtracted from the event's time (a text or None
    failed the run with a TypeError; NaN or a negative size made every window empty)."""
    if isinstance(size, bool) or not isinstance(size, numbers.Real) or math.isnan(size) or size < 0:
        raise DeclarationError(f"{what} takes size= a number of at least 0 in the unit of the events' ts (seconds for "
                               f"datetimes; the window holds the versions of earlier transactions with time >= "
                               f"t - size), got {size!r}")


def _candidates(table: str, candidates: Iterable[Hashable] | None) -> tuple[Hashable, ...] | None:
    if candidates is None:
        return None
    if isinstance(candidates, (str, bytes)):        # (read letter by letter, no key would be among them)
        raise DeclarationError(f"candidates of {table} is one text, {candidates!r}; give the keys as a collection: "
                               f"candidates=[{candidates!r}]")
    return tuple(_state((table, key), "candidates")[1] for key in candidates)


def unknown_event_type(event_type: object) -> UnknownEventType:
    if not isinstance(event_type, str) or not event_type:     # (``on`` takes no such type: say what to give instead)
        return UnknownEventType(f"the event has no type (event type {event_type!r}); give each event a type, a "
                                f"non-empty text that a state transaction is declared for ('type' of a dict)")
    return UnknownEventType(f"no state transaction is declared for event type {event_type!r}; "
                            f"declare one with @transactions.on({event_type!r})")


def specs_of(declare: Callable[[BatchEvent], list[OpSpec]], event: BatchEvent,
             known: list[OpSpec] | str | None = None) -> list[OpSpec] | str:
    """``known``, or ``declare(event)``: its operations, or the text of the error it raised (the event is then
    rejected, the batch goes on)."""
    if known is not None:
        return known
    try:
        return declare(event)
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def no_operation(event_type: object) -> DeclarationError:
    return DeclarationError(f"the state transaction of {event_type!r} declared no operation")


class StateTransactions:
    """The declared state transactions of an application, keyed by event type.

    Also remembers what earlier batches measured (abort ratio, time per operation) for the
    decision model, and owns the worker processes when ``processes > 1`` (``close()`` them).
    Pickling keeps the declarations only (that is what worker processes need).
    Thread-safety: declare at set-up; afterwards one batch at a time per object.
    """

    def __init__(self, name: str = "state transactions", *, processes: int = 1,
                 decision_rule: DecisionRule = DecisionRule.MORPHSTREAM) -> None:
        if decision_rule not in set(DecisionRule):
            raise DeclarationError(f"unknown decision_rule {decision_rule!r}: use 'morphstream' (MorphStream's "
                                   f"decision tree) or 'calibrated' (this package's per-operation thresholds)")
        check_whole_number("StateTransactions", "processes", processes, 1,
                           " (the processes a batch may use, this one included)")
        self.name = name
        self.processes = processes
        self.decision_rule = DecisionRule(decision_rule)   # how strategy="tpg" picks its strategy (_decide.py)
        self._declarations: dict[str, Declaring] = {}
        self._runtime: Runtime | None = None   # created on first use (_runtime.Runtime): decision memory, pool

    def on(self, event_type: str, *more_types: str) -> Callable[[_D], _D]:
        """Decorator: ``fn(event, ops)`` declares the state transaction of these event types.
        Returns ``fn`` unchanged (so a module-level function stays picklable by reference)."""
        types = (event_type, *more_types)

        def register(function: _D) -> _D:
            # Every type checked before any is declared: a refused decorator declares none of them.
            for kind in types:
                if not isinstance(kind, str) or not kind:
                    raise DeclarationError(f"an event type is a non-empty string, got {kind!r}")
                if kind in self._declarations and self._declarations[kind] is not function:
                    earlier = self._declarations[kind]
                    raise DeclarationError(f"event type {kind!r} already has a state transaction "
                                           f"({getattr(earlier, '__name__', repr(earlier))}); one per event type")
            if not callable(function):
                raise DeclarationError(f"transactions.on({', '.join(map(repr, types))}) decorates the declaring "
                                       f"function fn(event, ops), got {function!r}")
            for kind in types:
                self._declarations[kind] = function
            return function

        return register

    @property
    def event_types(self) -> frozenset[str]:
        return frozenset(self._declarations)

    def declare(self, event: BatchEvent) -> list[OpSpec]:
        """Run the declaring function of ``event``; raises UnknownEventType, DeclarationError,
        or whatever the function raised."""
        function = self._declarations.get(event.event_type)
        if function is None:
            raise unknown_event_type(event.event_type)
        ops = Ops(event)
        function(event, ops)
        if not ops.specs:
            raise no_operation(event.event_type)
        if ops.named_insert:
            ops.refuse_names_shared_with_inserts()
        return ops.specs

    @property
    def declarations(self) -> Mapping[str, Declaring]:
        """Event type → declaring function (read-only view)."""
        return MappingProxyType(self._declarations)

    def __getstate__(self) -> dict[str, object]:
        return {"name": self.name, "processes": 1, "decision_rule": self.decision_rule,
                "_declarations": self._declarations, "_runtime": None}

    def start_workers(self) -> None:
        """Start the worker processes now (``processes > 1``; else nothing) rather than in the first batch that
        splits, so that a measurement or a latency-bound first batch does not pay their start-up."""
        from activedb.batch._runtime import runtime_of

        pool = runtime_of(self).pool
        if pool is not None:
            pool.warm_up()

    def rows_touched(self, events: Iterable[object]) -> dict[str, list[Hashable]]:
        """Table → the keys of every row the declared transactions of ``events`` name (own, parameter and
        candidate rows): what ``apply_batch`` reads, locked, before it runs the batch."""
        from activedb.batch._runtime import prepare

        return prepare(self, events).states_by_table()

    def close(self) -> None:
        """Stop the worker processes, if any were started."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()

    def __enter__(self) -> "StateTransactions":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateTransactions({self.name!r}, types={sorted(self._declarations)})"
