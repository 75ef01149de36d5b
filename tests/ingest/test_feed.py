"""The plain connector (``activedb.ingest.feed``): any iterable of row batches through the one batch protocol,
exactly once — feeding the same batches again applies nothing twice, also after a process was SIGKILLed
inside a batch's flush or between its commit and ``feed``'s return — with the same ledger rows, dead letters
and reasons as an uninterrupted run."""

from __future__ import annotations

import datetime as dt
import math
import re
import secrets
import threading

import pyarrow as pa
import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling
from activedb.clock import ManualClock
from activedb.errors import BadArgument, InvalidChoice
from activedb.ingest import (Batch, BatchHandler, Ingestion, LedgerId, Phase, RowBatches, RulesHandler, drive, feed,
                             batch_committed, ingestion_status, sources_of_run)
from activedb.ingest.errors import IngestError
from lockmgr.testing import wait_until
from tests.ingest.feed_driver import RUN, SOURCE, killed_and_fed_again, workload_batches
from tests._sessions import end_sessions
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_database, app_state, dead_letters, new_app_database

SEED, FILES = 5, 6


def letters(database) -> list[tuple]:
    """The dead letters, their reasons without the transaction ids they name (those differ between runs)."""
    return [(query, batch, re.sub(r" in T[0-9.]+", "", reason), raw)
            for query, batch, reason, raw in dead_letters(database)]


def ledger_rows(database) -> list[tuple]:
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT query_id, batch_id, events, dead_letters FROM activedb_ingestion_ledger ORDER BY 1, 2"))]


@pytest.fixture(scope="module")
def reference(make_database_url):
    """The workload fed once, uninterrupted: its state, ledger and dead letters."""
    database = new_app_database(make_database_url, "reference")
    try:
        outcomes = feed(database, workload_batches(SEED, FILES), source=SOURCE, run=RUN, mapping=app_counters.MAPPING)
        database.rules.wait_idle(60)
        assert all(outcome.committed for outcome in outcomes) and len(outcomes) == FILES
        yield app_state(database), ledger_rows(database), letters(database)
    finally:
        database.close()


def test_feeding_the_same_batches_again_applies_nothing_twice(make_database_url, reference):
    state, ledger, dead = reference
    database = new_app_database(make_database_url, "again")
    try:
        batches = workload_batches(SEED, FILES)
        first = feed(database, batches[:3], source=SOURCE, run=RUN, mapping=app_counters.MAPPING)
        again = feed(database, batches, source=SOURCE, run=RUN, mapping=app_counters.MAPPING,
                     handler=RulesHandler())
        database.rules.wait_idle(60)
        assert [outcome.committed for outcome in first] == [True] * 3
        assert [outcome.committed for outcome in again] == [False] * 3 + [True] * (FILES - 3)
        assert (app_state(database), ledger_rows(database), letters(database)) == (state, ledger, dead)
        [status] = ingestion_status(database, SOURCE)
        assert status.runs == (RUN,) and status.batches == FILES
        assert {row[0] for row in ledger} == {str(LedgerId(SOURCE, RUN))}
    finally:
        database.close()


def test_a_feed_takes_arrow_tables_and_numbered_batches_with_their_watermark(make_database_url):
    database = new_app_database(make_database_url, "arrow")
    try:
        rows = [{"type": "add", "key": "k", "ts": BASE_TIME + dt.timedelta(seconds=second), "amount": 1, "seq": second}
                for second in range(4)]
        watermark = BASE_TIME + dt.timedelta(seconds=2)
        [outcome] = feed(database, [Batch(7, pa.Table.from_pylist(rows), watermark)], source="arrow",
                         mapping=app_counters.MAPPING)
        assert (outcome.batch_id, outcome.query_id, outcome.events, outcome.dead_letters) == (7, "arrow", 2, 2)
        reasons = [reason for _, _, reason, _ in dead_letters(database)]
        assert all(reason.startswith("late: ts") for reason in reasons) and len(reasons) == 2
        assert app_state(database)["counters"][0][:3] == ("k", 2, 2)
    finally:
        database.close()


def test_the_status_of_a_source_counts_the_batches_of_every_run(database_url):
    """``QueryStatus.batches``: every batch the source committed — two runs (a Spark query restarted from a new
    checkpoint, a feed's ``run=``) number their batches from 0 each, and counting distinct batch numbers alone gave
    three where six had committed."""
    database = app_database(database_url)
    try:
        rows = [[{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": number}] for number in range(3)]
        for run in ("first", "second"):
            feed(database, rows, source="two-runs", run=run, mapping=app_counters.MAPPING)
        [status] = ingestion_status(database, "two-runs")
        assert (status.runs, status.ledger_rows, status.batches, status.events) == (("first", "second"), 6, 6, 6)
    finally:
        database.close()


def test_the_sources_of_a_run_are_all_found_among_its_partitions_and_runs_named_alike(database_url):
    """``sources_of_run`` (the Spark sink's check that a checkpoint is not resumed under another name) finds every
    source of the run: it took the first five ledger ids containing ``@RUN`` and kept those of the run, so a run
    written in ten partitions under one source hid the other source, and so did runs whose names begin with it."""
    database = app_database(database_url)
    try:
        ids = ([f"a@run-1#p{partition}" for partition in range(10)] + [f"b@run-1{suffix}" for suffix in range(10)]
               + ["z@run-1", "z@run-1#p0"])
        with database.engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO activedb_ingestion_ledger (query_id, batch_id, transaction_id) "
                                       "VALUES (:query_id, 0, 'T')"), [{"query_id": text} for text in ids])
        assert sources_of_run(database, "run-1") == {"a", "z"}
        assert sources_of_run(database, "run-12") == {"b"}
        assert sources_of_run(database, "run-") == set()
    finally:
        database.close()


def test_the_status_of_one_source_reads_its_rows_only_and_equals_its_part_of_every_sources_status(database_url):
    """``ingestion_status(db, name)`` read every ledger row of every source and kept ``name``'s in Python; now
    PostgreSQL gives it the rows of ``name`` and of its runs (``name@…``) only.  What it returns is unchanged: for
    each source — one with a run-less id, runs and partitions, an end-of-stream release, and look-alikes (a
    source ``parcels#p1x`` of its own, ``parcels@r1#p1x`` whose tail is no run, ``parcels@r1@r3`` of the source
    ``parcels@r1``, ``parcels_2`` beside ``parcelsx2``) — it equals that source's entry of every source's status."""
    database = app_database(database_url)
    parcels = [("parcels", 0), ("parcels", 1), ("parcels@r1#p0", 0), ("parcels@r1#p1", 0), ("parcels@r1#p0", 1),
               ("parcels@r2", 0), ("parcels@r2", -1)]
    alike = [("parcels#p1x", 0), ("parcels@r1#p1x", 0), ("parcels@r1@r3", 0), ("parcels_2@r1", 0),
             ("parcelsx2@r1", 0), ("parcelsx2@r1#p0", 0), ("xparcels@r1", 0), ("PARCELS@r1", 0)]
    read: list[int] = []

    def rows_read(connection, cursor, statement, parameters, context, executemany):
        if "FROM activedb_ingestion_ledger" in statement:
            read.append(cursor.rowcount)

    try:
        with database.engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO activedb_ingestion_ledger (query_id, batch_id, transaction_id, "
                                       "events, dead_letters, watermark, rule_firings) VALUES (:query_id, :batch, 'T', "
                                       ":events, 1, :watermark, CAST(:firings AS jsonb))"),
                               [{"query_id": query_id, "batch": batch, "events": number,
                                 "watermark": BASE_TIME + dt.timedelta(seconds=number),
                                 "firings": f'{{"rule_{number % 3}": {number}}}'}
                                for number, (query_id, batch) in enumerate(parcels + alike)])
        names = {"parcels", "parcels#p1x", "parcels@r1#p1x", "parcels@r1", "parcels_2", "parcelsx2", "xparcels",
                 "PARCELS"}
        every = {status.query_name: status for status in ingestion_status(database)
                 if "parcels" in status.query_name.lower()}    # (the module's other tests share the database)
        assert set(every) == names
        for name in every:
            assert ingestion_status(database, name) == [every[name]], name
        status = every["parcels"]
        assert (status.runs, status.ledger_rows, status.batches, status.partitions, status.last_batch_id,
                status.events) == (("r1", "r2"), 7, 5, 2, 1, sum(range(7)))
        sa.event.listen(database.engine, "after_cursor_execute", rows_read)
        try:
            assert ingestion_status(database, "parcels") == [status]
        finally:
            sa.event.remove(database.engine, "after_cursor_execute", rows_read)
        assert read == [len(parcels) + 2]    # (and parcels@r1@r3 and parcels@r1#p1x: texts alike, other sources)
    finally:
        with database.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM activedb_ingestion_ledger WHERE transaction_id = 'T' AND "
                                       "query_id ILIKE '%parcels%'"))
        database.close()


def test_a_process_killed_between_flush_and_return_leaves_nothing_twice(make_database_url, reference, tmp_path):
    """Run 1 is SIGKILLed inside batch 2's flush (everything written, not committed), run 2 after batch 4's
    commit (before ``feed`` returned), run 3 feeds the same batches to the end: the ledger skips what
    committed, and every table, ledger row and dead letter equals the uninterrupted run's."""
    state, ledger, dead = reference
    url = make_database_url("killed", migrations=(app_counters.MIGRATIONS,))
    app_database(url).close()
    killed_and_fed_again(url, tmp_path, "--seed", str(SEED), "--files", str(FILES))
    database = app_database(url)
    try:
        assert (app_state(database), ledger_rows(database), letters(database)) == (state, ledger, dead)
    finally:
        database.close()


def test_the_watermark_lag_is_measured_on_the_databases_clock(database_url):
    """``watermark_lag_seconds``: the database's time of day (``db.clock``, here a ``ManualClock``) minus the last
    batch's watermark — so a test stamping events in its own time sees the lag in that time."""
    clock = ManualClock(wall=BASE_TIME + dt.timedelta(seconds=10))
    database = activedb.connect(database_url, clock=clock)
    database.upgrade_app(app_counters.MIGRATIONS)
    app_counters.register(database)
    ingestion = Ingestion(database, app_counters.MAPPING, source="lag")
    try:
        rows = [{"type": "add", "key": "k", "ts": BASE_TIME + dt.timedelta(seconds=3), "amount": 1, "seq": 0}]
        drive(ingestion, RowBatches(LedgerId("lag"), [Batch(0, rows, BASE_TIME + dt.timedelta(seconds=2))]))
        assert ingestion.statistics().watermark_lag_seconds == 8.0
        clock.advance(5)
        assert ingestion.statistics().watermark_lag_seconds == 13.0
    finally:
        ingestion.close()
        database.close()


def test_on_phase_hears_phase_members_and_a_connectors_phase_is_parsed(database_url):
    """``on_phase`` is called with :class:`Phase` members — the core's (``flush``, ``committed``, ``skipped``) and a
    connector's given as a member or as its value's string; any other string is refused, naming the members."""
    database = app_database(database_url)
    heard: list[tuple[object, int]] = []
    ingestion = Ingestion(database, app_counters.MAPPING, source="phases",
                          on_phase=lambda phase, batch: heard.append((phase, batch)))
    try:
        rows = [{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 0}]
        ingestion.phase("fetched", 0)
        drive(ingestion, RowBatches(LedgerId("phases"), [Batch(0, rows)]))
        ingestion.phase(Phase.FETCHED, 0)
        drive(ingestion, RowBatches(LedgerId("phases"), [Batch(0, rows)]))
        assert heard == [(Phase.FETCHED, 0), (Phase.FLUSH, 0), (Phase.COMMITTED, 0), (Phase.FETCHED, 0),
                         (Phase.SKIPPED, 0)]
        assert all(type(phase) is Phase for phase, _ in heard), heard
        with pytest.raises(InvalidChoice, match=r"Ingestion\.phase\(phase=\.\.\.\).*fetched.*flush.*committed"):
            ingestion.phase("fetch", 1)
        assert len(heard) == 5
    finally:
        ingestion.close()
        database.close()


def test_a_batch_that_is_one_row_or_a_feed_without_a_mapping_is_refused_saying_what_to_give(database_url):
    """Two slips of a first ``feed``: one row where a batch of rows belongs (``feed(db, [row])``), and no ``mapping=``
    for the rules.  Each is an ``IngestError`` (an ``ActivedbError``) that says what to give, before anything is
    applied.  Before, the first was a ``KeyError: 0`` from the dead letters of the row's field names, each taken for
    a row; the second a ``ValueError``."""
    database = app_database(database_url)
    try:
        before = app_state(database)
        row = {"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 0}
        with pytest.raises(IngestError, match=r"batch 0 of one-row is one dict, not a batch of rows.*\[row\]"):
            feed(database, [row], source="one-row", mapping=app_counters.MAPPING)
        with pytest.raises(IngestError, match=r"has none: give it one \(feed\(db, batches, mapping=\.\.\.\)"):
            feed(database, [[row]], source="no-mapping")
        assert ingestion_status(database, "one-row") == [] and ingestion_status(database, "no-mapping") == []
        assert app_state(database) == before
    finally:
        database.close()


@pytest.mark.parametrize("watermark", [dt.datetime(2026, 1, 1), "2026-01-01T00:00:00Z", 1_700_000_000])
def test_a_watermark_that_is_no_aware_datetime_is_refused_saying_what_to_give(database_url, watermark):
    """``Ingestion.process(watermark=...)`` takes an aware datetime (UTC), as ``Batch`` does: a naive one, a string or
    a number is an ``IngestError`` before anything is applied — it was a ``TypeError`` from comparing it with the
    events' times (``can't compare offset-naive and offset-aware datetimes``)."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="naive")
    try:
        rows = [{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 0}]
        with pytest.raises(IngestError, match=r"watermark .*aware datetime"):
            ingestion.process(rows, 0, query_id="naive", watermark=watermark)
        assert ingestion_status(database, "naive") == []
    finally:
        ingestion.close()
        database.close()


class _Broken(BatchHandler):
    """A handler whose batches fail (a bug of its own)."""

    validates_rows = False

    def handle(self, tx, batch, ledger):
        raise RuntimeError(f"broken on batch {batch.batch_id}")


def test_last_failure_is_the_batch_that_raised_out_of_the_ingestion(database_url):
    """``Ingestion.last_failure()``: ``(batch id, the exception)`` of the last batch that raised — for any connector,
    not only Spark's sink (it stayed None for a feed, a capture consumer or an ``Ingestion`` used directly)."""
    database = app_database(database_url)
    ingestion = Ingestion(database, source="broken", handler=_Broken())
    try:
        assert ingestion.last_failure() is None
        with pytest.raises(RuntimeError, match="broken on batch 4") as raised:
            ingestion.process([{"any": 1}], 4, query_id="broken")
        assert ingestion.last_failure() == (4, raised.value)
        assert ingestion_status(database, "broken") == []
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("known_types, what", [("add", "'add'"), (5, "5")])
def test_known_types_that_are_no_collection_of_names_are_refused_saying_what_to_give(database_url, known_types, what):
    """``known_types`` is a collection of type names: the text ``'add'`` was taken as the types 'a' and 'd', so every
    row of type add became a dead letter ('unknown type'); a number failed with a TypeError."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=rf"known_types is {what}; give the event types as a list or a set"):
            Ingestion(database, app_counters.MAPPING, source="typed", known_types=known_types)
    finally:
        database.close()


@pytest.mark.parametrize("batch_attempts", ["3", 2.5, True, None, 0])
def test_batch_attempts_that_is_no_whole_number_from_1_is_refused_saying_what_to_give(database_url, batch_attempts):
    """``Ingestion(batch_attempts=…)`` is a whole number of at least 1: a text or None failed with a bare TypeError
    ('<' not supported), 2.5 was taken (three attempts) and True as one."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=rf"Ingestion\(batch_attempts={re.escape(repr(batch_attempts))}\) takes a "
                                              rf"whole number of at least 1"):
            Ingestion(database, app_counters.MAPPING, source="attempted", batch_attempts=batch_attempts)
    finally:
        database.close()


@pytest.mark.parametrize("lineage", ["no", 0, None], ids=["a-text", "a-number", "none"])
def test_lineage_that_is_no_bool_is_refused_saying_what_to_give(database_url, lineage):
    """``Ingestion(lineage=…)`` is a switch: ``"no"`` is true to Python, so every batch transaction recorded the
    source batch it consumed while its caller had asked for the opposite."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=rf"Ingestion\(lineage={re.escape(repr(lineage))}\) takes True or False"):
            Ingestion(database, app_counters.MAPPING, source="lineaged", lineage=lineage)
    finally:
        database.close()


@pytest.mark.parametrize("batch_id", [-1, -5, "3", None, True, 3.0, 2**63])
def test_a_batch_number_that_is_no_integer_from_0_is_refused_saying_what_to_give(database_url, batch_id):
    """``Ingestion.process`` takes a batch number as ``Batch`` does, an integer from 0 (one the ledger's bigint holds):
    -1 was applied as the run's end-of-stream release (which then found itself committed and released nothing), any
    negative number was applied, and a text, None or a boolean failed with a TypeError or the driver's error."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="numbered")
    try:
        with pytest.raises(IngestError, match=r"a batch number is an integer from 0.*nothing was applied"):
            ingestion.process([{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}], batch_id,
                              query_id=str(LedgerId("numbered", "run-1")))
        with pytest.raises(IngestError, match=r"a batch number is an integer from 0.*nothing was applied"):
            ingestion.reject([{"type": "add"}], batch_id, query_id=str(LedgerId("numbered", "run-1")), reason="no")
        assert ingestion_status(database, "numbered") == []
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("query_id", ["", None, 5])
def test_a_query_id_that_is_no_ledger_id_is_refused_and_the_status_still_reads(database_url, query_id):
    """``Ingestion.process``'s ``query_id`` is a ledger id's text (``str(LedgerId(source, run))``): an empty one was
    committed as a ledger row that made ``ingestion_status`` (``activedb status``) fail for every source with a
    ValueError from then on; None failed at the commit on the ledger's NOT NULL, a number with the driver's error."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="misnamed")
    try:
        with pytest.raises(IngestError, match=r"query_id .* is no ledger id.*LedgerId\(source, run\).*nothing was"):
            ingestion.process([{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}], 0,
                              query_id=query_id)
        with pytest.raises(IngestError, match=r"query_id .* is no ledger id"):
            ingestion.reject([{"type": "add"}], 0, query_id=query_id, reason="no")
        assert ingestion_status(database, "misnamed") == []
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("batch, what", [(None, "None"), (iter([]), "a list_iterator"), (5, "an int")])
def test_a_batch_that_is_no_sequence_of_rows_is_refused_saying_what_to_give(database_url, batch, what):
    """A batch that is None, an iterator or a number (its rows are read by position, counted and letters kept of
    them) is an ``IngestError`` naming what it is and what to give, before anything is applied — it was a
    ``TypeError`` (``object of type 'NoneType' has no len()``) from counting its rows."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=rf"batch 0 of no-rows is {what}, not a batch of rows.*sequence of rows"):
            feed(database, [batch], source="no-rows", mapping=app_counters.MAPPING)
        assert ingestion_status(database, "no-rows") == []
    finally:
        database.close()


def test_a_feed_source_that_reads_as_a_run_is_refused_saying_to_give_the_run_apart(database_url):
    """``feed(source="orders@eu")`` without ``run=``: its ledger id would read as run ``eu`` of ``orders``.  It was
    refused with LedgerId's advice, "pass LedgerId.parse('orders@eu')", which feed takes nowhere; now the refusal
    is feed's, an IngestError saying to give the run apart (``source='orders', run='eu'``) or a name without '@'."""
    database = app_database(database_url)
    try:
        row = {"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 0}
        with pytest.raises(IngestError, match=r"feed\(source='orders@eu'\) .* run 'eu' of the source 'orders'.*"
                                              r"feed\(db, batches, source='orders', run='eu'\).*nothing was applied"):
            feed(database, [[row]], source="orders@eu", mapping=app_counters.MAPPING)
        assert ingestion_status(database, "orders") == ingestion_status(database, "orders@eu") == []
    finally:
        database.close()


def test_a_batch_that_is_a_pandas_frame_is_refused_saying_how_to_give_its_rows(database_url):
    """A pandas DataFrame is no sequence of rows: the refusal told to ``list(...)`` it, which gives its column
    names — each then a dead letter ("row is 'type' (str), not a mapping").  It now names the frame and the two ways
    to give its rows (``pyarrow.Table.from_pandas(frame)``, ``frame.to_dict("records")``), the first of which
    applies them."""
    pandas = pytest.importorskip("pandas")
    database = app_database(database_url)
    try:
        frame = pandas.DataFrame([{"type": "add", "key": "frame", "ts": BASE_TIME, "amount": 1, "seq": 0}])
        with pytest.raises(IngestError, match=r"batch 0 of frames is a pandas DataFrame, not a batch of rows: .*"
                                              r"pyarrow\.Table\.from_pandas\(frame\).*frame\.to_dict\('records'\)"):
            feed(database, [frame], source="frames", mapping=app_counters.MAPPING)
        assert ingestion_status(database, "frames") == []
        [fed] = feed(database, [pa.Table.from_pandas(frame)], source="frames", mapping=app_counters.MAPPING)
        assert (fed.committed, fed.events, fed.dead_letters) == (True, 1, 0)
    finally:
        database.close()


@pytest.mark.parametrize("rows, what", [({"type": "add"}, "one dict"), (None, "None")])
def test_reject_of_rows_that_are_no_batch_is_refused_saying_what_to_give(database_url, rows, what):
    """``Ingestion.reject`` takes a batch as ``process`` does: one row (a mapping) or None where the rows belong is an
    ``IngestError`` saying what a batch is, before anything is written — it was a bare KeyError (the mapping read
    by position) or TypeError (``len(None)``)."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="rejecting")
    try:
        with pytest.raises(IngestError, match=rf"batch 0 of rejecting@r is {what}.*not a batch of rows"):
            ingestion.reject(rows, 0, query_id="rejecting@r", reason="given up")
        assert ingestion_status(database, "rejecting") == []
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("reason", [None, 5, b"given up"])
def test_reject_with_a_reason_that_is_no_text_is_refused_saying_what_to_give(database_url, reason):
    """``Ingestion.reject(reason=…)`` is the letters' reason, a text: anything else is an ``IngestError`` naming it,
    before anything is written — it was a bare TypeError from writing the letters."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="rejecting")
    try:
        with pytest.raises(IngestError, match=r"reason=.* takes a text"):
            ingestion.reject([{"type": "add"}], 0, query_id="rejecting@r", reason=reason)
        assert ingestion_status(database, "rejecting") == []
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("batches", [None, 5])
def test_feed_of_what_is_no_collection_of_batches_is_refused_saying_what_to_give(database_url, batches):
    """``feed(db, batches)`` of None or a number is an ``IngestError`` saying what to give — it was a bare TypeError
    (``'NoneType' object is not iterable``)."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=r"batches .* not a collection of batches.*feed\(db, \[\[row"):
            feed(database, batches, source="no-batches", mapping=app_counters.MAPPING)
        assert ingestion_status(database, "no-batches") == []
    finally:
        database.close()


@pytest.mark.parametrize("run", [None, "", 5, "a@b"])
def test_sources_of_a_run_that_is_no_run_id_is_refused_saying_what_to_give(database_url, run):
    """``sources_of_run(db, run)`` of what is no run (None, empty, a number, text with '@') is a ``BadArgument``
    saying what a run is — it answered an empty set (a run never seen), as if the check had passed."""
    database = app_database(database_url)
    try:
        with pytest.raises(BadArgument, match=r"sources_of_run\(run=.*\) takes a run"):
            sources_of_run(database, run)
    finally:
        database.close()


@pytest.mark.parametrize("query_id, batch_id", [(None, 0), ("", 0), (5, 0), ("q@r", None), ("q@r", "0"),
                                               ("q@r", 2**63)])
def test_batch_committed_of_what_is_no_ledger_id_or_batch_number_is_refused(database_url, query_id, batch_id):
    """``batch_committed(db, query_id, batch_id)`` of what is no ledger id or batch number is a ``BadArgument``
    saying what to give — None answered False (no batch), as if it had been asked, and a number beyond the ledger's
    bigint was PostgreSQL's refusal (a DatabaseError, 'bigint out of range')."""
    database = app_database(database_url)
    try:
        with pytest.raises(BadArgument, match=r"ledger id|batch_committed\(batch_id="):
            batch_committed(database, query_id, batch_id)
    finally:
        database.close()


@pytest.mark.parametrize("query_id", [None, "", 5])
def test_resume_of_what_is_no_ledger_id_is_refused_saying_what_to_give(database_url, query_id):
    """``Ingestion.resume(query_id)`` takes a ledger id's text, as ``process`` does: None answered no watermark and
    made the ingestion run as None (its statistics' query id), a number failed with PostgreSQL's 'operator does not
    exist'; now an IngestError says what a query id is."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="resumed")
    try:
        with pytest.raises(IngestError, match=r"query_id .* is no ledger id"):
            ingestion.resume(query_id)
        assert ingestion.statistics().query_id is None
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("query_name", [5, b"badges", ""])
def test_the_status_of_what_is_no_source_name_is_refused_saying_what_to_give(database_url, query_name):
    """``ingestion_status(db, query_name)`` of what is no source name (a number, bytes, empty text) is a
    ``BadArgument`` saying what to give — it answered ``[]``, as if the source had committed nothing."""
    database = app_database(database_url)
    try:
        with pytest.raises(BadArgument, match=r"ingestion_status\(query_name=.*\) takes a source's name"):
            ingestion_status(database, query_name)
    finally:
        database.close()


@pytest.mark.parametrize("query_id", [None, "", 5])
def test_forget_run_of_what_is_no_ledger_id_is_refused_and_deletes_nothing(database_url, query_id):
    """``forget_run(connection, query_id)`` of what is no ledger id is a ``BadArgument`` and deletes nothing: it
    ran the DELETE with whatever it was given (None matched no row by luck, a number failed in PostgreSQL)."""
    from activedb.ingest import forget_run

    database = app_database(database_url)
    try:
        feed(database, [[{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}]], source="kept",
             mapping=app_counters.MAPPING)
        with database.engine.begin() as connection:
            with pytest.raises(BadArgument, match=r"forget_run\(query_id=.*\) takes a ledger id"):
                forget_run(connection, query_id)
        [status] = ingestion_status(database, "kept")
        assert status.ledger_rows == 1
    finally:
        database.close()


def test_forgetting_a_source_without_a_run_leaves_a_source_named_like_its_partitions(database_url):
    """Only a run has partitions (``LedgerId``): ``orders#p1`` without a run is a source of its own name (a capture
    consumer ``orders#p1``, a feed's source).  ``forget_run('orders')`` — a capture consumer dropped — deleted that
    source's ledger rows too, and ``Ingestion.resume`` of ``orders`` punctuated that source's watermark.  Now they
    are another source's, left alone."""
    from activedb.ingest import forget_run

    database = app_database(database_url)
    try:
        for source, second in (("orders", 0), ("orders#p1", 60)):
            feed(database, [Batch(0, [{"type": "add", "key": source, "ts": BASE_TIME, "amount": 1, "seq": 1}],
                                  watermark=BASE_TIME + dt.timedelta(seconds=second))],
                 source=source, mapping=app_counters.MAPPING)
    finally:
        database.close()
    database = app_database(database_url)       # (a restarted process: no punctuation in memory)
    ingestion = Ingestion(database, app_counters.MAPPING, source="orders")
    try:
        ingestion.resume("orders")
        assert database.watermark("orders") == BASE_TIME
        with database.engine.begin() as connection:
            assert forget_run(connection, "orders") == 1
        assert ingestion_status(database, "orders") == []
        assert [status.ledger_rows for status in ingestion_status(database, "orders#p1")] == [1]
    finally:
        ingestion.close()
        database.close()


def test_a_feed_whose_batch_number_repeats_is_refused_naming_both_positions(database_url):
    """Numbers within a run are distinct (design note, ``Batch``): rows numbered by their position and a
    ``Batch`` with the same number in one ``feed`` made the second batch 'already committed' — skipped, its rows
    never applied and nothing said.  Now the repeat is an IngestError naming both positions."""
    database = app_database(database_url)
    try:
        rows = [[{"type": "add", "key": "dup", "ts": BASE_TIME, "amount": amount, "seq": amount}] for amount in (1, 2)]
        with pytest.raises(IngestError, match=r"batch number 0 .* positions 0 and 1"):
            feed(database, [rows[0], Batch(0, rows[1])], source="repeated", mapping=app_counters.MAPPING)
    finally:
        database.close()


def test_a_batch_filed_under_another_source_than_the_ingestion_s_is_refused(database_url):
    """``Ingestion(source=…)`` is the ledger ids' first part (its docstring): ``process`` with the query id of
    another source filed the batch under that source — its ledger rows, status and exactly-once check another
    source's.  Now an IngestError names both and nothing is applied."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="mine")
    try:
        with pytest.raises(IngestError, match=r"'other@run' is a run of source 'other', not of this ingestion's "
                                              r"source 'mine'"):
            ingestion.process([{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}], 0,
                              query_id="other@run")
        with pytest.raises(IngestError, match=r"'other@run' is a run of source 'other', not of this ingestion's "):
            ingestion.reject([{"type": "add"}], 0, query_id="other@run", reason="given up")
        assert ingestion_status(database, "other") == []
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("timeout", ["5", -1, float("nan"), True])
def test_wait_idle_with_a_timeout_that_is_no_number_of_seconds_is_refused(database_url, timeout):
    """``Ingestion.wait_idle(timeout)`` takes None or a number of seconds from 0: anything else was taken — idle, it
    answered True as if it had waited; with a batch running, '5' failed inside threading with a TypeError and -1 or
    NaN answered False at once, as if the time had passed."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="waited")
    try:
        with pytest.raises(IngestError, match=r"wait_idle\(timeout=.*\) takes None .* a number of seconds"):
            ingestion.wait_idle(timeout)
        assert ingestion.wait_idle(0) and ingestion.wait_idle(None)
    finally:
        ingestion.close()
        database.close()


def test_an_on_phase_that_is_no_function_is_refused_where_the_ingestion_is_made(database_url):
    """``Ingestion(on_phase=…)`` (and ``feed``'s) is called with every phase of every batch: what is no function was
    taken, and the first batch failed in its first phase with a bare TypeError ('int' object is not callable)."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=r"on_phase=5\) takes a function of \(phase, batch_id\)"):
            Ingestion(database, app_counters.MAPPING, source="phased", on_phase=5)
        with pytest.raises(IngestError, match=r"on_phase=5\) takes a function of \(phase, batch_id\)"):
            feed(database, [[{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}]], source="phased",
                 mapping=app_counters.MAPPING, on_phase=5)
        assert ingestion_status(database, "phased") == []
    finally:
        database.close()


@pytest.mark.parametrize("participants", [5, ["a participant"]])
def test_feed_participants_that_are_no_function_are_refused_saying_what_to_give(database_url, participants):
    """``feed(participants=…)`` is a function of the batch giving its commit participants: a list of them (or
    anything else) failed at the first batch with a bare TypeError ('list' object is not callable)."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=r"feed\(participants=.*\) takes a function of the batch"):
            feed(database, [[{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}]], source="joined",
                 mapping=app_counters.MAPPING, participants=participants)
        assert ingestion_status(database, "joined") == []
    finally:
        database.close()


@pytest.mark.parametrize("end_of_stream", ["false", 0, None])
def test_feed_end_of_stream_that_is_no_switch_is_refused_before_anything_is_applied(database_url, end_of_stream):
    """``feed(end_of_stream=…)`` takes True or False: 'false' (true to Python) was taken as True — the handler
    released what its engine held back as if the source had ended — and 0 or None as False."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=r"feed\(end_of_stream=.*\) takes True or False"):
            feed(database, [[{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}]], source="ended",
                 mapping=app_counters.MAPPING, end_of_stream=end_of_stream)
        assert ingestion_status(database, "ended") == []
    finally:
        database.close()


@pytest.mark.parametrize("event_ids_under", [5, b"badges"])
def test_event_ids_under_that_is_no_source_name_is_refused_where_the_ingestion_is_made(database_url, event_ids_under):
    """``Ingestion(event_ids_under=…)`` names the source whose ingested event ids count for duplicates: a number or
    bytes was taken as that name, and recorded ids under it."""
    database = app_database(database_url)
    try:
        with pytest.raises(IngestError, match=r"Ingestion\(event_ids_under=.*\) takes a source's name"):
            Ingestion(database, app_counters.MAPPING, source="ids", event_ids_under=event_ids_under)
    finally:
        database.close()


def test_resuming_a_run_of_another_source_than_the_ingestion_s_is_refused(database_url):
    """``resume(query_id)`` of another source's run punctuated that run's last watermark under this ingestion's
    source (and took the run for its own), as ``process`` filed such a batch under the other source before
    a6c6f55.  Now an IngestError names both sources and nothing is punctuated."""
    database = app_database(database_url)
    other = Ingestion(database, app_counters.MAPPING, source="other")
    ingestion = Ingestion(database, app_counters.MAPPING, source="mine")
    try:
        other.process([{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}], 0,
                      query_id="other@run", watermark=BASE_TIME)
        with pytest.raises(IngestError, match=r"'other@run' is a run of source 'other', not of this ingestion's "
                                              r"source 'mine'"):
            ingestion.resume("other@run")
        assert database.watermark("mine") is None
        assert ingestion.statistics().query_id is None
    finally:
        other.close()
        ingestion.close()
        database.close()


class _Held(BatchHandler):
    """A batch that runs until the test lets it end (``release``); ``entered`` once it runs."""

    name = "held"
    validates_rows = False

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def handle(self, tx, batch, ledger) -> None:
        self.entered.set()
        assert self.release.wait(60), "the test never let the batch end"


@pytest.mark.parametrize("timeout", [math.inf, 1e300])
def test_wait_idle_without_a_limit_given_as_infinity_waits_for_the_batch_in_progress(database_url, timeout):
    """``Ingestion.wait_idle(math.inf)`` is accepted (infinity is a number of seconds: no limit, as None) but, with a
    batch running, failed at once with OverflowError from ``threading.Condition.wait`` instead of waiting for the
    batch to end (so did any timeout beyond ``threading.TIMEOUT_MAX``).  Now it waits, and answers True when the
    batch has ended."""
    database = app_database(database_url)
    handler = _Held()
    source = f"held-{timeout:g}"          # (one database for the module: a run of its own each)
    ingestion = Ingestion(database, None, source=source, handler=handler)
    outcomes: dict[str, object] = {}

    def run(name, call):
        try:
            outcomes[name] = call()
        except BaseException as error:      # (reported by the test, on its own thread)
            outcomes[name] = error

    batch = threading.Thread(target=run, args=("batch", lambda: ingestion.process([{"x": 1}], 0, query_id=source)))
    waiter = threading.Thread(target=run, args=("wait", lambda: ingestion.wait_idle(timeout)))
    try:
        batch.start()
        assert handler.entered.wait(60)
        waiter.start()
        # The waiter waits on the book's condition (or has already failed).
        wait_until(lambda: "wait" in outcomes or ingestion._book._idle._waiters, 60, "wait_idle to wait",
                   lambda: outcomes)
        handler.release.set()
        batch.join(60)
        waiter.join(60)
        assert not batch.is_alive() and not waiter.is_alive()
        assert outcomes["wait"] is True, outcomes
        assert outcomes["batch"].committed, outcomes
    finally:
        handler.release.set()
        ingestion.close()
        database.close()


class _Counts(BatchHandler):
    """Applies nothing: a batch's events counted in its ledger row."""

    def handle(self, tx, batch, ledger):
        ledger.events = len(batch.events)


@pytest.mark.parametrize("read_first", ["ledger", "event_ids"])
def test_a_connection_lost_before_a_batch_began_is_unavailable_and_the_batch_applies_once_later(database_url,
                                                                                                 read_first):
    """What a batch reads before its transaction — whether the ledger has it (a batch that does not follow the one
    committed last), the event ids ingested already — meets a lost connection as any read does: a
    ``DatabaseUnavailable`` saying so (not the driver's exception), nothing applied, and the batch applies once when
    it comes again."""
    database = activedb.connect(database_url, outbox_options={"recovery_interval": None})
    source = f"lost_{read_first}"
    ingestion = Ingestion(database, activedb.ingest.EventMapping("type", "key", "ts", id_column="id"), source=source,
                          handler=_Counts())
    run = str(LedgerId(source, "r1"))

    def rows(batch):
        return [{"type": "add", "key": "k", "ts": BASE_TIME, "id": f"{read_first}-{batch}"}]

    try:
        assert ingestion.process(rows(0), 0, query_id=run).committed
        batch = 1 if read_first == "event_ids" else 7       # (1 follows batch 0: the ledger is not read first)
        end_sessions(database)
        with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL"):
            ingestion.process(rows(batch), batch, query_id=run)
        assert not batch_committed(database, run, batch)
        outcome = ingestion.process(rows(batch), batch, query_id=run)
        assert (outcome.committed, outcome.events) == (True, 1)
        assert [(status.batches, status.events) for status in ingestion_status(database, source)] == [(2, 2)]
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("read", ["ingestion_status", "sources_of_run", "resume"])
def test_reading_the_ledger_over_a_lost_connection_is_unavailable_and_the_next_read_works(database_url, read):
    """What ingestion has committed, read back — ``ingestion_status`` (``activedb status``), ``sources_of_run``,
    ``Ingestion.resume`` (the run's last watermark) — meets a connection PostgreSQL ended as every read does: a
    ``DatabaseUnavailable`` saying so, not the driver's exception with the statement; the next read works."""
    database = activedb.connect(database_url, outbox_options={"recovery_interval": None})
    source = f"read_{read}"
    ingestion = Ingestion(database, activedb.ingest.EventMapping("type", "key", "ts"), source=source,
                          handler=_Counts())
    run = str(LedgerId(source, "r1"))
    reads = {"ingestion_status": lambda: ingestion_status(database, source),
             "sources_of_run": lambda: sources_of_run(database, "r1"),
             "resume": lambda: ingestion.resume(run)}
    try:
        ingestion.process([{"type": "add", "key": "k", "ts": BASE_TIME}], 0, query_id=run, watermark=BASE_TIME)
        reads[read]()                   # (a connection kept)
        end_sessions(database)
        with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL"):
            reads[read]()
        reads[read]()
        assert ingestion_status(database, source)[0].batches == 1 and source in sources_of_run(database, "r1")
    finally:
        ingestion.close()
        database.close()


def test_a_batch_of_more_event_ids_than_a_statement_takes_parameters_finds_its_duplicates(database_url):
    """With an event-id column, a batch asks which of its ids were ingested already.  The question named every id as
    a parameter of its own, and PostgreSQL takes at most 65,535 per statement: a batch of 70,000 events failed before
    its transaction began — as 'lost the connection to PostgreSQL' — and so did every re-delivery of it, the stream
    stuck.  Now the ids are one parameter: the batch applies, and its re-sent ids are duplicates."""
    database = activedb.connect(database_url, outbox_options={"recovery_interval": None})
    ingestion = Ingestion(database, activedb.ingest.EventMapping("type", "key", "ts", id_column="id"), source="many_ids",
                          handler=_Counts())
    run = str(LedgerId("many_ids", "r1"))
    rows = [{"type": "add", "key": "k", "ts": BASE_TIME, "id": f"e{number}"} for number in range(70_000)]
    try:
        first = ingestion.process(rows, 0, query_id=run)
        assert (first.committed, first.events, first.dead_letters) == (True, 70_000, 0)
        again = ingestion.process(rows[:3] + [{"type": "add", "key": "k", "ts": BASE_TIME, "id": "new"}], 1,
                                  query_id=run)
        assert (again.committed, again.events) == (True, 1)      # (three ids ingested already: duplicates)
    finally:
        ingestion.close()
        database.close()


class _ReadsThenWrites(BatchHandler):
    """Reads counter ``two_feeders``, then (if ``hold``) waits until told, then adds its batch's events to it."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.reading = threading.Event()
        self.go = threading.Event()

    def handle(self, tx, batch, ledger):
        row = tx.read("counters", "two_feeders") or {"total": 0, "events": 0}
        if self.hold:
            self.reading.set()
            assert self.go.wait(60), "the test never let the held batch go on"
        tx.write("counters", "two_feeders", total=row["total"] + len(batch.events),
                 events=row["events"] + len(batch.events),
                 trail="", last_ts=BASE_TIME)
        ledger.events = len(batch.events)


def test_a_batch_another_process_committed_during_its_attempt_is_skipped_not_a_conflict(database_url):
    """Two processes feed the same source at once: the one behind reads state the other's batches then change, so its
    attempt of a batch conflicts — with the other's commit of that very batch.  It re-ran the batch without asking the
    ledger again, and past its attempts raised the conflict out of ``feed`` ('re-run the transaction'), although
    the batch was applied, once; a process running behind another met it at almost every batch.  Now a conflicted
    attempt asks the ledger first: the batch another process committed is skipped."""
    behind, ahead = app_database(database_url), app_database(database_url)
    held = _ReadsThenWrites(hold=True)
    ingestion = Ingestion(behind, app_counters.MAPPING, source="two_feeders", handler=held, batch_attempts=1)
    rows = [{"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": seq} for seq in range(3)]
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(_outcome_or_error(
        lambda: ingestion.process(rows, 0, query_id="two_feeders"))))
    try:
        thread.start()
        assert held.reading.wait(60), "the held batch never read its counter"
        [first] = feed(ahead, [rows], source="two_feeders", mapping=app_counters.MAPPING, handler=_ReadsThenWrites())
        assert first.committed
        held.go.set()
        thread.join(60)
        assert not thread.is_alive(), "the held batch did not end"
        [result] = outcome
        assert not isinstance(result, Exception), result
        assert result.committed is False            # skipped: the ledger has it
        assert [row[:3] for row in app_state(ahead)["counters"] if row[0] == "two_feeders"] == [("two_feeders", 3, 3)]
        assert [(status.batches, status.events) for status in ingestion_status(ahead, "two_feeders")] == [(1, 3)]
    finally:
        held.go.set()
        thread.join(60)
        ingestion.close()
        behind.close()
        ahead.close()


def _outcome_or_error(call):
    try:
        return call()
    except Exception as error:      # (what the thread raised, for the test to show)
        return error


@pytest.mark.parametrize("arrow", [False, True], ids=["mappings", "arrow"])
def test_a_timestamp_whose_utc_time_is_out_of_range_is_a_dead_letter(database_url, arrow):
    """Out-of-range timestamps are rejected (design note, "Validation"): a timestamp within datetime's range whose
    time in UTC is not — 9999-12-31T23:59:59-01:00, 0001-01-01T00:30+01:00, as text or an aware datetime — raised
    datetime's OverflowError out of ``feed``, and every delivery of the batch failed alike.  Now each is a dead letter
    saying so, and the rest of the batch applies."""
    database = app_database(database_url)
    late = "9999-12-31T23:59:59-01:00"
    early = dt.datetime(1, 1, 1, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    timestamps = [late, early.isoformat(), BASE_TIME.isoformat()] if arrow else [late, early, BASE_TIME]
    rows = [{"type": "add", "key": f"range-{arrow}", "ts": ts, "amount": 1, "seq": seq}
            for seq, ts in enumerate(timestamps)]
    source = f"ts_range_{arrow}"
    try:
        [outcome] = feed(database, [pa.Table.from_pylist(rows) if arrow else rows], source=source,
                         mapping=app_counters.MAPPING)
        assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 1, 2)
        reasons = [letter.reason for letter in activedb.deadletters.select(
            database, activedb.deadletters.LetterFilter(query=source))]
        assert len(reasons) == 2 and all("out of the representable range" in reason for reason in reasons), reasons
    finally:
        database.close()


def test_feeding_committed_batches_again_runs_none_of_their_rules(database_url):
    """A batch that follows the one the ingestion committed last is not looked up in the ledger (design note, step
    1).  A batch the ledger *skipped* counted as committed too, so after re-delivered batch 0 was skipped, batch 1 —
    re-delivered as well — ran all its rules again, and every later one, each refused only at its commit: feeding a
    source again after a crash redid the work of every batch it had committed.  Now a skipped batch leaves the next
    one to be looked up: none of their rules runs."""
    database = app_database(database_url)
    try:
        batches = [[{"type": "add", "key": "again", "ts": BASE_TIME, "amount": 1, "seq": 3 * number + seq}
                    for seq in range(3)] for number in range(4)]
        assert [outcome.committed for outcome in feed(database, batches, source="again_rules",
                                                      mapping=app_counters.MAPPING)] == [True] * 4
        fired: list[int] = []
        database.rule(on=database.stream("add"), name="heard_again")(
            lambda tx, event: fired.append(event.payload["seq"]))
        again = feed(database, batches + [[{"type": "add", "key": "again", "ts": BASE_TIME, "amount": 1, "seq": 12}]],
                     source="again_rules", mapping=app_counters.MAPPING, handler=RulesHandler(lower_declared=False))
        assert [outcome.committed for outcome in again] == [False] * 4 + [True]
        assert fired == [12]
    finally:
        database.close()


def test_a_timestamp_that_is_not_a_time_is_a_dead_letter_and_nothing_unreadable_is_stored(database_url):
    """pandas' missing timestamp, ``NaT`` (what ``DataFrame.to_dict('records')`` gives for an empty cell), is a
    ``datetime`` that is no time: it passed validation as a naive datetime read as UTC, became an event's time, and
    the rule wrote it as a row's time — a timestamp PostgreSQL stored past the year 10000, so that every later read of
    the table failed in the driver ('timestamp too large').  Now it is a dead letter saying what it is, as NaN is."""
    pandas = pytest.importorskip("pandas")
    database = app_database(database_url)
    rows = [{"type": "add", "key": "not_a_time", "ts": ts, "amount": 1, "seq": seq}
            for seq, ts in enumerate([pandas.Timestamp(BASE_TIME), pandas.NaT])]
    try:
        [outcome] = feed(database, [rows], source="not_a_time", mapping=app_counters.MAPPING)
        assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 1, 1)
        [letter] = activedb.deadletters.select(database, activedb.deadletters.LetterFilter(query="not_a_time"))
        assert "NaT" in letter.reason and "not a time" in letter.reason, letter.reason
        assert [row[:3] for row in app_state(database)["counters"] if row[0] == "not_a_time"] == [("not_a_time", 1, 1)]
    finally:
        database.close()


@pytest.mark.parametrize("unit, beyond", [("s", 2**60), ("ms", -2**62)])
def test_an_arrow_timestamp_in_seconds_beyond_datetimes_range_is_a_dead_letter_not_1970(database_url, unit, beyond):
    """An Arrow timestamp column in seconds or milliseconds (Parquet, Flight; Spark's are microseconds) was made
    microseconds by an unchecked cast, whose overflow wrapped around: a value beyond ``datetime``'s range became
    another time — 1970-01-01, silently — and its event was applied at that time.  Now it is a dead letter, 'out of the
    representable range', as a microsecond value beyond the range is."""
    database = app_database(database_url)
    per_unit = 1 if unit == "s" else 1000
    source = f"arrow_ts_{unit}"
    table = pa.table({"type": ["add", "add"], "key": [source, source],
                      "ts": pa.array([beyond, int(BASE_TIME.timestamp()) * per_unit], pa.timestamp(unit, tz="UTC")),
                      "amount": [1, 2], "seq": [1, 2]})
    try:
        [outcome] = feed(database, [table], source=source, mapping=app_counters.MAPPING)
        assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 1, 1)
        [letter] = activedb.deadletters.select(database, activedb.deadletters.LetterFilter(query=source))
        assert f"{beyond * 1_000_000 // per_unit} microseconds" in letter.reason, letter.reason
        assert "out of the representable range" in letter.reason, letter.reason
    finally:
        database.close()


def test_a_source_name_too_long_for_the_ledger_is_refused_naming_the_limit_before_anything_is_applied(database_url):
    """The ledger keys batches by the source's name (with its run) in a PostgreSQL btree index, whose rows hold at
    most 2704 bytes: a longer name failed every batch at its commit, with SQLSTATE 54000 ("index row size … exceeds
    btree version 4 maximum 2704"), after a search for the event to blame.  The source name (and
    ``event_ids_under``) is refused where the ingestion is made, naming the limit; one at the limit, with a Spark
    query's run and lineage, commits."""
    import secrets
    import uuid

    database = app_database(database_url)
    try:
        row = {"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 0}
        long = secrets.token_hex(1500)         # 3000 bytes, incompressible
        with pytest.raises(IngestError, match=r"source name of 3000 bytes .*at most 2048 bytes.*2704"):
            feed(database, [[row]], source=long, mapping=app_counters.MAPPING)
        assert ingestion_status(database, long) == []
        wide = "é" * 1025                      # 1025 characters, 2050 bytes
        with pytest.raises(IngestError, match=r"event_ids_under=.* of 2050 bytes .*at most 2048 bytes"):
            Ingestion(database, app_counters.MAPPING, source="ids", event_ids_under=wide)
        longest = secrets.token_hex(1024)      # 2048 bytes, incompressible
        outcomes = feed(database, [[row]], source=longest, run=str(uuid.uuid4()), mapping=app_counters.MAPPING,
                        lineage=True)
        assert [outcome.committed for outcome in outcomes] == [True]
    finally:
        database.close()


def test_a_batch_run_again_in_another_layout_is_refused_in_the_core_s_words(database_url):
    """``activedb.atomic.check_layout`` is any splitting connector's (Spark's scale-out path words it its own way:
    ``tests/spark_bridge/test_split_batches.py``): a batch the ledger holds whole, run again split, or held in 2
    partitions and run again whole or in 3, is refused saying how it was ingested and how to resume it; the same
    layout, or a batch not in the ledger, passes."""
    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="split")
    row = {"type": "add", "key": "k", "ts": BASE_TIME, "amount": 1, "seq": 1}
    try:
        assert ingestion.process([row], 3, query_id="split@whole").committed
        assert ingestion.process([row], 3, query_id="split@parts#p1").committed
        activedb.atomic.declare_policy(database, "split@parts", "split", 2, activedb.atomic.SplitFailure.FORWARD,
                                       ("key", "text"))
        activedb.atomic.check_layout(database, "split@whole", 3, None)
        activedb.atomic.check_layout(database, "split@parts", 3, 2, ("key", "text"))
        activedb.atomic.check_layout(database, "split@parts", 4, None)      # (not in the ledger)
        with pytest.raises(IngestError, match=r"batch 3 .* was ingested whole, and the source runs it again now in 2 "
                                              r"partitions.* Resume it whole;"):
            activedb.atomic.check_layout(database, "split@whole", 3, 2)
        with pytest.raises(IngestError, match=r"was ingested in 2 partitions, and the source runs it again now in 3 "
                                              r"partitions.* Resume it in 2 partitions;"):
            activedb.atomic.check_layout(database, "split@parts", 3, 3)
        with pytest.raises(IngestError, match=r"partitioned by key 'key' \(text\), and the source runs it again now "
                                              r"partitioned by 'shard' \(text\)"):
            activedb.atomic.check_layout(database, "split@parts", 3, 2, ("shard", "text"))
    finally:
        ingestion.close()
        database.close()


def test_an_arrow_batch_without_a_mapped_column_is_refused_before_anything_is_applied(database_url):
    """An Arrow table is a batch with columns of its own: one the mapping names missing made every row of the batch
    a dead letter ('missing field …: the batch has no such column'), committed with its ledger row — the whole
    source dead-lettered, batch after batch, for a mapping that does not fit (``spark_bridge`` refused such a stream
    at ``ingest()``; ``feed`` took it).  Now ``Ingestion.process`` refuses it with ``check_columns``' IngestError
    naming the column, and so a repeated column, before anything is applied; a list of rows keeps its per-row
    reasons (each row has its own fields)."""
    database = app_database(database_url)
    try:
        rows = [{"type": "add", "key": "k", "amount": 1, "seq": 1}]
        with pytest.raises(IngestError, match=r"the stream has no column 'ts' named by the mapping \(its columns: "
                                              r"\['type', 'key', 'amount', 'seq'\]\); fix the EventMapping"):
            feed(database, [pa.Table.from_pylist(rows)], source="unmapped", mapping=app_counters.MAPPING)
        twice = pa.Table.from_arrays([pa.array(["add"]), pa.array(["k"]), pa.array(["k"])],
                                     names=["type", "key", "key"])
        with pytest.raises(IngestError, match=r"the stream has 2 columns named 'key'"):
            feed(database, [twice], source="unmapped", mapping=app_counters.MAPPING)
        assert ingestion_status(database, "unmapped") == []
        assert [letter for letter in letters(database) if letter[0].startswith("unmapped")] == []
        [outcome] = feed(database, [rows], source="unmapped", mapping=app_counters.MAPPING)
        assert outcome.committed and outcome.dead_letters == 1
    finally:
        database.close()


def test_a_partition_that_failed_for_good_is_reported_and_combined_for_any_splitting_connector(database_url):
    """``activedb.atomic.failed_partition``, ``unsettled_batches`` and ``combined_outcome`` are any splitting
    connector's (Spark's scale-out tasks and driver use them): under ``compensate`` a failed partition's rows become
    dead letters with its ledger row and its batch is unsettled until the driver compensates it, a transient failure (a conflict that used up the attempts) is reported and left for the replay, and the
    batch's outcome sums its partitions'."""
    from activedb.errors import SerializationConflict

    database = app_database(database_url)
    ingestion = Ingestion(database, app_counters.MAPPING, source="parts")
    rows = [{"type": "add", "key": "p", "ts": BASE_TIME, "amount": 1, "seq": seq} for seq in (1, 2)]
    compensate = activedb.atomic.SplitFailure.COMPENSATE
    try:
        applied = {"partition": 0, "outcome": ingestion.process(rows[:1], 5, query_id="parts@r#p0")}
        failed = activedb.atomic.failed_partition(ingestion, rows, "parts@r#p1", 5, 1, 3, compensate,
                                                  RuntimeError("refused"), attempts=3)
        assert failed["failed"] and not failed["infrastructure"] and failed["error"] == "RuntimeError: refused"
        assert (failed["outcome"].committed, failed["outcome"].rows, failed["outcome"].dead_letters) == (True, 2, 2)
        assert batch_committed(database, "parts@r#p1", 5)
        assert activedb.atomic.unsettled_batches(database, "parts@r") == {5}       # (compensating, not compensated)
        conflict = activedb.atomic.failed_partition(ingestion, rows, "parts@r#p2", 5, 2, 3, compensate,
                                                    SerializationConflict("40001"), attempts=3)
        assert conflict["infrastructure"] and conflict["attempts"] == 3 and not conflict["outcome"].committed
        assert not batch_committed(database, "parts@r#p2", 5)
        combined = activedb.atomic.combined_outcome("parts@r", 5, None, [applied, failed, conflict])
        assert (combined.committed, combined.rows, combined.events, combined.dead_letters) == (True, 5, 1, 2)
    finally:
        ingestion.close()


def test_an_event_deadlocked_by_another_batch_of_the_process_reruns_its_batch_not_a_dead_letter(database_url):
    """Two feeds in one process (two threads feeding the same source, or two sources writing the same rows) meet in
    the lock manager, not in PostgreSQL: an event whose rule waited for a row the other batch had written, while the
    other waited for a row this batch had written, was the deadlock's victim at every attempt — a batch keeps the
    locks of its committed events — and became a dead letter ("rejected by rule 'apply_add': … DeadlockDetected"),
    although nothing was wrong with it (in two processes the same meeting is a serialization conflict, and the
    batch is re-run).  Now a deadlock with another transaction's tree re-runs the batch, as a conflict does: its tree
    aborts, the other batch goes on, and the event is applied."""
    database = app_database(database_url)
    other_wrote, this_wrote = threading.Event(), threading.Event()
    first = {"grab": True, "hold": True}

    def waiting_for(key):
        return any(resource == ("row", "counters", (key,))
                   for waits in database.transactions.lock_snapshot().waits.values() for _, resource in waits.values())

    def grab(tx, event):            # the other batch's first event: its row, then this batch's row is wanted
        tx.write("counters", event.key, total=0, events=0, trail="", last_ts=event.ts)
        if first["grab"]:
            first["grab"] = False
            other_wrote.set()
            assert this_wrote.wait(60), "this batch never wrote its row"

    def hold(tx, event):            # this batch's first event: its row, then the other batch's row is wanted
        tx.write("counters", event.key, total=0, events=0, trail="", last_ts=event.ts)
        if first["hold"]:           # (the batch's first attempt)
            first["hold"] = False
            this_wrote.set()
            wait_until(lambda: waiting_for(event.key), 60, "the other batch waiting for this batch's row",
                       describe=database.transactions.lock_snapshot)

    database.rule(on=database.stream("grab"), name="grab")(grab)
    database.rule(on=database.stream("hold"), name="hold")(hold)

    def rows(first_type, first_key, then_key):
        return [{"type": first_type, "key": first_key, "ts": BASE_TIME, "amount": 0, "seq": 0},
                {"type": "add", "key": then_key, "ts": BASE_TIME + dt.timedelta(seconds=1), "amount": 1, "seq": 1}]

    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(_outcome_or_error(lambda: feed(
        database, [rows("grab", "deadlock-other", "deadlock-this")], source="deadlocked-other",
        mapping=app_counters.MAPPING, handler=RulesHandler(lower_declared=False)))))
    try:
        thread.start()
        assert other_wrote.wait(60), "the other batch never wrote its row"
        [fed] = feed(database, [rows("hold", "deadlock-this", "deadlock-other")], source="deadlocked",
                     mapping=app_counters.MAPPING, handler=RulesHandler(lower_declared=False))
        thread.join(60)
        assert not thread.is_alive(), "the other batch did not end"
        reasons = [reason for query, _, reason, _ in dead_letters(database) if query.startswith("deadlocked")]
        assert (fed.committed, fed.events, fed.dead_letters, reasons) == (True, 2, 0, [])
        [[other_fed]] = other
        assert (other_fed.committed, other_fed.events, other_fed.dead_letters) == (True, 2, 0)
        # (The other batch committed first: this one's re-run added to its row, and wrote its own row over.)
        assert [row[:3] for row in app_state(database)["counters"] if row[0].startswith("deadlock-")] == [
            ("deadlock-other", 1, 1), ("deadlock-this", 0, 0)]
    finally:
        this_wrote.set()
        thread.join(60)
        database.close()


def test_batches_fed_again_with_other_boundaries_are_refused_and_nothing_of_them_is_applied(database_url):
    """The same number always carries the same rows (design note, ``Batch``).  Ten rows fed as 5 + 5 and then
    again as 3 + 4 + 3 skipped batches 0 and 1 (the ledger has them) and applied batch 2: rows 7 to 9 went in a
    second time, and nothing said so.  Now the ledger row of a batch records how many rows it had, and a batch that
    comes again with another count is refused, saying so, before anything of it is applied."""
    database = app_database(database_url)
    rows = [{"type": "add", "key": "bounds", "ts": BASE_TIME, "amount": 1, "seq": seq} for seq in range(10)]
    try:
        first = feed(database, [rows[:5], rows[5:]], source="boundaries", mapping=app_counters.MAPPING)
        assert [outcome.committed for outcome in first] == [True, True]
        with pytest.raises(IngestError, match=r"batch 0 of boundaries was committed with 5 rows and came again with 3"
                                              r".*nothing of it was applied"):
            feed(database, [rows[:3], rows[3:7], rows[7:]], source="boundaries", mapping=app_counters.MAPPING)
        database.rules.wait_idle(60)
        assert [row[:3] for row in app_state(database)["counters"] if row[0] == "bounds"] == [("bounds", 10, 10)]
        assert [(status.batches, status.events) for status in ingestion_status(database, "boundaries")] == [(2, 10)]
        again = feed(database, [rows[:5], rows[5:]], source="boundaries", mapping=app_counters.MAPPING)
        assert [outcome.committed for outcome in again] == [False, False]     # the same batches: skipped
    finally:
        database.close()


def test_a_batch_another_run_committed_with_other_rows_is_refused_at_its_commit(database_url):
    """The batch after the one an ingestion committed last is not looked up (design note, step 1): another run of
    the source that committed it first — fed with other boundaries — made it a duplicate refused at the flush and
    skipped, and the next one applied rows a second time.  Now the refused batch is compared with the rows that
    run recorded, and refused as a re-delivery with other rows is."""
    database = app_database(database_url)
    rows = [{"type": "add", "key": "racing", "ts": BASE_TIME, "amount": 1, "seq": seq} for seq in range(10)]
    ingestion = Ingestion(database, app_counters.MAPPING, source="racing")
    try:
        assert ingestion.process(rows[:3], 0, query_id="racing").committed
        other = activedb.ingest.IngestionLedger(database, "racing", 1)
        other.row_count = 4                                   # the other run's batch 1: rows 5 to 8
        with database.transaction(participants=[other]):
            pass
        with pytest.raises(IngestError, match=r"batch 1 of racing was committed with 4 rows and came again with 3"):
            ingestion.process(rows[3:6], 1, query_id="racing")
        database.rules.wait_idle(60)
        assert [row[:3] for row in app_state(database)["counters"] if row[0] == "racing"] == [("racing", 3, 3)]
    finally:
        ingestion.close()
        database.close()


@pytest.mark.parametrize("source, run, what", [
    ("nul\x00source", None, r"source='nul\\x00source'\) holds a NUL character \(\\x00\) at index 3"),
    ("half\udc80", None, r"source='half\\udc80'\) holds a lone UTF-16 surrogate \('\\udc80'\) at index 4"),
    ("badges", "run\x00", r"run='run\\x00'\) holds a NUL character \(\\x00\) at index 3"),
    ("badges", "\ud800run", r"run='\\ud800run'\) holds a lone UTF-16 surrogate \('\\ud800'\) at index 0"),
    ("badges", "r" + secrets.token_hex(1600), r"run='r[0-9a-f]+'….* is a run id of 3201 bytes .*at most 512 bytes"),
], ids=["nul-source", "surrogate-source", "nul-run", "surrogate-run", "long-run"])
def test_a_source_or_run_the_ledger_cannot_hold_is_refused_saying_which_before_anything_is_applied(database_url,
                                                                                                    source, run, what):
    """A source name or run id holding a NUL character failed the feed with DatabaseError "PostgreSQL text fields
    cannot contain NUL (0x00) bytes … This looks like a bug", one holding a lone surrogate with a bare
    UnicodeEncodeError, and a run id of some thousand bytes failed every batch at its commit with SQLSTATE 54000
    ("index row size … exceeds btree version 4 maximum 2704 for index activedb_ingestion_ledger_pkey … store less"),
    after trial flushes of every event in search of one to blame — naming neither the run nor what to give.  Now each
    is an IngestError naming the name, what it holds and where, before anything is applied; a run at the limit, with
    a source at its own, a partition and lineage, commits."""
    database = app_database(database_url)
    try:
        row = {"type": "add", "key": "held", "ts": BASE_TIME, "amount": 1, "seq": 0}
        before = app_state(database)
        with pytest.raises(IngestError, match=what + r".*nothing was applied"):
            feed(database, [[row]], source=source, run=run, mapping=app_counters.MAPPING)
        assert app_state(database) == before
        longest = LedgerId(secrets.token_hex(1024), secrets.token_hex(256), 2**31)   # 2048 and 512 bytes, incompressible
        ingestion = Ingestion(database, app_counters.MAPPING, source=longest.source, lineage=True)
        try:
            assert ingestion.process([row], 0, query_id=str(longest)).committed
        finally:
            ingestion.close()
    finally:
        database.close()


@pytest.mark.parametrize("source, run, what", [
    ("badges", "", r"feed\(run=''\) is empty: the ledger files batches under a run id, .* give one with a visible "
                   r"character"),
    ("badges", "  ", r"feed\(run='  '\) is only whitespace: the ledger files batches under a run id, .* give one "
                     r"with a visible character"),
    ("  ", None, r"feed\(source='  '\) is only whitespace: the ledger files batches under a source name, .* give "
                 r"one with a visible character"),
    ("", "r1", r"feed\(source=''\) is empty: the ledger files batches under a source name"),
    ("badges", "eu@2", r"feed\(run='eu@2'\) holds '@' at index 2, which a run id cannot hold — .* give one without "
                       r"them"),
    ("badges", "eu#p1", r"feed\(run='eu#p1'\) holds '#' at index 2, which a run id cannot hold"),
    ("badges", 7, r"feed\(run=7\) takes a run id, a text, or None for a source that never numbers its batches anew"),
], ids=["empty-run", "blank-run", "blank-source", "empty-source", "at-run", "hash-run", "number-run"])
def test_a_blank_source_or_run_or_a_run_holding_a_separator_is_refused_in_the_same_words(database_url, source, run,
                                                                                       what):
    """A run and a source name are checked by one checker, in the same words, saying that nothing was applied and what
    to give.  Before, ``feed(run="")`` and a run holding '@' or '#' got the ledger id's own wording ("a ledger id's run
    is a non-empty string without '@' or '#'", a BadArgument naming neither feed nor what became of the batches), and a
    run of only whitespace was taken — a run no operator can tell apart — while a source of only whitespace was
    refused ("the source name must be a non-empty string")."""
    database = app_database(database_url)
    try:
        row = {"type": "add", "key": "blank", "ts": BASE_TIME, "amount": 1, "seq": 0}
        before = app_state(database)
        with pytest.raises(IngestError, match=what + r".*nothing was applied"):
            feed(database, [[row]], source=source, run=run, mapping=app_counters.MAPPING)
        assert app_state(database) == before
    finally:
        database.close()


@pytest.mark.parametrize("text", ["bad\x00ges", "bad\udc80ges"], ids=["nul", "surrogate"])
def test_a_question_about_a_name_the_ledger_cannot_hold_answers_none(database_url, text):
    """No ledger id holds a NUL character or a lone surrogate (an ingestion refuses such a source or run).  Asking the
    ledger about one — ``ingestion_status``, ``batch_committed``, ``sources_of_run``, ``forget_run`` — failed with
    DatabaseError "PostgreSQL text fields cannot contain NUL (0x00) bytes … This looks like a bug" (a surrogate: a
    bare UnicodeEncodeError); each now answers what the ledger holds of it: nothing."""
    from activedb.ingest import forget_run

    database = app_database(database_url)
    try:
        assert ingestion_status(database, text) == []
        assert batch_committed(database, f"{text}@run", 0) is False
        assert sources_of_run(database, text) == set()
        with database.engine.begin() as connection:
            assert forget_run(connection, f"{text}@run") == 0
    finally:
        database.close()


def test_a_question_about_a_ledger_id_of_a_blank_run_answers_none(database_url):
    """No ingestion writes a run of only whitespace now (``check_source_name`` refuses it) and ``LedgerId.parse``
    refuses its text; asking a ledger without one about one answers what it holds of it: nothing — and an ingestion
    given one as its query id refuses it in the checker's words.  (A ledger row of one an earlier feed wrote is read:
    ``test_a_ledger_row_of_a_blank_run_an_earlier_activedb_wrote_is_read``.)"""
    from activedb.ingest import forget_run
    from activedb.ingest._ledger import recorded_batch

    database = app_database(database_url)
    try:
        assert batch_committed(database, "badges@ ", 0) is False
        assert recorded_batch(database, "badges@\t#p1", 0) is None
        assert sources_of_run(database, " ") == set()
        with database.engine.begin() as connection:
            assert forget_run(connection, "badges@ ") == 0
        ingestion = Ingestion(database, app_counters.MAPPING, source="badges")
        try:
            with pytest.raises(IngestError, match=r"run=' '\) is only whitespace.*nothing was applied"):
                ingestion.process([], 0, query_id="badges@ ")
        finally:
            ingestion.close()
    finally:
        database.close()


def test_a_connection_lost_inside_a_rule_fails_the_batch_as_unavailable_not_as_the_rules_failure(make_database_url):
    """A rule whose read meets a connection PostgreSQL ended does not reject its event (nothing of the batch commits,
    rightly) — but the batch failed with RuleFailed "rule 'reader' failed on stream add key='b' …:
    DatabaseUnavailable(…)", sending whoever reads the error (``activedb run``'s one line, a connector deciding whether
    to retry) to a rule that did nothing wrong.  Now the batch fails with the ``DatabaseUnavailable`` itself, nothing
    applied, no dead letter; fed again, it applies once."""
    database = new_app_database(make_database_url, "lost_in_rule")
    ended = []

    @database.rule(on=database.stream("read"), coupling=Coupling.IMMEDIATE, name="reader")
    def reader(tx, event):
        if not ended:
            ended.append(True)
            end_sessions(database)      # every pooled connection is dead: the rule's read meets one
        tx.read("counters", event.key)

    rows = [{"type": "add", "key": "a", "ts": BASE_TIME, "amount": 1, "seq": 1},
            {"type": "read", "key": "b", "ts": BASE_TIME, "amount": 0, "seq": 2}]
    try:
        with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL"):
            feed(database, [rows], source="lost_in_rule", mapping=app_counters.MAPPING)
        assert not batch_committed(database, "lost_in_rule", 0) and dead_letters(database) == []
        [outcome] = feed(database, [rows], source="lost_in_rule", mapping=app_counters.MAPPING)
        assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 2, 0)
    finally:
        database.close()


def test_a_ledger_row_of_a_blank_run_an_earlier_activedb_wrote_is_read(database_url):
    """Before the blank run was refused (feed(run="  ") was taken until 2d6be459), feed wrote ledger rows and dead
    letters whose id reads as a run of only whitespace ("oldfeed@  ").  LedgerId now refuses that text; reading such
    a row — ``activedb status``, ``activedb batches``, the skip check, a dead letter's source — must not fail: the row
    is the ledger's, read as it was written, while the same text from a user is still refused."""
    from click.testing import CliRunner

    from activedb.cli import main
    from activedb.ingest import ingestion_status, original_query_name

    database = app_database(database_url)
    try:
        with database.engine.begin() as connection:     # (as the earlier feed(source="oldfeed", run="  ") wrote them)
            connection.execute(sa.text("INSERT INTO activedb_ingestion_ledger (query_id, batch_id, transaction_id, "
                                       "events, dead_letters) VALUES ('oldfeed@  ', 0, 'old-blank-run', 2, 1)"))
            connection.execute(sa.text("INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) VALUES "
                                       "('oldfeed@  ', 0, 'rejected by rule', '{}')"))
        [status] = ingestion_status(database, "oldfeed")
        assert (status.query_name, status.runs, status.batches, status.events) == ("oldfeed", ("  ",), 1, 2), status
        assert batch_committed(database, "oldfeed@  ", 0) is True
        assert original_query_name("oldfeed@  ") == "oldfeed"
        with pytest.raises(BadArgument, match="only whitespace"):
            LedgerId.parse("oldfeed@  ")
        for command in (["status"], ["dead-letters", "list", "--query", "oldfeed"]):
            result = CliRunner().invoke(main, ["--url", database_url, *command], env={"COLUMNS": "200"})
            assert result.exit_code == 0 and "Traceback" not in result.output, (command, result.output)
            assert "oldfeed" in result.output, (command, result.output)
        shown = CliRunner().invoke(main, ["--url", database_url, "batches", "show", "oldfeed@  ", "0"])
        assert "no recorded transaction consumed batch oldfeed@  /0" in shown.output, shown.output    # (no lineage)
    finally:
        database.close()


def test_a_rules_own_error_raised_while_it_handled_a_conflict_rejects_its_event(make_database_url):
    """A rule that meets a SerializationConflict and raises its own error in its ``except`` block: Python makes the
    conflict the error's context (``__context__``), not its cause.  The rule path took the rule's error for that
    conflict — "not the event's fault" — and ran the batch again, each run the same, until the batch failed with the
    SerializationConflict and the stream stopped.  The error is the rule's: its event is a dead letter, the rest of
    the batch commits once."""
    from activedb.errors import SerializationConflict

    database = new_app_database(make_database_url, "own_error_in_except")

    @database.rule(on=database.stream("read"), coupling=Coupling.IMMEDIATE, name="translator")
    def translator(tx, event):
        try:
            raise SerializationConflict("the account is busy")     # (what a helper of the rule's raised)
        except SerializationConflict:
            raise ValueError("gave up on a busy account")

    rows = [{"type": "add", "key": "a", "ts": BASE_TIME, "amount": 1, "seq": 1},
            {"type": "read", "key": "b", "ts": BASE_TIME, "amount": 0, "seq": 2}]
    try:
        [outcome] = feed(database, [rows], source="own_error_in_except", mapping=app_counters.MAPPING)
        assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 1, 1), outcome
        [letter] = dead_letters(database)
        assert "rejected by rule 'translator'" in str(letter) and "gave up on a busy account" in str(letter), letter
    finally:
        database.close()
