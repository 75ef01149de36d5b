"""The plain write path: Spark micro-batches into PostgreSQL with no rules, exactly once — the baseline of
``activedb bench ingest`` (the benchmarks' ``README.md``) and the smallest instance of an exactly-once
``foreachBatch`` sink (a ledger row in the batch's transaction), used by the Spark crash tests as their
simplest subject.  Not part of activedb: the product's one batch protocol is ``activedb.ingest``'s.

Public names: :class:`PlainWriteSink` (the ``foreachBatch`` callable) and
:class:`PlainWriteStatistics`. psycopg and pyarrow are imported when first used; pyspark
is never imported here (the batch DataFrame arrives from Spark).
"""

from __future__ import annotations

import dataclasses
import io
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_bridge import streaming_query_id
from spark_bridge.errors import SparkBridgeError

__all__ = ["PlainWriteSink", "PlainWriteStatistics", "psycopg_conninfo"]

_METHODS = ("copy", "executemany")


@dataclass(frozen=True)
class PlainWriteStatistics:
    """What a :class:`PlainWriteSink` has done so far. Immutable snapshot."""

    batches_written: int
    batches_skipped: int
    rows_written: int
    seconds_to_arrow: float  # inside batch_df.toArrow() (runs the Spark job of the batch)
    seconds_in_database: float  # the ledger insert, the COPY/executemany and the commit


def psycopg_conninfo(dsn: str) -> str:
    """A libpq connection string from ``dsn``, accepting SQLAlchemy's ``+psycopg`` URLs."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres+psycopg://"):
        if dsn.startswith(prefix):
            return "postgresql://" + dsn[len(prefix):]
    return dsn


def _identifier(name: str) -> Any:
    from psycopg import sql

    return sql.Identifier(*name.split("."))


class PlainWriteSink:
    """``foreachBatch`` callable writing each micro-batch's rows to ``table``, exactly once.

    ``dsn`` is a libpq string or URL (SQLAlchemy's ``postgresql+psycopg://`` accepted).
    ``columns`` are the batch columns to write (default: all), into same-named columns of
    ``table``. ``ledger_table`` must have a unique key on ``(query_id, batch_id)``;
    ``ledger_values`` adds constant columns to the ledger row (for example
    ``{"transaction_id": "plain-write"}`` for activedb's ledger) and
    ``ledger_count_column`` names a column to receive the batch's row count.
    ``on_conflict`` (``method="executemany"`` only): the text after ``ON CONFLICT`` of each row's
    ``INSERT``, e.g. ``"(key) DO UPDATE SET n = counters.n + EXCLUDED.n"`` — the rows become upserts.
    ``query_id`` defaults to the streaming query's id, read inside each batch.
    ``on_phase(phase, batch_id)`` is a seam for crash tests: called with ``"written"``
    inside the transaction just before it commits, and with ``"committed"`` (or
    ``"skipped"``) after the transaction has ended.

    Thread-safety: Spark calls ``foreachBatch`` once at a time per query; ``self._mutex``
    serialises calls anyway, so one sink may also be driven by hand from several threads.
    """

    def __init__(self, dsn: str, table: str, *, columns: Sequence[str] | None = None,
                 ledger_table: str = "activedb_ingestion_ledger", query_id: str | None = None, method: str = "copy",
                 ledger_values: Mapping[str, Any] | None = None, ledger_count_column: str | None = None,
                 on_phase: Callable[[str, int], None] | None = None, on_conflict: str | None = None) -> None:
        if method not in _METHODS:
            raise SparkBridgeError(f"method must be one of {_METHODS}, got {method!r}")
        if on_conflict is not None and method != "executemany":
            raise SparkBridgeError("on_conflict= needs method='executemany' (COPY cannot upsert)")
        self._conninfo = psycopg_conninfo(dsn)
        self._table = table
        self._columns = None if columns is None else tuple(columns)
        self._ledger_table = ledger_table
        self._query_id = query_id
        self._method = method
        self._ledger_values = dict(ledger_values or {})
        self._ledger_count_column = ledger_count_column
        self._on_phase = on_phase
        self._on_conflict = on_conflict
        # self._mutex protects the connection and the counters (PlainWriteStatistics' fields).
        self._mutex = threading.Lock()
        self._connection: Any = None
        self._counters = {field.name: 0 for field in dataclasses.fields(PlainWriteStatistics)}

    # -- foreachBatch entry point -------------------------------------------------------

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        query_id = self._query_id or streaming_query_id(batch_df)
        if not query_id:
            raise SparkBridgeError("no query id: pass query_id= to PlainWriteSink, or use it from foreachBatch of a "
                                   "streaming query")
        started = time.perf_counter()
        table = batch_df.toArrow()
        elapsed = time.perf_counter() - started
        with self._mutex:
            self._counters["seconds_to_arrow"] += elapsed
        self.write_batch(table, batch_id, query_id)

    # -- the exactly-once write ---------------------------------------------------------

    def write_batch(self, table: Any, batch_id: int, query_id: str | None = None) -> bool:
        """Write a ``pyarrow.Table`` as batch ``batch_id``; ``False`` if already recorded."""
        query_id = query_id or self._query_id
        if not query_id:
            raise SparkBridgeError("write_batch needs a query_id (none was given to PlainWriteSink either)")
        if self._columns is not None:
            table = table.select(list(self._columns))
        with self._mutex:
            started = time.perf_counter()
            connection = self._connect()
            try:
                with connection.transaction(), connection.cursor() as cursor:
                    written = self._record_batch(cursor, query_id, batch_id, table.num_rows)
                    if written:
                        self._write_rows(cursor, table)
                        if self._on_phase is not None:
                            self._on_phase("written", batch_id)
            except BaseException:
                if self._connection.broken:       # discarded: the next batch connects again
                    self._connection.close()
                    self._connection = None
                raise
            finally:
                self._counters["seconds_in_database"] += time.perf_counter() - started
            if written:
                self._counters["batches_written"] += 1
                self._counters["rows_written"] += table.num_rows
            else:
                self._counters["batches_skipped"] += 1
        if self._on_phase is not None:
            self._on_phase("committed" if written else "skipped", batch_id)
        return written

    def statistics(self) -> PlainWriteStatistics:
        with self._mutex:
            return PlainWriteStatistics(**self._counters)

    def close(self) -> None:
        with self._mutex:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    # -- internals (caller holds self._mutex) ---------------------------------------------

    def _connect(self) -> Any:
        import psycopg

        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(self._conninfo, autocommit=True)
        return self._connection

    def _record_batch(self, cursor: Any, query_id: str, batch_id: int, row_count: int) -> bool:
        from psycopg import sql

        values: dict[str, Any] = {"query_id": query_id, "batch_id": batch_id, **self._ledger_values}
        if self._ledger_count_column:
            values[self._ledger_count_column] = row_count
        statement = sql.SQL("INSERT INTO {ledger} ({columns}) VALUES ({values}) "
                            "ON CONFLICT (query_id, batch_id) DO NOTHING RETURNING batch_id").format(
            ledger=_identifier(self._ledger_table), columns=sql.SQL(", ").join(map(sql.Identifier, values)),
            values=sql.SQL(", ").join(sql.Placeholder() for _ in values))
        cursor.execute(statement, list(values.values()))
        return cursor.fetchone() is not None

    def _write_rows(self, cursor: Any, table: Any) -> None:
        from psycopg import sql

        if table.num_rows == 0:
            return
        target = _identifier(self._table)
        column_list = sql.SQL(", ").join(map(sql.Identifier, table.schema.names))
        if self._method == "copy" and _csv_writable(table):
            import pyarrow.csv

            buffer = io.BytesIO()
            pyarrow.csv.write_csv(table, buffer, pyarrow.csv.WriteOptions(include_header=False))
            statement = sql.SQL("COPY {table} ({columns}) FROM STDIN (FORMAT csv)").format(table=target,
                                                                                        columns=column_list)
            with cursor.copy(statement) as copy:
                copy.write(buffer.getbuffer())
            return
        statement = sql.SQL("INSERT INTO {table} ({columns}) VALUES ({values}){upsert}").format(
            table=target, columns=column_list, values=sql.SQL(", ").join(sql.Placeholder() for _ in table.schema.names),
            upsert=sql.SQL("") if self._on_conflict is None else sql.SQL(" ON CONFLICT " + self._on_conflict))
        rows = list(zip(*(column.to_pylist() for column in table.columns)))
        cursor.executemany(statement, rows)


def _csv_writable(table: Any) -> bool:
    """Arrow's CSV writer handles flat columns only (no lists, structs, maps, binary)."""
    import pyarrow as pa

    return not any(pa.types.is_nested(field.type) or pa.types.is_binary(field.type)
                   or pa.types.is_large_binary(field.type) for field in table.schema)
