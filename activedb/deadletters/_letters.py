"""The dead-letter table ``activedb_dead_letters``: its record type, what goes into it, its SQL and the mark
of a replayed letter — the only place that writes or reads it (every writer goes through :func:`insert`,
:func:`insert_in_flush` or :func:`insert_ahead`).
Design note: the package's ``README.md``.
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import functools
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import sqlalchemy as sa

from activedb.errors import (BadArgument, BatchAlreadyCommitted, GeneratedKeysReset, NestedTooDeep, check_switch,
                             check_whole_number)
from activedb.extras import Extra, needs
from activedb.store import (EXACT_DEPTH, Catalog, Json, exact_json, from_exact_json, from_jsonable, jsonable,
                            nesting_depth, statement_spans, storable_text)
from activedb.txn import CommitParticipant, enlist

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.txn import Transaction

TABLE = "activedb_dead_letters"
_ARROW_TAG = "$arrow"
#: The original of a ``None`` row (a NULL original is a letter written before originals were kept).
_NONE_TAG = "$none"
#: The original of a letter kept cut (:data:`LETTER_BYTES`): ``{"$cut": its JSON's size in bytes}``.
_CUT_TAG = "$cut"

#: The most bytes of JSON a dead letter keeps, its reason, readable form and original together: a larger letter is
#: kept *cut* — its reason says so, ``raw`` holds a preview of its readable form (``{"cut": text}``, the first
#: :data:`CUT_PREVIEW_CHARS` characters; a reason longer than that is cut alike) and ``original`` its size, not the
#: row (:meth:`LetterRecord.cut`).  The bound keeps a letter within what PostgreSQL takes in one value.
LETTER_BYTES = 16 * 2**20
CUT_PREVIEW_CHARS = 1_000

#: The most letters one statement inserts; the most bytes of their JSON together (each letter's as
#: :data:`LETTER_BYTES` measures it) is the store's :data:`~activedb.store.STATEMENT_BYTES`: a batch's letters beyond
#: either bound go out in more statements, one after another in the same transaction
#: (:func:`~activedb.store.statement_spans`).  A statement's letters travel as one JSON document, one value, which
#: PostgreSQL takes at most 1 GB of and which the driver and the server each hold whole in memory.  A letter larger
#: alone than ``STATEMENT_BYTES`` goes in a statement of its own (``LETTER_BYTES`` bounds it).
LETTERS_PER_STATEMENT = 1_000


class FinalReason(str):
    """A dead letter's reason in full, as the path that would otherwise have run the event names it (a plain rule
    that raised in a lowered batch: as firing it names it); a batch's writer adds nothing to it (the ingestion
    core's lowered batches prefix their other reasons with ``aborted:``)."""

    __slots__ = ()


class ReasonKind(enum.Enum):
    """The kind of a dead letter's reason, a closed set (the reason itself is free text, naming values, rules, change
    and transaction ids): what ``activedb_dead_letters{reason=…}`` is labelled by.  :meth:`of` reads it from the
    reason's text as its writers make it; a reason of no known form is ``OTHER``."""

    INVALID_ROW = "invalid row"            # the row could not be made an event (a field, malformed JSON, undeliverable)
    LATE = "late"                          # older than the watermark
    DUPLICATE = "duplicate"                # an event id ingested already
    REJECTED = "rejected by rule"          # a rule rejected the event (RuleFailed)
    RULE_FAILED = "rule failed"            # a rule (or the processing of the event) raised
    DEADLINE = "deadline"                  # a rule or the batch ran past its deadline
    REFUSED = "refused by PostgreSQL"      # PostgreSQL refused the event's writes at the commit
    OTHER = "other"

    @classmethod
    def of(cls, reason: str) -> ReasonKind:
        """The kind of ``reason`` (a lowered batch's ``aborted:`` prefix is looked through)."""
        text = reason[len(_ABORTED):] if reason.startswith(_ABORTED) else reason
        return next((kind for kind, pattern in _REASON_FORMS if pattern.search(text)), cls.OTHER)

    @classmethod
    def sql(cls, reason: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
        """:meth:`of` as SQL: the ``value`` of the kind of the text ``reason`` (a PostgreSQL ``CASE`` of the same forms,
        tried in the same order, matched by PostgreSQL's ``~``, which reads them as ``re`` does)."""
        text = sa.case((reason.startswith(_ABORTED, autoescape=True), sa.func.substr(reason, len(_ABORTED) + 1)),
                       else_=reason)
        return sa.case(*((text.regexp_match(pattern.pattern), kind.value) for kind, pattern in _REASON_FORMS),
                       else_=cls.OTHER.value)


_ABORTED = "aborted: "
# The reasons' forms, in the order they are tried (where each is made: activedb.ingest's _mapping, _protocol, _failures
# and _watch, activedb.capture's _fetch and _firing, activedb.streams).  Each is read alike by Python's ``re`` (of)
# and PostgreSQL's advanced regular expressions (sql): ``^`` the text's start only, ``.`` any character, a newline too
# (DOTALL, PostgreSQL's default), ``[^']`` too; only constructs both read alike (no ``\d``, ``\b``, lookarounds).
_REASON_FORMS = [(kind, re.compile(pattern, re.DOTALL)) for kind, pattern in (
    (ReasonKind.LATE, r"^late:"),
    (ReasonKind.DUPLICATE, r"^duplicate:"),
    (ReasonKind.REJECTED, r"^rejected by rule "),
    (ReasonKind.DEADLINE, r" within its deadline of "),
    (ReasonKind.REFUSED, r"^PostgreSQL refused |^the reactions to .* cannot be committed: "),
    (ReasonKind.RULE_FAILED, r"^event processing failed: |^rule cascade limit: |^rule '.*' failed on |^rule '.*' was cancelled on "
                             r"|^s-transaction of .* aborted: |^rejected: the tie_key of stream .* raised "),
    (ReasonKind.INVALID_ROW, r"^rejected: |^[a-z][a-z ]* \('[^']*'\) |^malformed JSON|^the line is a JSON "
                             r"|^Spark could not read "
                             r"|^row is .*, not a mapping |^field .* holds |^column .* is not valid UTF-8"
                             r"| cannot be delivered: "),
)]


@dataclass(frozen=True)
class Letter:
    """A dead letter about to be written: why, and the row. Immutable.

    ``row`` is the original, kept exactly (any value :func:`activedb.store.exact_json` takes, or a one-row
    ``pyarrow.Table``); ``shown`` the readable form for ``raw`` (default: ``jsonable(row, tagged=True)`` — bytes and
    non-finite floats tagged, not shown as text, and keys starting with ``$`` escaped —, wrapped as
    ``{"value": ...}`` unless it is a mapping; one given is made the same way, as ``BatchLetters`` makes it)."""

    reason: str
    row: Any = field(hash=False)
    shown: Mapping[str, Any] | None = field(default=None, hash=False)

    def raw(self) -> dict[str, Json]:
        if self.shown is not None:
            return dict(self.shown)
        shown = jsonable(self.row, tagged=True)
        return shown if isinstance(shown, dict) else {"value": shown}


@dataclass(frozen=True)
class LetterRecord:
    """One row of ``activedb_dead_letters``. Immutable."""

    id: int
    query_id: str | None
    batch_id: int | None
    reason: str
    raw: Any = field(hash=False)
    original: Any = field(default=None, hash=False, repr=False)   # the stored encoding; see row()
    created_at: dt.datetime | None = None
    replayed_at: dt.datetime | None = None
    replay_query_id: str | None = None
    #: The row's index in its batch, for a letter written ahead of its batch (:func:`insert_ahead`), else None.
    position: int | None = None

    @classmethod
    def from_mapping(cls, row: Mapping[str, object]) -> "LetterRecord":
        # (a row of activedb_dead_letters: its columns have the fields' types)
        return cls(**{name: row.get(name) for name in cls.__dataclass_fields__})  # type: ignore[arg-type]

    def row(self) -> object:
        """The row as its writer had it (a one-row ``pyarrow.Table`` for rows Spark delivered, else a
        dict or the value); for letters written before originals were kept, ``raw`` read back (``from_jsonable``:
        its tags the values they stand for).  A letter kept cut (:meth:`cut`) has no row: BadArgument."""
        if self.original is None:
            return from_jsonable(self.raw)
        return decode_original(self.original)

    def cut(self) -> bool:
        """Whether the letter was kept cut — larger than :data:`LETTER_BYTES`: its ``raw`` a preview, its row not
        kept (a replay refuses it)."""
        return _cut_size(self.original) is not None


@dataclass(frozen=True)
class LetterFilter:
    """Which dead letters a command means. Immutable.

    ``ids``: the letters of these ids — an empty collection selects none, as SQL's ``IN ()`` does (a computed list
    that came out empty must not purge every letter); None is any id; ``query``: a query name — its ledger ids
    ``NAME@RUN[#pN]`` (not ``NAME@x@RUN``: a run of the source ``NAME@x``), its replays ``replay:NAME`` and the letters
    written under the name itself; ``reason``: a
    case-insensitive substring (neither may be empty: None is any); ``replayed``: True/False/None (either)."""

    ids: tuple[int, ...] | None = None
    query: str | None = None
    batch: int | None = None
    reason: str | None = None
    replayed: bool | None = None

    def __post_init__(self) -> None:
        ids: object = () if self.ids is None else self.ids     # (as given: any value a caller passed is checked)
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Collection) or not all(
                isinstance(one, int) and not isinstance(one, bool) for one in ids):
            raise BadArgument(f"LetterFilter(ids={ids!r}) takes dead letter ids (whole numbers; one id as (id,); "
                              f"None: any id)")
        for number in (*ids, self.batch):     # (the table's bigints: PostgreSQL would refuse the statement)
            if isinstance(number, int) and not -2**63 <= number < 2**63:
                raise BadArgument(f"LetterFilter: {number} is no dead letter id or batch number (PostgreSQL's bigint "
                                  f"holds them, at most {2**63 - 1})")
        for name in ("query", "reason"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise BadArgument(f"LetterFilter({name}={value!r}) takes a text (None: any)")
            if value == "":     # (a variable left unset: a purge would delete every letter)
                raise BadArgument(f"LetterFilter({name}='') would select every dead letter: give the text, or None "
                                  f"for any")
        if self.batch is not None and (isinstance(self.batch, bool) or not isinstance(self.batch, int)):
            raise BadArgument(f"LetterFilter(batch={self.batch!r}) takes a batch number (None: any)")
        check_switch("LetterFilter", "replayed", self.replayed, none="either")
        if self.ids is not None and type(self.ids) is not tuple:      # (immutable: not the caller's list)
            object.__setattr__(self, "ids", tuple(self.ids))

    def statement(self, table: sa.Table) -> sa.Select[Unpack[tuple[object, ...]]]:
        statement = sa.select(table)
        if self.ids is not None:     # (an empty collection: no letter, SQLAlchemy's empty IN)
            statement = statement.where(table.c.id.in_(list(self.ids)))
        if self.query is not None:
            # ``NAME@RUN[#pN]``: a run holds no '@' — ``NAME@x@RUN`` is a run of the source ``NAME@x``
            # (``activedb.ingest.LedgerId``), whose letters are not ``NAME``'s.
            runs = f"{_like(self.query)}@%"
            statement = statement.where(sa.or_(table.c.query_id == self.query,
                                               sa.and_(table.c.query_id.like(runs, escape="\\"),
                                                       table.c.query_id.not_like(f"{runs}@%", escape="\\")),
                                               table.c.query_id == f"replay:{self.query}"))
        if self.batch is not None:
            statement = statement.where(table.c.batch_id == self.batch)
        if self.reason is not None:
            statement = statement.where(table.c.reason.ilike(f"%{_like(self.reason)}%", escape="\\"))
        if self.replayed is not None:
            statement = statement.where(table.c.replayed_at.is_not(None) if self.replayed
                                        else table.c.replayed_at.is_(None))
        return statement.order_by(table.c.id)


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# --- the original row ----------------------------------------------------------------------------------

def encode_original(row: object) -> object:
    """``row`` as the ``original`` column's JSON: a one-row ``pyarrow.Table``/``RecordBatch`` as an Arrow
    IPC stream (schema included, so the row replays through the same conversion Spark's rows take),
    anything else through :func:`activedb.store.exact_json` (a value it cannot keep in its readable form: ``_kept``;
    None, no original, for a row nested deeper than ``EXACT_DEPTH`` levels even so: its ``raw`` is its record)."""
    [encoded] = encode_originals([row])
    return encoded


def _is_arrow(row: object) -> bool:
    return type(row).__module__.startswith("pyarrow") and hasattr(row, "schema") and hasattr(row, "num_rows")


# The end of an Arrow IPC stream (a continuation marker and a zero length): what the stream writer closes with.
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def encode_originals(rows: Sequence[object]) -> list[object]:
    """:func:`encode_original` of each of ``rows``, the same bytes: of Arrow rows sharing a schema without
    dictionaries (a batch's letters), the schema's message made once and each row's record batch message after it,
    as the stream writer writes them."""
    encoded: list[object] = []
    schema: Any = None
    head: bytes | None = None
    for row in rows:
        if row is None:
            encoded.append({_NONE_TAG: True})
            continue
        if not _is_arrow(row):
            encoded.append(_kept(row))
            continue
        import pyarrow as pa

        arrow: Any = row
        batches = arrow.to_batches() if isinstance(arrow, pa.Table) else [arrow]
        if schema is None or not arrow.schema.equals(schema):
            schema = arrow.schema
            head = None if "dictionary<" in str(schema) else schema.serialize().to_pybytes()
        if head is None or len(batches) != 1:      # (dictionaries go before a batch: the writer knows how)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, schema) as writer:
                writer.write(arrow)
            stream = sink.getvalue().to_pybytes()
        else:
            stream = head + batches[0].serialize().to_pybytes() + _EOS
        encoded.append({_ARROW_TAG: base64.b64encode(stream).decode("ascii")})
    return encoded


def _kept(row: object) -> object:
    """``exact_json(row)``; a value of it that cannot be kept exactly — one ``pickle`` refuses, a lock or an instance
    of a class defined in a function, or one nested deeper than ``exact_json`` goes (``EXACT_DEPTH``) — in its
    readable form (``jsonable``: its ``repr``), the row's other values exactly: a row is a dead letter because it is
    wrong, and its letter is written whatever it holds.  What is kept nests at most ``EXACT_DEPTH`` levels, as any
    value the letters table takes (``tx.insert`` refuses a deeper one): a value whose exact form nests deeper (its
    tags nest: ``{"$tuple": [...]}``) is kept in readable form too; None (the readable form, ``raw``, is the row's
    record, as for a letter written before originals were kept) if the row still nests deeper."""
    try:
        encoded = exact_json(row)
    except Exception:       # (pickle's refusals: PicklingError, TypeError, AttributeError, ...; NestedTooDeep)
        pass
    else:
        if _nests_within(encoded, EXACT_DEPTH):
            return encoded
    try:
        if not isinstance(row, Mapping):
            encoded = exact_json(jsonable(row))
        else:
            encoded = exact_json({_keepable(key): _keepable(value) for key, value in row.items()})
    except NestedTooDeep:   # (the readable form's own keys may look like tags: ``{"$map": ...}`` nests deeper)
        return None
    return encoded if _nests_within(encoded, EXACT_DEPTH) else None


def _nests_within(encoded: Json, levels: int) -> bool:
    """Whether ``encoded`` (JSON) nests at most ``levels`` levels."""
    if type(encoded) is not dict and type(encoded) is not list:
        return True
    depth = nesting_depth(encoded)
    return depth is not None and depth <= levels


def _keepable(value: object) -> object:
    """``value`` if :func:`exact_json` keeps it within ``EXACT_DEPTH - 1`` levels (a value of a row), else its
    readable form (``jsonable``: ``JSONABLE_DEPTH`` levels)."""
    try:
        if _nests_within(exact_json(value), EXACT_DEPTH - 1):
            return value
    except Exception:       # (as in _kept)
        pass
    return jsonable(value)


def decode_original(stored: object) -> object:
    """The inverse of :func:`encode_original`; BadArgument for the original of a letter kept cut (it holds no row)."""
    size = _cut_size(stored)
    if size is not None:
        raise BadArgument(f"this dead letter was kept cut (its JSON, {size:,} bytes, is more than a letter keeps): its "
                          f"row was not kept — feed the row again from its source")
    if isinstance(stored, Mapping) and len(stored) == 1 and _NONE_TAG in stored:
        return None
    if isinstance(stored, Mapping) and len(stored) == 1 and _ARROW_TAG in stored:
        with needs(Extra.SPARK, "reading a row Spark delivered (an Arrow table)"):
            import pyarrow as pa

        return pa.ipc.open_stream(base64.b64decode(stored[_ARROW_TAG])).read_all()
    return from_exact_json(stored)


# --- writing -------------------------------------------------------------------------------------------

def _rows(query_id: str | None, batch_id: int | None, letters: Iterable[Letter]) -> list[dict[str, object]]:
    """The rows of ``activedb_dead_letters`` for ``letters``, ids left out (:func:`_columns`)."""
    return [{"query_id": query_id, "batch_id": batch_id, **columns} for columns in _columns(list(letters))]


def _columns(letters: Sequence[Letter]) -> list[dict[str, object]]:
    """Each letter's own columns: its reason (text PostgreSQL cannot store, such as a NUL character or a lone
    surrogate, spelled out), its readable form and its original — or, for a letter whose reason, readable form and
    original are together larger than :data:`LETTER_BYTES` of JSON, the letter cut (:func:`_cut`)."""
    return _sized_columns(letters)[0]


def _sized_columns(letters: Sequence[Letter]) -> tuple[list[dict[str, object]], list[int], list[str]]:
    """:func:`_columns` of ``letters``, the bytes of JSON each letter's columns hold (about: for a letter kept cut, a
    bound of its preview's), and each letter's columns as the members of its row's JSON object (``"reason":…,
    "raw":…,"original":…``, what ``_ENCODER`` makes of them), each column encoded once: the text measured is the
    text a statement sends (:func:`insert_statement`)."""
    columns: list[dict[str, object]] = []
    sizes: list[int] = []
    members: list[str] = []
    for letter, original in zip(letters, encode_originals([letter.row for letter in letters])):
        raw = letter.raw()
        # (ASCII: the encoder escapes the rest, so characters are bytes; the readable form encoded once, for its size,
        # a cut letter's preview and the statement's document)
        shown = _ENCODER.encode(raw)
        encoded_original = _ENCODER.encode(original)
        reason = storable_text(letter.reason)
        size = (len(reason) if reason.isascii() else len(reason.encode("utf-8"))) + len(shown) + len(encoded_original)
        if size <= LETTER_BYTES:
            columns.append({"reason": reason, "raw": raw, "original": original})
            members.append(f'"reason":{_ENCODER.encode(reason)},"raw":{shown},"original":{encoded_original}')
        else:
            columns.append(_cut(reason, shown, size))
            size = 2 * (len(str(columns[-1]["reason"])) + CUT_PREVIEW_CHARS) + 64    # (escapes at most double them)
            members.append(_ENCODER.encode(columns[-1])[1:-1])
        sizes.append(size)
    return columns, sizes, members


_Item = TypeVar("_Item")


def _statements_of(items: Sequence[_Item], sizes: Sequence[int]) -> list[list[_Item]]:
    """``items`` (letters, ``sizes`` their bytes of JSON) in order, split into the statements that write them: each at
    most :data:`LETTERS_PER_STATEMENT` of them and :data:`~activedb.store.STATEMENT_BYTES` together — at least one
    each (:func:`~activedb.store.statement_spans`)."""
    return [list(items[start:stop]) for start, stop in statement_spans(sizes, LETTERS_PER_STATEMENT)]


def _cut(reason: str, shown: str, size: int) -> dict[str, object]:
    """The columns of a letter kept cut: its JSON (``size`` bytes, ``shown`` its readable form's) is larger than
    :data:`LETTER_BYTES`.  Its reason and readable form keep their first :data:`CUT_PREVIEW_CHARS` characters (a
    reason longer than that — a rule's error may hold the value that broke it — ends with ``…``)."""
    if len(reason) > CUT_PREVIEW_CHARS:
        reason = f"{reason[:CUT_PREVIEW_CHARS]}…"
    return {"reason": f"{reason}; cut: the letter's JSON is {size:,} bytes, more than a letter keeps "
                      f"({LETTER_BYTES:,}): its reason and raw hold their first {CUT_PREVIEW_CHARS:,} characters, "
                      f"and its row is not kept (it cannot be replayed)",
            "raw": {"cut": shown[:CUT_PREVIEW_CHARS]}, "original": {_CUT_TAG: size}}


def _cut_size(original: object) -> int | None:
    """The size a letter kept cut had (its ``original``: ``{"$cut": size}``); None for any other letter."""
    if isinstance(original, Mapping) and len(original) == 1 and _CUT_TAG in original:
        size = original[_CUT_TAG]
        return size if isinstance(size, int) else None
    return None


def insert(tx: Transaction, query_id: str | None, batch_id: int | None, letters: Sequence[Letter]) -> None:
    """Insert ``letters`` in ``tx`` (an activedb transaction); they commit with it — written in its flush, in as many
    statements as their bounds take (:data:`LETTERS_PER_STATEMENT`, :data:`~activedb.store.STATEMENT_BYTES`;
    :func:`insert_in_flush`), by a commit participant enlisted in ``tx`` (dropped if ``tx`` aborts, as its own
    writes are).  Their ids are drawn in the flush."""
    if letters:
        enlist(tx, _InFlush(query_id, batch_id, list(letters)))


class _InFlush(CommitParticipant):
    """Writes ``letters`` in the flush of the transaction it is enlisted in (:func:`insert`).  Immutable after
    construction; a flush runs it on one thread."""

    def __init__(self, query_id: str | None, batch_id: int | None, letters: list[Letter]):
        self._query_id, self._batch_id, self._letters = query_id, batch_id, letters

    def write(self, transaction: Transaction, connection: sa.Connection) -> None:
        insert_in_flush(transaction, connection, self._query_id, self._batch_id, self._letters)


def insert_in_flush(transaction: Transaction, connection: sa.Connection, query_id: str | None, batch_id: int | None,
                    letters: Sequence[Letter], *, table: str = TABLE) -> None:
    """Insert ``letters`` on ``connection`` inside the flush of ``transaction`` (for a commit participant writing
    in its own flush: they commit with it), into ``table``, in the statements of :func:`insert_statement`, one after
    another; their ids come from where :func:`insert`'s come from."""
    if letters:
        statement = insert_statement(transaction, connection.dialect, query_id, batch_id, letters, table=table)
        statement.done(sum(connection.exec_driver_sql(statement.sql, parameters).rowcount
                           for parameters in statement.chunks))


@dataclass(frozen=True)
class LettersInsert:
    """The statements that insert a batch's letters (:func:`insert_statement`): driver SQL and, per statement, its
    parameters (``chunks``: one statement carries at most :data:`LETTERS_PER_STATEMENT` letters and
    :data:`~activedb.store.STATEMENT_BYTES` of them), to send on the flush's connection in order, in its transaction
    (alone, or in a driver pipeline with other statements); then :meth:`done` with the row counts they report,
    summed.  Immutable."""

    sql: str
    chunks: tuple[tuple[object, ...], ...]
    count: int
    reset: Callable[[], GeneratedKeysReset]

    def done(self, rowcount: int) -> None:
        """Raise ``GeneratedKeysReset`` (nothing was inserted: the letters' ids were given out again by a reset of
        their sequence since they were drawn; a conflict, the transaction must not commit) unless every letter was
        inserted (``rowcount``: the statements' together)."""
        if rowcount != self.count:
            raise self.reset()


def insert_statement(transaction: Transaction, dialect: sa.Dialect, query_id: str | None, batch_id: int | None,
                     letters: Sequence[Letter], *, table: str = TABLE) -> LettersInsert:
    """The statements that insert ``letters`` (at least one) in the flush of ``transaction``, into ``table``: their
    ids drawn where :func:`insert`'s come from, every row encoded (the work of writing them but the round trips)."""
    catalog = transaction.manager.catalog
    info = catalog.table_info(table)
    sequence = catalog.sequence_of(info, "id")
    assert sequence is not None, table        # (an identity column: the migrations')
    ids, storage = catalog.generated_keys(sequence, len(letters), transaction.root.began_at)
    _, sizes, members = _sized_columns(letters)
    # Each row's JSON object made of its id and its columns' text (encoded once, measured as it is sent): the document
    # is what ``_ENCODER`` makes of the rows of the statement, ``{"id": …, "reason": …, "raw": …, "original": …}``.
    rows = [f'{{"id":{letter_id},{row}}}' for letter_id, row in zip(ids, members)]
    name = dialect.identifier_preparer.format_table(info.table)
    return LettersInsert(_INSERT.format(table=name),
                         tuple((query_id, batch_id, f"[{','.join(chunk)}]", storage, ids[-1], sequence)
                               for chunk in _statements_of(rows, sizes)),
                         len(letters), functools.partial(catalog.keys_reset, sequence, ids[-1]))


# One statement for a batch's letters, up to their bounds (``_statements_of``): a JSON array of them, one object a
# letter (its columns' text encoded once, ``_sized_columns``), whose ids are checked by the statement itself against a reset of their sequence
# since they were drawn (``Catalog.STILL_DRAWN``: nothing is inserted then; each statement checks them all).  Driver
# SQL (``%%`` in the table's name is doubled already).
_INSERT = ("INSERT INTO {table} (id, query_id, batch_id, reason, raw, original) "
           "SELECT v.id, %s, %s, v.reason, v.raw, v.original FROM jsonb_to_recordset(%s::jsonb) "
           "AS v(id bigint, reason text, raw jsonb, original jsonb) WHERE " + Catalog.STILL_DRAWN)
_ENCODER = json.JSONEncoder(allow_nan=False, check_circular=False, separators=(",", ":"))


def insert_ahead(database: DatabaseHandle, query_id: str, batch_id: int, position: int, letter: Letter) -> int:
    """Write ``letter`` at once, on a connection of its own, as the dead letter of row ``position`` of batch
    ``batch_id`` of ``query_id`` — *ahead of* that batch, which has not committed (a rule past its deadline: the
    batch's own transaction cannot commit any more).  A re-run of the batch leaves the row out
    (:func:`written_ahead`).  Returns the letter's id."""
    table = database.table(TABLE)
    catalog = database.catalog
    [row] = _rows(query_id, batch_id, [letter])
    with catalog.writing(f"writing the dead letter of row {position} of batch {batch_id} of {query_id!r} ahead of its "
                         f"batch", "it was written only if the connection broke at its COMMIT — written_ahead (or "
                         "`activedb dead-letters list`) shows whether; write it again only if it is not there, or "
                         "re-run the batch, which meets the row again") as connection:
        # Its id comes from the catalog's blocks of the table's sequence, where :meth:`Transaction.insert
        # <activedb.txn.Transaction.insert>` takes them (the id order: ``README.md``), checked against a reset of
        # the sequence as the flush checks those.
        sequence = catalog.sequence_of(catalog.table_info(TABLE), "id")
        assert sequence is not None, TABLE        # (an identity column: the migrations')
        ids, _ = catalog.generated_keys(sequence, 1, None)
        catalog.check_generated_keys(connection, {sequence: ids}, None)
        connection.execute(table.insert().values(**row, id=ids[0], position=position))
    return ids[0]


def written_ahead(connection: sa.Connection, table: sa.Table, query_id: str, batch_id: int) -> dict[int, int]:
    """``{position: letter id}`` of the letters written ahead of batch ``batch_id`` of ``query_id``
    (:func:`insert_ahead`), read on ``connection``."""
    rows = connection.execute(sa.select(table.c.position, table.c.id).where(
        table.c.query_id == query_id, table.c.batch_id == batch_id, table.c.position.is_not(None)))
    return {position: letter_id for position, letter_id in rows}


# --- reading -------------------------------------------------------------------------------------------

def _check_filter(call: str, letters: object) -> None:
    """Raise BadArgument unless ``letters`` (given to ``deadletters.call``) is a :class:`LetterFilter`."""
    if not isinstance(letters, LetterFilter):
        raise BadArgument(f"deadletters.{call}(letters={letters!r}) takes a LetterFilter — LetterFilter(query=..., "
                          f"reason=..., ...); LetterFilter() selects every letter")


def select(database: DatabaseHandle, letters: LetterFilter = LetterFilter(), *, limit: int | None = None) -> list[LetterRecord]:
    """The dead letters ``letters`` selects, oldest first (at most ``limit``)."""
    _check_filter("select", letters)
    if limit is not None:
        check_whole_number("deadletters.select", "limit", limit, 0, " (None: all)")
    table = database.table(TABLE)
    statement = letters.statement(table)
    if limit is not None:
        statement = statement.limit(limit)
    with database.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
        return [LetterRecord.from_mapping(row._asdict()) for row in connection.execute(statement)]


def count(database: DatabaseHandle, letters: LetterFilter = LetterFilter()) -> int:
    _check_filter("count", letters)
    table = database.table(TABLE)
    with database.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
        return connection.execute(sa.select(sa.func.count()).select_from(
            letters.statement(table).subquery())).scalar_one()


def count_by_reason(database: DatabaseHandle, letters: LetterFilter = LetterFilter()) -> dict[str, int]:
    """How many of the dead letters ``letters`` selects there are per reason, ``{reason: count}``."""
    _check_filter("count_by_reason", letters)
    table = database.table(TABLE)
    selected = letters.statement(table).order_by(None).subquery()
    statement = sa.select(selected.c.reason, sa.func.count()).group_by(selected.c.reason)
    with database.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
        return dict(connection.execute(statement).all())


def count_by_kind(database: DatabaseHandle, letters: LetterFilter = LetterFilter()) -> dict[ReasonKind, int]:
    """How many of the dead letters ``letters`` selects there are per kind of reason (:class:`ReasonKind`), every kind
    (0: none), ``{kind: count}``: one query, which PostgreSQL answers with a row per kind (:meth:`ReasonKind.sql`),
    however many letters and reasons there are."""
    _check_filter("count_by_kind", letters)
    table = database.table(TABLE)
    selected = letters.statement(table).order_by(None).subquery()
    kinds = sa.select(ReasonKind.sql(selected.c.reason).label("kind")).subquery()
    statement = sa.select(kinds.c.kind, sa.func.count()).group_by(kinds.c.kind)
    with database.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
        counts: dict[str, int] = dict(connection.execute(statement).all())
    return {kind: counts.get(kind.value, 0) for kind in ReasonKind}


def purge(database: DatabaseHandle, letters: LetterFilter) -> int:
    """Delete the dead letters ``letters`` selects; how many were deleted."""
    _check_filter("purge", letters)
    table = database.table(TABLE)
    selected = letters.statement(table).with_only_columns(table.c.id).order_by(None)
    with database.catalog.writing("purging dead letters",
                                  "the letters selected were all deleted or none was — purge again") as connection:
        return connection.execute(table.delete().where(table.c.id.in_(selected.scalar_subquery()))).rowcount


# --- replaying ---------------------------------------------------------------------------------------

class LetterReplayed(CommitParticipant):
    """Marks dead letter ``letter_id`` replayed (``replayed_at``, ``replay_query_id``) in the flush of the
    transaction that replays it, so the replay's effects and the mark commit together or not at all; a
    letter already marked raises ``BatchAlreadyCommitted`` there (the replay is skipped, nothing applied); so does a
    letter that is not in the table (purged, or no letter's id), and ``missing`` is then True."""

    def __init__(self, database: DatabaseHandle, letter_id: int, replay_query_id: str):
        self._table = database.table(TABLE)
        self.letter_id = letter_id
        self.replay_query_id = replay_query_id
        #: The last flush found no letter ``letter_id`` in the table (it skipped the replay: nothing to mark).
        self.missing = False

    def write(self, transaction: Transaction, connection: sa.Connection) -> None:
        table = self._table
        marked = connection.execute(
            table.update().where(table.c.id == self.letter_id, table.c.replayed_at.is_(None))
            .values(replayed_at=sa.func.now(), replay_query_id=self.replay_query_id).returning(table.c.id)).first()
        if marked is None:
            self.missing = connection.execute(sa.select(table.c.id).where(table.c.id == self.letter_id)).first() is None
            if self.missing:
                raise BatchAlreadyCommitted(f"dead letter {self.letter_id} is not in {TABLE} (purged, or no letter's "
                                            f"id); nothing was replayed")
            raise BatchAlreadyCommitted(f"dead letter {self.letter_id} was replayed already; it is not applied twice")
