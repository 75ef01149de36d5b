"""The catalog: tables reflected lazily (once; :meth:`Catalog.refresh` after migrations in the same process),
their :class:`TableInfo`, and generated keys drawn from sequences.

Thread-safety: ``_mutex`` protects ``_metadata``, ``_tables``, ``_infos``, ``_sequences``, ``_key_blocks``,
``_key_sizes``, ``_key_history`` and ``_reset_at``; no SQL runs while it is held.  ``_reflect_mutex``
serialises reflection (which runs SQL) and is taken before ``_mutex``, never after.  Readers use the
published dicts without a mutex (one lookup, atomic) and fall back to the locked path on a miss.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Iterator

import psycopg
import sqlalchemy as sa
from psycopg.pq import TransactionStatus

from activedb.errors import (Failure, GeneratedKeysReset, TransactionError, UnknownTable, classify,
                             database_failure)
from activedb.store import _prepared as prepared
from activedb.store._choices import IsolationLevel
from activedb.store._schema import TableInfo
from activedb.store._sql import driver_error
from activedb.store._writeset import TableRef

#: Generated keys are drawn from a sequence this many at a time at first (one round trip per block) ...
KEY_BLOCK = 64
#: ... and twice as many each time a block runs out within the transaction tree that drew it, or within
#: :data:`KEY_BLOCK_SECONDS` of its draw, up to this many (a tree inserting thousands of rows takes a few round
#: trips, not one per 64 keys; a stream of small trees, one draw every few seconds, not one per tree).
KEY_BLOCK_MAX = 4096
#: A block used up this soon after its draw makes the next one twice as large, whichever tree used it.
KEY_BLOCK_SECONDS = 1.0
#: How many drawn blocks per sequence are remembered to check generated keys at the flush.
KEY_HISTORY = 256
#: How many autocommit connections ``Catalog.idle`` keeps checked out between two uses.
IDLE_KEPT = 8
_IDLE = TransactionStatus.IDLE
#: ``Connection.info`` key: the ``IdleConnections`` generation a connection was taken from the pool in.
_GENERATION = "activedb.idle_generation"
#: Per sequence named in the array, its storage and last value, both NULL for one dropped since (``to_regclass``: a
#: cast would fail the whole query, so every flush that asks; ``check_generated_keys``; driver SQL: every flush that
#: inserts generated keys runs it, where building a SQLAlchemy text clause each time costs more than its round trip).
_STILL_DRAWN_ALL = ("SELECT s, pg_relation_filenode(to_regclass(s)), pg_sequence_last_value(to_regclass(s)) "
                    "FROM unnest(CAST(%s AS text[])) AS s")
_DRAW = ("SELECT ARRAY(SELECT nextval(CAST(%s AS regclass)) FROM generate_series(1, %s)), "
         "pg_relation_filenode(CAST(%s AS regclass))")


@dataclass(frozen=True)
class KeysCheck:
    """Whether generated keys are still the sequences' (:meth:`Catalog.generated_keys_check`): ``sql`` (driver SQL)
    with ``parameters`` to send, then ``judge(rows)`` with its rows, which raises ``GeneratedKeysReset`` for a key
    given out again.  Immutable."""

    sql: str
    parameters: tuple[object, ...]
    judge: Callable[[Sequence[tuple[str, int | None, int | None]]], None]


class IdleConnections:
    """Connections in autocommit at the driver, for a transaction their user opens in its first query
    (``lock_row(begin=…)``) or a one-statement read (``Catalog.autocommit_connection``), kept checked out
    between two uses: taking one from the pool, setting autocommit and resetting it on return cost more than
    the statement each use runs.  At most :data:`IDLE_KEPT` wait here; one given back inside a transaction, closed or
    invalidated is closed instead.

    Outside the pool, kept connections escape its invalidation: when a statement finds its connection lost
    (a restart, ``pg_terminate_backend``), SQLAlchemy's pool discards every connection it opened before, and
    these are discarded with them — each is stamped with the :attr:`_generation` it was taken in (its
    ``Connection.info``, which lives as long as the driver's connection), the pool's ``invalidate`` event for a
    lost connection starts the next generation, and a connection of an earlier one is closed when taken or
    given back, never handed out.  So after an outage that anything saw, the next read gets a fresh
    connection, as it would from the pool.  Thread-safe (``_mutex``, a leaf: no SQL under it)."""

    def __init__(self, engine: sa.Engine):
        self._engine = engine
        self._mutex = threading.Lock()
        self._idle: list[sa.Connection] = []
        self._closed = False
        self._pid = os.getpid()
        #: Connections kept by the parent of a forked process: never used, closed nor collected here (their
        #: sockets are the parent's; a close would end the parent's sessions).
        self._inherited: list[sa.Connection] = []
        #: Bumped when the pool finds a connection lost; a connection stamped with an earlier one is not reused.
        self._generation = 0
        sa.event.listen(engine, "engine_disposed", lambda _: self.drop())
        sa.event.listen(engine, "invalidate", self._pool_invalidated)

    def take(self) -> sa.Connection:
        """A connection in autocommit at the driver, no transaction open (give it back with ``give_back``)."""
        stale = []
        with self._mutex:
            self._adopt()
            while self._idle:
                kept = self._idle.pop()
                if kept.info.get(_GENERATION) == self._generation:
                    break
                stale.append(kept)
            else:
                kept = None
            generation = self._generation
        for connection in stale:
            _discard(connection)
        if kept is not None:
            return kept
        connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        connection.info[_GENERATION] = generation       # (fresh from the pool: the pool answers for it)
        prepared.watch(connection)      # its statements prepared on the server outlive a rollback only checked
        return connection

    def give_back(self, connection: sa.Connection) -> None:
        """Keep ``connection`` for the next ``take`` if it is usable and outside a transaction, else close it.  One
        found lost drops the kept ones too (most likely lost with it; the pool drops its own so)."""
        if connection.invalidated:
            self.drop()
        elif not (connection.closed or connection.in_transaction()
                  or connection.connection.driver_connection.pgconn.transaction_status != _IDLE):  # type: ignore[union-attr]
            with self._mutex:
                stale = connection.info.get(_GENERATION) != self._generation
                if not (stale or self._closed or len(self._idle) >= IDLE_KEPT):
                    self._idle.append(connection)
                    return
            if stale:
                _discard(connection)
                return
        connection.close()

    def _pool_invalidated(self, dbapi_connection: object, record: object, error: BaseException | None) -> None:
        """The pool's ``invalidate`` event: a connection found lost (``error`` says so; an invalidation without an
        error is a deliberate close, e.g. to end a lock wait) starts a new generation.  No SQL, no close here
        (the event fires inside the pool): stale connections are closed by ``take`` and ``give_back``."""
        if error is not None and classify(error) is Failure.CONNECTION_LOST:
            with self._mutex:
                self._generation += 1

    def _adopt(self) -> None:
        """Caller holds ``_mutex``.  In a forked process, set the parent's kept connections aside for good."""
        if self._pid != os.getpid():
            self._inherited.extend(self._idle)
            self._idle, self._pid = [], os.getpid()

    def drop(self) -> None:
        """Close the kept connections (also when the engine is disposed: the pool's connections are new then)."""
        with self._mutex:
            self._adopt()
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def close(self) -> None:
        """Close the kept connections (before the engine is disposed); later ones given back are closed."""
        with self._mutex:
            self._closed = True
        self.drop()


def _discard(connection: sa.Connection) -> None:
    """Close a connection of an earlier generation without the pool's reset (its ROLLBACK on a dead connection would
    fail and count as another loss): invalidated on purpose, which starts no generation."""
    connection.invalidate()
    connection.close()


class Xid8(sa.types.UserDefinedType[str]):
    """PostgreSQL's ``xid8`` (a 64-bit transaction id; capture's change and commit rows hold one), which SQLAlchemy's
    dialect does not reflect: it warned ("Did not recognize type 'xid8'") wherever such a table was reflected.  Its
    values are read as psycopg gives them."""

    cache_ok = True

    def get_col_spec(self, **options: object) -> str:
        return "XID8"


def _know_types(dialect: sa.Dialect) -> None:
    """Teach ``dialect`` (one engine's, not the class's) the PostgreSQL types activedb's tables use that SQLAlchemy does
    not reflect (:class:`Xid8`)."""
    known = getattr(dialect, "ischema_names", None)
    if isinstance(known, dict) and "xid8" not in known:
        dialect.ischema_names = {**known, "xid8": Xid8}     # type: ignore[attr-defined]


class Catalog:
    """Reflected tables and generated keys of one database (``describe`` names it in messages)."""

    def __init__(self, engine: sa.Engine, describe: Callable[[], str]):
        self.engine = engine
        _know_types(engine.dialect)
        self._describe = describe
        self._mutex = threading.Lock()
        self._reflect_mutex = threading.Lock()   # serialises reflection (SQL under it; a leaf otherwise)
        self._metadata = sa.MetaData()
        self._tables: dict[str, sa.Table] = {}
        self._infos: dict[str, TableInfo] = {}
        self._sequences: dict[tuple[str, str], str | None] = {}
        self._key_blocks: dict[str, list[int]] = {}     # sequence -> drawn, unused values (largest first)
        # sequence -> (size of its last block, when the tree that drew it began, when it was drawn: time.monotonic)
        self._key_sizes: dict[str, tuple[int, datetime.datetime | None, float]] = {}
        #: A block used up within this many seconds of its draw doubles the next one (:data:`KEY_BLOCK_SECONDS`).
        self.key_block_seconds = KEY_BLOCK_SECONDS
        # sequence -> (lowest, highest value, sequence storage) of recently drawn blocks, oldest first
        self._key_history: dict[str, collections.deque[tuple[int, int, int]]] = {}
        # sequence -> when a draw found it reset (transactions that began before may hold stale keys)
        self._reset_at: dict[str, datetime.datetime] = {}
        # The sequences that count down (a negative increment, as their last draw showed): they have handed out
        # every value from their start down to their last value, so a key is ahead of them when it is below it.
        self._descending: set[str] = set()
        self._pool_isolation: str | None = None        # the isolation level of a checked-out connection
        self.idle = IdleConnections(engine)

    def describe(self) -> str:
        """Host, port and database, password masked (for messages)."""
        return self._describe()

    # --- tables -------------------------------------------------------------------------------

    def table(self, name: str | sa.Table) -> sa.Table:
        """The reflected ``Table`` called ``name``; raises :class:`UnknownTable` if it does not exist."""
        if isinstance(name, sa.Table):
            name = name.name
        elif not isinstance(name, str):
            raise UnknownTable(f"a table is named by a string or a sqlalchemy Table, got {name!r}")
        table = self._tables.get(name)
        if table is not None:
            return table
        # Reflection into one MetaData must not race (a half-reflected Table is visible in it): one at
        # a time, under _reflect_mutex, which is held only around reflection and takes no other mutex.
        with self._reflect_mutex:
            table = self._tables.get(name)
            if table is not None:
                return table
            metadata = self._metadata
            try:
                table = sa.Table(name, metadata, autoload_with=self.engine)
            except sa.exc.OperationalError as error:
                raise self.database_failure(error, f"reading the columns of {name!r}") from error
            except sa.exc.NoSuchTableError:
                if len(name) > 2 and name[0] == name[-1] == '"':        # an SQL identifier, as `psql` takes it
                    raise UnknownTable(
                        f"no table {name!r} in {self._describe()}: activedb takes a table's name as PostgreSQL "
                        f"stores it (mixed case, spaces and dots as they are), without SQL's double quotes — name "
                        f"it {name[1:-1].replace(chr(34) * 2, chr(34))!r}") from None
                if "." in name:
                    raise self._schema_qualified(*name.rsplit(".", 1)) from None
                if name.startswith("activedb_"):    # (activedb's own: its revisions, not the application's, make it)
                    raise UnknownTable(
                        f"no table {name!r} in {self._describe()}: it is one of activedb's own tables, which "
                        f"activedb's revisions create — `activedb db upgrade`, or activedb.connect() without "
                        f"upgrade=False, brings them to this activedb's head (`activedb db current` says where they "
                        f"are: behind, or never created)") from None
                raise UnknownTable(
                    f"no table {name!r} in {self._describe()}; tables are created by Alembic migrations "
                    f"(db.upgrade_app('path/to/migrations') runs your own; `activedb app upgrade PATH` from "
                    f"the shell)"
                ) from None
            with self._mutex:
                if metadata is self._metadata:
                    table = self._tables.setdefault(name, table)
        return table

    def _schema_qualified(self, schema: str, name: str) -> UnknownTable:
        """The error for a table named with its schema, ``schema.name``, which the store does not take: a table is
        named by its name alone everywhere (write sets, rules, the transaction log), as the connection's
        ``search_path`` finds it."""
        default = self.engine.dialect.default_schema_name or "public"
        advice = (f"name it {name!r}" if schema == default else
                  f"name it {name!r} and put its schema on the search path after the default one, e.g. "
                  f"?options=-csearch_path%3D{default},{schema} in the URL given to activedb.connect (or ALTER ROLE "
                  f"... SET search_path)")
        return UnknownTable(f"no table {schema}.{name} in {self._describe()}: activedb names a table without its "
                            f"schema, as the connection's search_path finds it (schema-qualified names are not "
                            f"supported) — {advice}")

    def table_info(self, table: TableRef) -> TableInfo:
        """The :class:`TableInfo` of ``table`` (a name or a ``sqlalchemy.Table``, not of another schema than the
        default one: :meth:`_schema_qualified`)."""
        if table.__class__ is str:          # (a name known already: every read and write asks)
            info = self._infos.get(table)
            if info is not None:
                return info
        name = table if isinstance(table, str) else getattr(table, "name", None)
        if not isinstance(name, str):
            raise TransactionError(f"a table is named by a string or a sqlalchemy Table, got {table!r}")
        schema = getattr(table, "schema", None)
        if schema is not None and schema != self.engine.dialect.default_schema_name:
            raise self._schema_qualified(schema, name)      # (its name alone may be another table)
        info = self._infos.get(name)
        if info is None:
            info = TableInfo(self.table(name))
            with self._mutex:
                info = self._infos.setdefault(name, info)
        return info

    def refresh(self) -> None:
        """Forget every reflected table (after running migrations in this process, or a column change capture met)
        and the cached blocks of generated keys, whose sequences a migration may have replaced.  The history of the
        blocks drawn stays: the keys transactions in flight took from them are checked against it at their flush
        (``generated_keys_check``), and a sequence replaced or reset since is found there, or at the next draw, by
        its storage, as any reset is."""
        with self._mutex:
            self._metadata = sa.MetaData()
            self._tables = {}
            self._infos = {}
            self._sequences = {}
            self._key_blocks = {}
            self._key_sizes = {}

    # --- connections and generated keys -------------------------------------------------------

    def connect(self, isolation_level: IsolationLevel) -> sa.Connection:
        """A pooled connection at ``isolation_level`` (the caller closes it).  The execution option is set only
        when the pool's connections are at another level: setting it on checkout and resetting it on return are
        two driver calls per connection, on the path of every commit."""
        level = self._pool_isolation
        if level is None:
            with self.engine.connect() as probe:       # what a checked-out connection is at (asked once)
                level = self._pool_isolation = probe.get_isolation_level()
        connection = self.engine.connect()
        if isolation_level != level:
            connection = connection.execution_options(isolation_level=isolation_level)
        return connection

    @contextlib.contextmanager
    def autocommit_connection(self) -> Iterator[sa.Connection]:
        """A connection for one-statement reads of committed data: autocommit, so no BEGIN/ROLLBACK
        round trips around the statement (a read is atomic on its own).  A lost connection becomes
        :class:`DatabaseUnavailable` (the pool reconnects next time), another refusal
        :class:`DatabaseError` (:func:`activedb.errors.database_failure`)."""
        try:
            connection = self.idle.take()     # kept in autocommit: no pool checkout nor isolation switch per read
            try:
                yield connection
                connection.commit()           # (ends SQLAlchemy's own transaction; nothing is sent)
            finally:
                self.idle.give_back(connection)
        except sa.exc.DBAPIError as error:      # (lost, and refused: a ProgrammingError such as 42703 or 42501 too)
            if classify(error) in (Failure.SERIALIZATION_CONFLICT, Failure.DEADLOCK):
                raise                       # retried by their callers
            raise self.database_failure(error, "reading") from error

    @contextlib.contextmanager
    def writing(self, doing: str, lost: str) -> Iterator[sa.Connection]:
        """A transaction of its own for a write (``engine.begin()``: committed when the block ends) whose lost
        connection becomes :class:`DatabaseUnavailable` saying it was lost while ``doing``, then ``lost`` (what was or
        was not written — a connection lost at the COMMIT leaves that unknown — and what to do).  Any other error
        propagates as it is."""
        try:
            with self.engine.begin() as connection:
                yield connection
        except sa.exc.DBAPIError as error:
            if classify(error) is not Failure.CONNECTION_LOST:
                raise
            raise self.database_failure(error, doing, lost=lost) from error

    def database_failure(self, error: BaseException, doing: str, *, lost: str | None = None) -> Exception:
        """The documented error for a database ``error`` met while ``doing`` (unavailable, refused, disk
        full: :func:`activedb.errors.database_failure`; ``lost``: what a lost connection of a write left), naming the
        embedded server's log if it is one.  The statements are composed from the tables as reflected here: a column
        or table PostgreSQL no longer finds says to :meth:`refresh` them."""
        return database_failure(error, doing, self._describe(), server_log=self.server_log(), lost=lost,
                                reflected=True)

    def server_log(self) -> str | None:
        """Where the server's log is, when this is an embedded server of this process (for advice)."""
        from activedb._embedded import log_of_url

        return log_of_url(self.engine.url)

    def sequence_of(self, info: TableInfo, column: str) -> str | None:
        """The sequence behind a serial/identity ``column`` (cached per table), or None."""
        key = (info.name, column)
        sequences = self._sequences
        if key not in sequences:
            with self.autocommit_connection() as connection:
                # The table is read as an identifier (folded to lower case unless quoted: quote_ident), the column
                # literally.
                name = connection.execute(sa.text("SELECT pg_get_serial_sequence(quote_ident(:t), :c)"),
                                          {"t": info.name, "c": column}).scalar()
            with self._mutex:
                self._sequences[key] = name
            return name
        return sequences[key]

    def next_generated_key(self, sequence: str, since: datetime.datetime | None = None) -> int:
        """The next value of ``sequence``, drawn in blocks (one round trip per block; unused values of a
        block are gaps, as after any rollback in PostgreSQL).  A block is :data:`KEY_BLOCK` values, twice
        the last one's when the last one ran out in the tree that drew it (same ``since``) or within
        :attr:`key_block_seconds` of its draw, at most :data:`KEY_BLOCK_MAX`.  Every value handed out is checked
        again at the flush of the transaction that used it (:meth:`check_generated_keys`).

        ``since``: when the transaction asking began.  If the sequence was found reset after that, the
        transaction may hold keys from before the reset, which the sequence now hands out again — a fresh
        key could equal one it already used: :class:`~activedb.errors.GeneratedKeysReset` (re-run it)."""
        with self._mutex:
            self._check_not_reset_since(sequence, since)
            block = self._key_blocks.get(sequence)
            if block:
                return block.pop()
        return self.generated_keys(sequence, 1, since)[0][0]

    def generated_keys(self, sequence: str, count: int,
                       since: datetime.datetime | None = None) -> tuple[list[int], int]:
        """``count`` (at least one) values of ``sequence``, ascending, as :meth:`next_generated_key` hands them out,
        and the storage of their blocks, which their one inserting statement checks (:attr:`STILL_DRAWN`).  A block
        drawn for them holds eight such requests (at most :data:`KEY_BLOCK_MAX`): a caller taking many at a time
        (the outbox at each flush) draws once every few requests."""
        keys: list[int] = []
        storage = 0
        while True:
            with self._mutex:
                self._check_not_reset_since(sequence, since)
                block = self._key_blocks.get(sequence)
                if block:
                    if storage != self._key_history[sequence][-1][2]:
                        keys, storage = [], self._key_history[sequence][-1][2]    # a reset between: gaps
                    cut = max(len(block) - count + len(keys), 0)
                    keys += reversed(block[cut:])
                    del block[cut:]
                if len(keys) == count:
                    return keys, storage
                # The block's size: doubled when the last one was used up by the tree that drew it or soon after
                # its draw, else kept.
                now = time.monotonic()
                last = self._key_sizes.get(sequence)
                if last is None:
                    size = KEY_BLOCK
                else:
                    size, drawn_by, drawn_at = last
                    if (since is not None and since == drawn_by) or now - drawn_at < self.key_block_seconds:
                        size = min(size * 2, KEY_BLOCK_MAX)
                self._key_sizes[sequence] = (size, since, now)
                size = max(size, min(8 * count, KEY_BLOCK_MAX), count - len(keys))
            values, drawn = self._draw(sequence, size)
            down = len(values) > 1 and values[0] > values[1]     # (nextval's order; KEY_BLOCK values at least)
            values.sort(reverse=True)
            with self._mutex:
                (self._descending.add if down else self._descending.discard)(sequence)
                self._remember_block(sequence, values, drawn)
                self._key_blocks.setdefault(sequence, []).extend(values)

    def _draw(self, sequence: str, count: int) -> tuple[list[int], int]:
        """``count`` values of ``sequence`` and the sequence's storage (``pg_relation_filenode``), which
        ``TRUNCATE ... RESTART IDENTITY`` and ``ALTER SEQUENCE ... RESTART`` change."""
        with self.autocommit_connection() as connection:
            driver = connection.connection.driver_connection      # (SQLAlchemy's execution and rows cost more)
            assert driver is not None
            try:
                values, storage = driver.execute(_DRAW, (sequence, count, sequence)).fetchone()
            except psycopg.Error as error:
                raise driver_error(_DRAW, (), error, driver) from None
        return values, storage

    def _remember_block(self, sequence: str, values: list[int], storage: int) -> None:
        """Record a drawn block.  A block whose storage differs from the last one's means the sequence was
        reset since (``TRUNCATE … RESTART IDENTITY``, ``ALTER SEQUENCE … RESTART``): the older blocks are
        forgotten (their values overlap the new ones, so they can no longer be told apart by value — a
        ``setval`` lower, which keeps the storage, is caught at the flush by the last-value check only as
        long as no block was drawn after it) and the reset's time is kept —
        every transaction older than it fails at its flush (:meth:`check_generated_keys`).  Caller holds
        ``_mutex``."""
        if not values:
            return
        history = self._key_history.get(sequence)
        if history and history[-1][2] != storage:
            self._key_blocks.pop(sequence, None)
            history.clear()
            self._reset_at[sequence] = datetime.datetime.now(datetime.timezone.utc)
        history = self._key_history.setdefault(sequence, collections.deque(maxlen=KEY_HISTORY))
        history.append((min(values), max(values), storage))

    def _check_not_reset_since(self, sequence: str, since: datetime.datetime | None) -> None:
        """Caller holds ``_mutex``."""
        reset_at = self._reset_at.get(sequence)
        if since is not None and reset_at is not None and since <= reset_at:
            raise GeneratedKeysReset(
                f"the sequence {sequence} was reset (e.g. TRUNCATE ... RESTART IDENTITY) while this transaction "
                f"ran: keys it took before may be handed out again; nothing was written — re-run the transaction "
                f"(Database.run(fn) does)", sequence=sequence)

    def check_generated_keys(self, connection: sa.Connection, used: dict[str, list[int]],
                             since: datetime.datetime | None = None) -> None:
        """Raise :class:`~activedb.errors.GeneratedKeysReset` if a value in ``used`` (sequence -> values a
        transaction is about to insert) was drawn from a sequence that has since been reset: its storage
        changed (``TRUNCATE ... RESTART IDENTITY``, ``ALTER SEQUENCE ... RESTART``) or its last value is
        now below the value (``setval``; above it, for a sequence that counts down) — the sequence would hand the
        value out again.  The cached blocks
        of such a sequence are dropped.  One query for all sequences (:meth:`generated_keys_check`); values this
        catalog did not draw (explicit keys) are not judged here (an insert that collides still fails with
        ``DuplicateKey``)."""
        check = self.generated_keys_check(used, since)
        if check is not None:
            check.judge(connection.exec_driver_sql(check.sql, check.parameters).all())

    def generated_keys_check(self, used: dict[str, list[int]], since: datetime.datetime | None = None
                             ) -> KeysCheck | None:
        """:meth:`check_generated_keys` as a query to send with other statements (in a driver pipeline: no round
        trip of its own) and the judgement of its rows; None if there is nothing to ask.  A reset found already
        (since ``since``) raises at once.  The caller must not commit before ``judge`` returned."""
        with self._mutex:
            for sequence in used:
                self._check_not_reset_since(sequence, since)
            if not any(self._key_history.get(sequence) for sequence in used):
                return None
            # Every sequence with cached blocks is asked about, not only those used: a reset found drops the cached
            # blocks of each sequence it reset (a TRUNCATE … RESTART IDENTITY of several tables), so that the re-run
            # draws every one afresh, rather than one more re-run per sequence.
            histories = {sequence: list(history) for sequence, history in self._key_history.items() if history}
            descending = self._descending & histories.keys()

        def judge(rows: Sequence[tuple[str, int | None, int | None]]) -> None:
            found: GeneratedKeysReset | None = None
            for sequence, storage, last_value in rows:
                if storage is None:               # (dropped, with its table: an insert into that fails by itself)
                    self.invalidate_key_blocks(sequence)
                    continue
                history = histories[sequence]     # (one storage: _remember_block empties it when the storage changes)
                if last_value is None:            # (never drawn since a reset: none of the blocks is the sequence's)
                    stale, last_value = True, 0
                else:
                    stale = history[-1][2] != storage
                down = sequence in descending     # (then a value not handed out yet is below the last value)
                for value in used.get(sequence, ()):   # (the block search last: it tells a key drawn here from another)
                    ahead = value < last_value if down else value > last_value
                    if (stale or ahead) and any(low <= value <= high for low, high, _ in history):
                        found = found or self.keys_reset(sequence, value)
                        break
                else:
                    set_back = last_value > history[-1][0] if down else last_value < history[-1][1]
                    if sequence not in used and (stale or set_back):
                        self.invalidate_key_blocks(sequence)       # (set back behind its last block: a reset)
            if found is not None:
                raise found

        return KeysCheck(_STILL_DRAWN_ALL, (list(histories),), judge)

    #: Holds iff keys handed out with a storage (the first placeholder), the highest of them the second, are still
    #: unused by the sequence (the third): :meth:`check_generated_keys` as a condition of their inserting statement.
    STILL_DRAWN = ("(SELECT pg_relation_filenode(q.s) = %s AND pg_sequence_last_value(q.s) >= %s "
                   "FROM (VALUES (CAST(%s AS regclass))) AS q(s))")

    def keys_reset(self, sequence: str, value: int) -> GeneratedKeysReset:
        """The error for a generated ``value`` of ``sequence`` found given away again by a reset (the
        sequence's cached blocks are dropped)."""
        self.invalidate_key_blocks(sequence)
        return GeneratedKeysReset(
            f"the sequence {sequence} was reset (e.g. TRUNCATE ... RESTART IDENTITY) after this "
            f"transaction took the generated key {value} from it: the key may be handed out again; "
            f"nothing was written — re-run the transaction (Database.run(fn) does; its next keys "
            f"come from the sequence as it is now)", sequence=sequence)

    def invalidate_key_blocks(self, sequence: str | None = None) -> None:
        """Forget cached generated keys (of ``sequence``, or of every sequence): the next insert draws fresh
        ones.  Called when a reset is detected, and after an insert of a generated key collided."""
        with self._mutex:
            now = datetime.datetime.now(datetime.timezone.utc)
            if sequence is None:
                self._reset_at = dict.fromkeys(set(self._key_blocks) | set(self._key_history), now)
                self._key_blocks = {}
                self._key_history = {}
            else:
                self._key_blocks.pop(sequence, None)
                self._key_history.pop(sequence, None)
                self._reset_at[sequence] = now
