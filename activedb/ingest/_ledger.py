"""The ingestion ledger: :class:`IngestionLedger`, the commit participant that writes a batch's ledger row in
the batch's PostgreSQL transaction; the ledger's keys (a source run's :class:`~activedb.ingest.LedgerId`
text and the batch number; why both parts matter: ``README.md`` in this package, "Invariants"); what ingestion
has committed, read back from PostgreSQL (:func:`ingestion_status` — what ``activedb status`` shows —,
:func:`batch_committed`, :func:`recorded_batch` — what a re-delivered batch is compared with —, :func:`last_watermark`,
:func:`ingested_event_ids`).
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from activedb.errors import UNIQUE_VIOLATION, BadArgument, BatchAlreadyCommitted, SerializationConflict
from activedb.ingest._interface import LedgerId, ReservedSource
from activedb.ingest.errors import IngestError
from activedb.txn import Along, CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.txn import Transaction

__all__ = ["END_OF_STREAM_BATCH", "IngestionLedger", "QueryStatus", "RecordedBatch", "batch_committed", "forget_run",
           "ingestion_status", "ledger_query_id", "parse_ledger_query_id", "recorded_batch", "sources_of_run"]

LEDGER_TABLE = "activedb_ingestion_ledger"
#: The batch number of a run's end-of-stream release (``Ingestion.end_of_stream``): what a handler's engine still
#: held back when the source ended, applied in a batch of its own with its ledger row — never a number a
#: connector gives a batch, so a run that goes on later is not mistaken for it.
END_OF_STREAM_BATCH = -1
EVENT_ID_TABLE = "activedb_ingested_events"
#: PostgreSQL's limit of a btree index row (version 4, 8 kB pages): the ledger's key (query_id, batch_id), the
#: dead letters' index on the same, the lineage's and the ingested event ids' keys all hold the source's name.
INDEX_ROW_BYTES = 2704
#: The longest source name (UTF-8 bytes) an ingestion takes: it leaves room under :data:`INDEX_ROW_BYTES` for the
#: run and partition of the ledger id (``SOURCE@RUN#pN``; a Spark query's run is its 36-character id) and for the
#: other columns of those keys.  A longer name failed every batch at its commit (SQLSTATE 54000).
SOURCE_NAME_BYTES = 2048
#: The longest run id (UTF-8 bytes) a ledger id takes: with a source name at its limit and a partition, the ledger id
#: and the other columns of its keys stay under :data:`INDEX_ROW_BYTES`.
RUN_BYTES = 512


def check_source_name(owner: str, name: str, value: object, *, run: bool = False) -> None:
    """Raise :class:`IngestError` if ``value``, a source name (``run``: a run id) given as ``owner(name=value)``, is no
    text or text the ledger cannot hold (:func:`unfit_source_name`): the one check of both, in the same words."""
    what = "a run id" if run else "a source name"
    if not isinstance(value, str):
        alternative = ", or None for a source that never numbers its batches anew" if run else ""
        raise IngestError(f"{owner}({name}={value!r}) takes {what}, a text{alternative}; nothing was applied")
    unfit = unfit_source_name(value, run=run)
    if unfit is not None:
        raise IngestError(f"{owner}({name}={value[:40]!r}{'…' if len(value) > 40 else ''}) {unfit} (nothing was "
                          f"applied)")


def unfit_source_name(value: str, *, run: bool = False) -> str | None:
    """Why the ledger cannot hold the source name ``value`` (``run``: the run id, at most :data:`RUN_BYTES`) — empty or
    only whitespace, longer than :data:`SOURCE_NAME_BYTES` bytes in UTF-8, holding a NUL character or a lone
    surrogate, which PostgreSQL's text cannot store, or for a run id an ``@`` or ``#``, which the ledger id's text
    ``SOURCE@RUN#pN`` is read back by —, said after the name and saying what to give; None if it can."""
    what, limit = ("a run id", RUN_BYTES) if run else ("a source name", SOURCE_NAME_BYTES)
    if not value.strip():
        return (f"is {'empty' if not value else 'only whitespace'}: the ledger files batches under {what}, and a blank "
                f"one names nothing an operator can tell apart — give one with a visible character")
    unstorable = _unstorable_at(value)
    if unstorable is not None:
        character = value[unstorable]
        held = "a NUL character (\\x00)" if character == "\x00" else f"a lone UTF-16 surrogate ({character!r})"
        return (f"holds {held} at index {unstorable}, which PostgreSQL's text cannot store — the ledger keeps {what} "
                f"as text: give one without it")
    separator = next((index for index, character in enumerate(value) if character in "@#"), None) if run else None
    if separator is not None:
        return (f"holds {value[separator]!r} at index {separator}, which {what} cannot hold — the ledger id's text "
                f"SOURCE@RUN#pN is read back by '@' and '#': give one without them")
    size = len(value.encode("utf-8"))
    if size > limit:
        return (f"is {what} of {size} bytes (UTF-8): {what} is at most {limit} bytes — the ledger keys batches by it in "
                f"PostgreSQL indexes whose rows hold at most {INDEX_ROW_BYTES} bytes"
                f"{'' if run else ', with room for the run'}; give a shorter one")
    return None


def _unstorable_at(text: str) -> int | None:
    """The index of the first character of ``text`` PostgreSQL's text cannot store (a NUL, a lone surrogate), or
    None: no ledger id holds such text, so a question about one has the answer "none"."""
    return next((index for index, character in enumerate(text)
                 if character == "\x00" or "\ud800" <= character <= "\udfff"), None)


def check_source_owner(owner_call: str, source: str, owner: ReservedSource | None) -> None:
    """Raise :class:`IngestError` if the source name ``source`` (given as ``owner_call(source=…)``) begins with a
    :class:`ReservedSource` other than ``owner`` (None: the caller owns none — a user's feed or Ingestion)."""
    if owner is not None and not isinstance(owner, ReservedSource):
        raise IngestError(f"{owner_call}(owner={owner!r}) takes a ReservedSource member, for activedb's own connectors "
                          f"(the replay of dead letters, change capture), or None; nothing was applied")
    reserved = next((prefix for prefix in ReservedSource if source.startswith(prefix.value)), None)
    if reserved is None:
        if owner is not None:
            raise IngestError(f"{owner_call}(source={source!r}, owner={owner}) names a source that does not begin "
                              f"with {owner.value!r}: give owner.source(name); nothing was applied")
        return
    if reserved is not owner:
        others = " or ".join(repr(prefix.value) for prefix in ReservedSource)
        raise IngestError(
            f"{owner_call}(source={source!r}) begins with {reserved.value!r}, which is reserved for {reserved.owner}: "
            f"batches of this source would take their ledger slots, and theirs would then be skipped as already "
            f"committed — give a name that does not begin with {others}; nothing was applied")


def ledger_query_id(query_name: str, run: str, partition: int | None = None) -> str:
    """The ledger's text for run ``run`` of source ``query_name`` (and one ``partition`` of a split batch):
    ``str(LedgerId(query_name, run, partition))`` — for a Spark query, ``run`` is its query id."""
    return str(LedgerId(query_name, run, partition))


def parse_ledger_query_id(query_id: str) -> tuple[str, str | None, int | None]:
    """``(source, run or None, partition or None)`` of a ledger id's text (:meth:`LedgerId.parse`); ids without a
    run (``capture:orders``, the plain-write baseline's bare ids) come back as ``(query_id, None, None)``."""
    parsed = LedgerId.parse(query_id)
    return parsed.source, parsed.run, parsed.partition


@dataclass(frozen=True)
class QueryStatus:
    """What one source (an ingestion query) has committed, from the ledger. Immutable.

    ``runs`` are the runs seen (for a Spark query its query ids, one per checkpoint); ``batches`` counts each run's
    distinct batch ids (a scale-out batch has one ledger row per partition), an end-of-stream release not among
    them, nor in ``last_batch_id`` (None when the source has no batch but a release); ``events``, ``dead_letters``
    and ``rule_firings`` are summed over every ledger row of the source, the releases' included: with them,
    ``events + dead_letters`` accounts for every row delivered.
    """

    query_name: str
    runs: tuple[str, ...]
    batches: int
    ledger_rows: int
    partitions: int | None
    last_batch_id: int | None
    events: int
    dead_letters: int
    watermark: dt.datetime | None
    first_committed_at: dt.datetime
    last_committed_at: dt.datetime
    rule_firings: Mapping[str, int] = field(default_factory=dict)


def ingestion_status(db: DatabaseHandle, query_name: str | None = None) -> list[QueryStatus]:
    """Per source, what the ledger of ``db`` (an ``activedb.Database``) holds, sorted by name; only
    ``query_name`` when given (then only its ledger rows are read).  Reads PostgreSQL only; works while an
    ingestion is running (committed batches only) and after it stopped."""
    if query_name is not None and (not isinstance(query_name, str) or not query_name):
        raise BadArgument(f"ingestion_status(query_name={query_name!r}) takes a source's name (a LedgerId's source: "
                          f"'badges', 'capture:orders'), or None for every source")
    if query_name is not None and _unstorable_at(query_name) is not None:
        return []
    ledger = db.table(LEDGER_TABLE)
    statement = sa.select(ledger.c.query_id, ledger.c.batch_id, ledger.c.events, ledger.c.dead_letters,
                          ledger.c.watermark, ledger.c.rule_firings, ledger.c.committed_at)
    if query_name is not None:
        # Every id whose source is ``query_name`` is the name itself or ``NAME@RUN[#pN]`` (``LedgerId``): only
        # those rows are read; the loop below keeps the ones that parse as its (``NAME@x@RUN`` is ``NAME@x``'s).
        statement = statement.where(sa.or_(ledger.c.query_id == query_name,
                                           ledger.c.query_id.startswith(f"{query_name}@", autoescape=True)))
    with db.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
        ledger_rows = connection.execute(statement).all()
    groups: dict[str, list[tuple[Any, str | None, int | None]]] = {}
    for row in ledger_rows:
        parsed = LedgerId.read(row.query_id)     # (as written: an earlier feed took a blank run)
        name, run, partition = parsed.source, parsed.run, parsed.partition
        if query_name is not None and name != query_name:
            continue
        groups.setdefault(name, []).append((row, run, partition))
    result = []
    for name in sorted(groups):
        entries = groups[name]
        rows = [row for row, _, _ in entries]
        firings: collections.Counter[str] = collections.Counter()
        for row in rows:
            firings.update({rule: int(count) for rule, count in (row.rule_firings or {}).items()})
        result.append(QueryStatus(
            query_name=name, runs=tuple(sorted({run for _, run, _ in entries if run is not None})),
            batches=len({(run, row.batch_id) for row, run, _ in entries if row.batch_id != END_OF_STREAM_BATCH}),
            ledger_rows=len(rows),
            partitions=len({partition for _, _, partition in entries if partition is not None}) or None,
            last_batch_id=max((row.batch_id for row in rows if row.batch_id != END_OF_STREAM_BATCH), default=None),
            events=sum(row.events for row in rows),
            dead_letters=sum(row.dead_letters for row in rows),
            watermark=max((row.watermark for row in rows if row.watermark is not None), default=None),
            first_committed_at=min(row.committed_at for row in rows),
            last_committed_at=max(row.committed_at for row in rows), rule_firings=dict(sorted(firings.items()))))
    return result


def sources_of_run(db: DatabaseHandle, run: str) -> set[str]:
    """The sources under which the ledger holds batches of the run ``run`` (normally one: a run renamed to
    another source would have its re-delivered batch applied again under the new name)."""
    if not isinstance(run, str) or not run or "@" in run or "#" in run:
        raise BadArgument(f"sources_of_run(run={run!r}) takes a run: a LedgerId's run, a non-empty string without '@' "
                          f"or '#' (a Spark query id, a feed's run=)")
    if _unstorable_at(run) is not None:     # (no ledger id holds such a run; a blank one, an earlier feed's, may)
        return set()
    ledger = db.table(LEDGER_TABLE)
    with db.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
        # Every distinct id of the run (a few: one per source and partition); a limit here could leave a source out.
        texts = connection.execute(sa.select(ledger.c.query_id).where(sa.or_(
            ledger.c.query_id.endswith(f"@{run}", autoescape=True),
            ledger.c.query_id.contains(f"@{run}#p", autoescape=True))).distinct()).scalars().all()
    return {parsed.source for parsed in map(LedgerId.read, texts) if parsed.run == run}


def forget_run(connection: sa.Connection, query_id: str) -> int:
    """Delete the ledger rows of the run ``query_id`` (its partitions' too) on ``connection`` (in the caller's
    transaction): its batches count as never applied, for a source that starts its numbering over under the
    same id (a capture consumer dropped and registered again).  Returns the rows deleted."""
    if not isinstance(query_id, str) or not query_id:
        raise BadArgument(f"forget_run(query_id={query_id!r}) takes a ledger id: str(LedgerId(source, run)), a "
                          f"non-empty string; nothing was deleted")
    if _unstorable_at(query_id) is not None:
        return 0
    ledger = sa.table(LEDGER_TABLE, sa.column("query_id"))
    return connection.execute(sa.delete(ledger).where(_run_and_partitions(ledger.c.query_id, query_id))).rowcount


def _run_and_partitions(column: sa.ColumnElement[str], query_id: str) -> sa.ColumnElement[bool]:
    """``column`` is the ledger id ``query_id`` or one of its partitions (``#pN``) — only a run has partitions: a
    source without a run named ``NAME#p1`` is another source (a capture consumer of that name), not ``NAME``'s."""
    if LedgerId.read(query_id).run is None:
        return column == query_id
    return sa.or_(column == query_id, column.startswith(f"{query_id}#p", autoescape=True))


def last_watermark(db: DatabaseHandle, query_id: str) -> dt.datetime | None:
    """The latest watermark the ledger recorded for ``query_id`` (its partitions included)."""
    ledger = db.table(LEDGER_TABLE)
    with db.catalog.autocommit_connection() as connection:     # (lost: DatabaseUnavailable)
        return connection.execute(sa.select(sa.func.max(ledger.c.watermark)).where(
            _run_and_partitions(ledger.c.query_id, query_id))).scalar()


#: The ledger row of a batch.  A batch there already makes it a unique violation of the ledger's primary key:
#: PostgreSQL then runs nothing more of the flush, and the flush raises ``BatchAlreadyCommitted`` (the row's
#: ``Along.refused``).  Driver SQL, sent with the flush's last round trip (no round trip of its own): it runs in
#: every batch's flush, where building and compiling a SQLAlchemy statement would cost more than PostgreSQL's
#: work for it, and a round trip of its own more still.
_LEDGER_ROW = (f"INSERT INTO {LEDGER_TABLE} (query_id, batch_id, transaction_id, events, dead_letters, watermark, "
               f"rule_firings, row_count) VALUES (%s, %s, %s, %s, %s, %s, CAST(%s AS jsonb), %s)")
#: The same row written in ``write``, where the event ids are recorded after it: refused (no row returned) when the
#: batch is there already — the ids' own check would otherwise take the duplicate batch for a conflict.
_LEDGER_ROW_IF_NEW = f"{_LEDGER_ROW} ON CONFLICT DO NOTHING RETURNING batch_id"


class IngestionLedger(CommitParticipant):
    """The ledger row of batch ``batch_id`` of ``query_id``, written in the batch's own PostgreSQL
    transaction (``db.transaction(participants=[ledger])``).  A batch already in the ledger raises
    :class:`~activedb.errors.BatchAlreadyCommitted` there, so its effects are never applied twice.

    The sink fills ``events``, ``dead_letters``, ``watermark`` and ``row_count`` (the rows the batch was
    delivered with: a re-delivery is compared with it, :func:`recorded_batch`) before the commit; the rule firings
    come from the rule manager.  ``on_flush(batch_id)`` is called when everything is written and the
    PostgreSQL transaction is about to commit (a seam for crash tests).
    """

    def __init__(self, db: DatabaseHandle, query_id: str, batch_id: int, *,
                 on_flush: Callable[[int], None] | None = None) -> None:
        self.db = db
        self.query_id = query_id
        self.batch_id = batch_id
        self.events = 0
        self.dead_letters = 0
        self.watermark: dt.datetime | None = None
        self.row_count: int | None = None      # (None: not known — not compared with a re-delivery)
        self.rule_firings: dict[str, int] = {}
        #: With an event-id column: the query's name and the ids of the events the batch processed,
        #: recorded in the same transaction (duplicate detection across batches and checkpoints).
        self.query_name: str | None = None
        self.event_ids: list[str] = []
        self._on_flush = on_flush
        self.flush_began: float | None = None

    def before_flush(self, transaction: Transaction) -> None:
        self.flush_began = time.perf_counter()
        self.rule_firings = self.db.rules.firings_in(transaction)

    def write(self, transaction: Transaction, connection: sa.Connection) -> None:
        if not self.event_ids:
            return              # the row goes with the flush's last round trip (statements_along)
        if connection.exec_driver_sql(_LEDGER_ROW_IF_NEW, self._row(transaction)).first() is None:
            raise self._duplicate()
        self._record_event_ids(connection)

    def statements_along(self, transaction: Transaction) -> tuple[Along, ...]:
        """The ledger row (unless ``write`` wrote it, before the event ids), with the flush's last round trip; a
        duplicate is ``BatchAlreadyCommitted``."""
        return () if self.event_ids else (Along(_LEDGER_ROW, self._row(transaction), self._refused),)

    def _row(self, transaction: Transaction) -> tuple[object, ...]:
        # The rule firings as they stand now, every other participant having written (the ledger is enlisted last):
        # a batch run at commit records the firings of what its rules did then (``activedb.batch.apply_lowered``).
        self.rule_firings = self.db.rules.firings_in(transaction)
        return (self.query_id, self.batch_id, transaction.log_id, self.events, self.dead_letters, self.watermark,
                json.dumps(self.rule_firings), self.row_count)

    def _duplicate(self) -> BatchAlreadyCommitted:
        return BatchAlreadyCommitted(f"batch {self.batch_id} of query {self.query_id!r} was already committed; its "
                                     f"effects are not applied twice")

    def _refused(self, error: BaseException) -> BaseException | None:
        """``BatchAlreadyCommitted`` if ``error`` is a unique violation of the ledger (this batch's row exists)."""
        orig = getattr(error, "orig", None)
        if (getattr(orig, "sqlstate", None) != UNIQUE_VIOLATION
                or getattr(getattr(orig, "diag", None), "table_name", None) != LEDGER_TABLE):
            return None
        return self._duplicate()

    def _record_event_ids(self, connection: sa.Connection) -> None:
        table = self.db.table(EVENT_ID_TABLE)
        inserted = connection.execute(
            postgresql.insert(table).on_conflict_do_nothing().returning(table.c.event_id),
            [{"query_name": self.query_name, "event_id": event_id, "query_id": self.query_id,
              "batch_id": self.batch_id} for event_id in self.event_ids]).all()
        if len(inserted) != len(self.event_ids):
            raise SerializationConflict(
                f"batch {self.batch_id} of {self.query_id!r}: {len(self.event_ids) - len(inserted)} of its event "
                f"ids were ingested by another process meanwhile; nothing was written — the batch is re-run and "
                f"finds them duplicates")

    def acts_before_commit(self, transaction: Transaction) -> bool:
        return self._on_flush is not None

    def about_to_commit(self, transaction: Transaction, connection: sa.Connection) -> None:
        if self._on_flush is not None:
            self._on_flush(self.batch_id)


def ingested_event_ids(db: DatabaseHandle, query_name: str, event_ids: list[str]) -> dict[str, tuple[str, int]]:
    """Of ``event_ids``, those already ingested under ``query_name``: ``{event id: (query id, batch id)}``."""
    if not event_ids:
        return {}
    table = db.table(EVENT_ID_TABLE)
    # The ids as one array parameter (``= ANY``): a batch may hold more ids than the 65,535 parameters PostgreSQL
    # takes in a statement, which an ``IN`` list of one parameter each would exceed.
    ids = sa.bindparam("event_ids", list(dict.fromkeys(event_ids)), type_=postgresql.ARRAY(table.c.event_id.type))
    with db.catalog.autocommit_connection() as connection:     # (a lost connection: DatabaseUnavailable)
        rows = connection.execute(sa.select(table.c.event_id, table.c.query_id, table.c.batch_id).where(
            table.c.query_name == query_name, table.c.event_id == sa.any_(ids))).all()
    return {row.event_id: (row.query_id, row.batch_id) for row in rows}


@dataclass(frozen=True)
class RecordedBatch:
    """What the ledger recorded of a committed batch that a re-delivery is compared with. Immutable.

    ``rows``: how many rows it was delivered with (None: committed before revision 0018_ledger_row_count)."""

    rows: int | None

    def check_delivered_again(self, query_id: str, batch_id: int, rows: int) -> None:
        """Raise :class:`IngestError` if the batch came again with another number of rows than it was committed
        with: the source does not replay the same batches, and skipping this one while applying the next would
        apply some rows twice (or never)."""
        if self.rows is not None and self.rows != rows:
            raise IngestError(
                f"batch {batch_id} of {query_id} was committed with {self.rows} rows and came again with {rows}: the "
                f"source does not replay the same batches (the same number carries the same rows), so skipping this "
                f"one and applying the next would apply rows twice or never; nothing of it was applied — feed the "
                f"same batches as before, or feed these under a new run= (or a new source)")


def recorded_batch(db: DatabaseHandle, query_id: str, batch_id: int) -> RecordedBatch | None:
    """What the ledger of ``db`` recorded of batch ``(query_id, batch_id)``, None if it does not have it."""
    if isinstance(query_id, str) and _unstorable_at(query_id) is not None:
        return None
    LedgerId.read(query_id)         # (BadArgument for what is no ledger id's text; a blank run is read)
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or not -2**63 <= batch_id < 2**63:
        raise BadArgument(f"batch_committed(batch_id={batch_id!r}) takes a batch number, an integer (a Batch's number) "
                          f"the ledger's bigint holds")
    ledger = db.table(LEDGER_TABLE)
    with db.catalog.autocommit_connection() as connection:     # (a lost connection: DatabaseUnavailable)
        row = connection.execute(sa.select(ledger.c.row_count).where(
            ledger.c.query_id == query_id, ledger.c.batch_id == batch_id)).first()
    return None if row is None else RecordedBatch(row.row_count)


def batch_committed(db: DatabaseHandle, query_id: str, batch_id: int) -> bool:
    """True if ``(query_id, batch_id)`` is in the ingestion ledger of ``db`` (its effects are committed)."""
    return recorded_batch(db, query_id, batch_id) is not None
