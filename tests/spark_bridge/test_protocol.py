"""The one batch protocol (``spark_bridge._handler.run_batch``) with a handler of one's own, and
``ingest()``'s options checked in one place (``IngestOptions``) — without Spark, on real PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest

from activedb.errors import SerializationConflict
from spark_bridge import BatchHandler, IngestOptions, IngestSink, ingest
from spark_bridge.errors import IngestError
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_database, app_state, dead_letters, ledger


def _event(seq: int, key: str = "k", amount: int = 1) -> dict:
    return {"type": "add", "key": key, "ts": BASE_TIME + dt.timedelta(seconds=seq), "amount": amount, "seq": seq}


class Writer(BatchHandler):
    """Writes each event's amount to ``counters`` itself (no rules); an odd amount is a dead letter.  The
    first ``conflicts`` attempts raise a serialization conflict after writing."""

    name = "writer"

    def __init__(self, conflicts: int = 0) -> None:
        self.conflicts = conflicts
        self.attempts = 0

    def handle(self, tx, batch, ledger) -> None:
        self.attempts += 1
        odd = [event for event in batch.events if event.payload["amount"] % 2]
        for event in batch.events:
            if event not in odd:
                tx.write("counters", event.key, total=event.payload["amount"], events=1,
                         trail=str(event.payload["seq"]), last_ts=event.ts)
        if self.attempts <= self.conflicts:
            raise SerializationConflict("another process changed a row this batch read")
        letters = [*batch.letters, *batch.dead_letters.for_events([(event, "odd amount") for event in odd])]
        batch.dead_letters.insert(tx, letters)
        ledger.events = len(batch.events) - len(odd)
        ledger.dead_letters = len(letters)


@pytest.fixture()
def database(make_database_url, request):
    database = app_database(make_database_url(request.node.name[5:40]))
    yield database
    database.close()


def test_a_handler_of_ones_own_gets_ledger_dead_letters_conflict_reruns_and_replay_skips(database):
    handler = Writer(conflicts=1)
    sink = IngestSink(database, app_counters.MAPPING, query_name="own", handler=handler, known_types={"add"})
    rows = [_event(1, "a", 2), _event(2, "b", 3), {**_event(3, "c"), "type": "nope"}]
    outcome = sink.process(rows, 4, query_id="own@x")
    assert (outcome.committed, outcome.events, outcome.dead_letters, outcome.attempts) == (True, 1, 2, 2)
    assert [row[:2] for row in app_state(database)["counters"]] == [("a", 2)]    # the aborted attempt left nothing
    letters = {raw["seq"]: reason for _, _, reason, raw in dead_letters(database)}
    assert letters[2] == "odd amount" and letters[3].startswith("event type ('type') is 'nope'")
    assert ledger(database) == [("own@x", 4, 1, 2)]
    assert not sink.process(rows, 4, query_id="own@x").committed and handler.attempts == 2
    assert sink.known_types() == frozenset({"add"})


def test_ingest_options_are_checked_in_one_place_before_spark_is_touched():
    with pytest.raises(IngestError, match="pass queries=engine too"):
        IngestOptions(scheduler="sei")
    with pytest.raises(IngestError, match="choose one per query"):
        IngestOptions(queries=object(), composition=object())
    with pytest.raises(IngestError, match="scale-out path only"):
        IngestOptions(app="app.py")
    with pytest.raises(IngestError, match="trigger must be"):
        IngestOptions(trigger=True)
    common = dict(mapping=app_counters.MAPPING, query_name="q", checkpoint_location="ck")
    with pytest.raises(IngestError, match="no option 'prefech'.*prefetch"):
        ingest(object(), object(), prefech={"counters": None}, **common)
    with pytest.raises(IngestError, match="not both"):
        ingest(object(), object(), options=IngestOptions(), lineage=False, **common)
    with pytest.raises(IngestError, match="needs a streaming DataFrame"):      # the options passed their checks
        ingest(object(), object(), options=IngestOptions(prefetch={"counters": None}), **common)
