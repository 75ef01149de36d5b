"""The ledger accounts for every input row, the events an engine releases at the end of the stream included (issue:
the demo printed 13 dead letters, then 15; ``activedb status`` showed 257 events + 13 dead letters of 400 rows —
the 128 events released at the end were in no ledger row).

Pattern queries (the queries path: the engine's reorder buffer holds events back until a punctuation passes them)
fed three batches with watermarks, then the end of the stream: the run's ledger rows — the release is one, batch
-1 — hold events + dead letters == rows, the ingestion's statistics say the same, and so do the dead letters of the
run; releasing again (or feeding everything again) changes nothing.  The demo without Spark prints numbers that agree
with its ledger.
"""

from __future__ import annotations

import random
import re

import pytest
import sqlalchemy as sa

import activedb
from activedb import deadletters
from activedb.ingest import Batch, Ingestion, LedgerId, feed, ingestion_status
from activedb.ingest.errors import IngestError
from activedb.streams import QueriesHandler
from tests.conftest import APP_MIGRATIONS
from tests.spark_bridge.test_ingest_paths import BADGE_MAPPING, _badge_batches, _hygiene, _reset_hygiene

SEED = 4242


@pytest.fixture()
def database(make_database_url, request):
    database = activedb.connect(make_database_url(request.node.name[5:40], migrations=(APP_MIGRATIONS,)))
    database.upgrade_app(APP_MIGRATIONS)
    _reset_hygiene(database)
    yield database
    database.close()


def _batches() -> tuple[list[Batch], int]:
    """Three batches of badge rows with Spark's watermark rule (the largest time seen before, less 20 s)."""
    import datetime as dt

    rows, _, _ = _badge_batches(random.Random(SEED))
    batches, seen = [], None
    for number, chunk in enumerate(rows):
        watermark = None if seen is None else seen - dt.timedelta(seconds=20)
        batches.append(Batch(number, chunk, watermark))
        latest = max(dt.datetime.fromisoformat(row["ts"]) for row in chunk)
        seen = latest if seen is None else max(seen, latest)
    return batches, sum(len(chunk) for chunk in rows)


def _ledger(database) -> list[tuple]:
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT batch_id, events, dead_letters FROM activedb_ingestion_ledger ORDER BY batch_id"))]


def test_the_ledger_accounts_for_every_row_the_end_of_stream_release_included(database):
    batches, rows = _batches()
    engine = _hygiene(database)
    ingestion = Ingestion(database, BADGE_MAPPING, source="badges", handler=QueriesHandler(engine))
    try:
        query_id = str(LedgerId("badges", "run-1"))
        for batch in batches:
            ingestion.process(batch.rows, batch.number, query_id=query_id, watermark=batch.watermark)
        held = len(engine.buffered())
        assert held > 0, "the last watermark must leave events in the reorder buffer"
        assert ingestion.end_of_stream() == held
        statistics = ingestion.statistics()
        assert ingestion.end_of_stream() == 0                       # once: the ledger has the release
    finally:
        ingestion.close()
    ledger = _ledger(database)
    assert [row[0] for row in ledger] == [-1, 0, 1, 2]              # the release is batch -1 of the run
    assert ledger[0][1] == held
    assert sum(events + letters for _, events, letters in ledger) == rows
    [status] = ingestion_status(database, "badges")
    assert status.events + status.dead_letters == rows
    assert (statistics.events, statistics.dead_letters) == (status.events, status.dead_letters)
    assert deadletters.count(database, deadletters.LetterFilter(query="badges")) == status.dead_letters


def test_feeding_the_stream_again_after_its_end_changes_nothing(database):
    batches, rows = _batches()
    handler = QueriesHandler(_hygiene(database))
    feed(database, batches, source="badges", run="run-2", mapping=BADGE_MAPPING, handler=handler, end_of_stream=True)
    before = _ledger(database)
    again = QueriesHandler(_hygiene(database))
    outcomes = feed(database, batches, source="badges", run="run-2", mapping=BADGE_MAPPING, handler=again,
                    end_of_stream=True)
    assert not any(outcome.committed for outcome in outcomes)
    assert _ledger(database) == before and sum(events + letters for _, events, letters in before) == rows


def test_the_demo_without_spark_prints_what_its_ledger_holds(make_database_url, capfd):
    from activedb.examples.hand_hygiene.demo import run_demo

    url = make_database_url("demo")
    run_demo(url=url, events=400, workers=12, seed=7, use_spark=False)
    output = " ".join(capfd.readouterr().out.split())
    fed = re.search(r"(\d+) dead letters — (\d+) \+ \d+ of the 400 rows, as the ledger holds", output)
    letters = re.search(r"Dead letters of this run \(activedb_dead_letters\): (\d+)", output)
    assert fed and letters, output[-3000:]
    database = activedb.connect(url)
    try:
        statuses = ingestion_status(database)
        assert sum(status.events + status.dead_letters for status in statuses) == 400
        assert int(fed.group(1)) == int(letters.group(1)) == sum(status.dead_letters for status in statuses)
    finally:
        database.close()


def test_a_source_whose_run_ended_before_any_batch_has_no_last_batch(database):
    """``QueryStatus.last_batch_id`` leaves the end-of-stream release out, as its docstring says: a run whose source
    ended before any batch (its release, batch -1, the ledger's only row) has none — it said -1."""
    ingestion = Ingestion(database, BADGE_MAPPING, source="quiet", handler=QueriesHandler(_hygiene(database)))
    try:
        assert ingestion.end_of_stream(str(LedgerId("quiet", "run-1"))) == 0
    finally:
        ingestion.close()
    [status] = ingestion_status(database, "quiet")
    assert (status.batches, status.ledger_rows, status.last_batch_id) == (0, 1, None)
    batches, _ = _batches()
    feed(database, batches[:2], source="quiet", run="run-2", mapping=BADGE_MAPPING,
         handler=QueriesHandler(_hygiene(database)), end_of_stream=True)
    [status] = ingestion_status(database, "quiet")
    assert (status.batches, status.last_batch_id) == (2, 1)


def test_the_end_of_a_stream_fed_again_with_no_batches_releases_what_the_saved_engine_holds(database):
    """``feed(…, end_of_stream=True)`` releases under the run it names: a process that fed the batches and stopped
    before the end, then a new one that feeds no batch (the source had nothing more) with ``end_of_stream=True``,
    releases what the engine's saved state holds — the release asked for the run of the last batch this process
    saw, and with none it released nothing, leaving those events in no ledger row."""
    batches, rows = _batches()
    first = _hygiene(database)
    feed(database, batches, source="badges", run="run-3", mapping=BADGE_MAPPING, handler=QueriesHandler(first))
    held = len(first.buffered())
    assert held > 0, "the last watermark must leave events in the saved reorder buffer"
    restarted = _hygiene(database)          # (a new process: the engine loads its saved state)
    feed(database, [], source="badges", run="run-3", mapping=BADGE_MAPPING, handler=QueriesHandler(restarted),
         end_of_stream=True)
    ledger = _ledger(database)
    assert [row[0] for row in ledger] == [-1, 0, 1, 2] and ledger[0][1] == held
    assert sum(events + letters for _, events, letters in ledger) == rows


@pytest.mark.parametrize("query_id", ["", 5])
def test_an_end_of_stream_under_a_query_id_that_is_no_ledger_id_is_refused(database, query_id):
    """``Ingestion.end_of_stream(query_id)`` takes a ledger id's text, as ``process`` does: an empty one was taken
    for "the last run this ingestion saw" (here none: nothing released, silently), a number failed with the
    driver's error (operator does not exist: text = integer)."""
    ingestion = Ingestion(database, BADGE_MAPPING, source="badges", handler=QueriesHandler(_hygiene(database)))
    try:
        with pytest.raises(IngestError, match=r"query_id .* is no ledger id"):
            ingestion.end_of_stream(query_id)
    finally:
        ingestion.close()
    assert ingestion_status(database) == []


def test_an_end_of_stream_without_a_query_id_releases_under_the_last_run_the_ingestion_saw(database):
    """``end_of_stream()`` releases under "the last run this ingestion saw", as it says: an ingestion that fed one
    run and then another released the first run's end-of-stream batch — which the ledger already had, so nothing of
    the second run was released, silently (the statistics kept the first run's ledger id for good)."""
    from activedb.ingest import BatchHandler

    class Holding(BatchHandler):
        holds_back = True
        validates_rows = False

        def __init__(self) -> None:
            self.released: list[str] = []

        def handle(self, tx, batch, ledger):
            ledger.events = 0

        def release(self, tx, batch, ledger):
            self.released.append(batch.query_id)
            ledger.events = 1

    handler = Holding()
    ingestion = Ingestion(database, source="holding", handler=handler)
    first, second = str(LedgerId("holding", "run-1")), str(LedgerId("holding", "run-2"))
    try:
        ingestion.process([{"n": 1}], 0, query_id=first)
        assert ingestion.end_of_stream() == 1 and handler.released == [first]
        ingestion.process([{"n": 2}], 0, query_id=second)
        assert ingestion.statistics().query_id == second
        assert ingestion.end_of_stream() == 1 and handler.released == [first, second]
    finally:
        ingestion.close()


def test_the_end_of_a_run_of_another_source_than_the_ingestion_s_is_refused(database):
    """``end_of_stream(query_id)`` of another source's run filed the release (batch -1) under that source — its
    ledger row, status and exactly-once check another source's, as ``process`` did before a6c6f55.  Now an
    IngestError names both sources and nothing is released."""
    batches, _ = _batches()
    engine = _hygiene(database)
    ingestion = Ingestion(database, BADGE_MAPPING, source="badges", handler=QueriesHandler(engine))
    try:
        for batch in batches:
            ingestion.process(batch.rows, batch.number, query_id="badges@run-1", watermark=batch.watermark)
        held = len(engine.buffered())
        assert held > 0
        with pytest.raises(IngestError, match=r"'other@run-1' is a run of source 'other', not of this ingestion's "
                                              r"source 'badges'"):
            ingestion.end_of_stream("other@run-1")
        assert len(engine.buffered()) == held
        assert ingestion_status(database, "other") == []
    finally:
        ingestion.close()
