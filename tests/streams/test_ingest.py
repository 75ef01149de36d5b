"""The queries path of the ingestion core (``QueriesHandler``): which stream of an engine a row's event is fed to."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from activedb import streams
from activedb.ingest import EventMapping, feed
from activedb.ingest.errors import IngestError

BASE = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
MAPPING = EventMapping("type", "HCW-ID", "ts", payload_columns=["location"])


def _rows(*types: str) -> list[dict]:
    return [{"type": event_type, "HCW-ID": "w1", "ts": (BASE + dt.timedelta(seconds=number)).isoformat(),
             "location": "a"} for number, event_type in enumerate(types)]


def test_an_engine_with_a_stream_of_any_type_beside_typed_ones_is_fed_every_row(db):
    """An engine with a stream that declares its types and one that takes any type: a row of a declared type goes
    to its stream, every other row to the stream of any type — none is dropped (before, every row of such an
    engine was skipped: the ledger counted 0 events and 0 dead letters of 4 rows)."""
    engine = streams.StreamEngine(db, name="mixed", durable=False, record_dead_letters=False)
    engine.create_stream("badges", types=["EXIT", "ENTER"], attributes=("HCW-ID", "location"))
    engine.create_stream("other", attributes=("HCW-ID", "location"))
    engine.define("CREATE QUERY Q ON badges PATTERN SEQ(EXIT, ENTER) WHERE [HCW-ID] RETURN ENTER.HCW-ID")
    engine.define("CREATE QUERY P ON other PATTERN PING RETURN PING.HCW-ID")
    outcomes = feed(db, [_rows("EXIT", "ENTER", "PING", "EXIT")], source="mixed", mapping=MAPPING,
                    handler=streams.QueriesHandler(engine), end_of_stream=True)
    assert [(outcome.events, outcome.dead_letters) for outcome in outcomes] == [(0, 0)]   # held back until the end
    with db.engine.connect() as connection:
        ledger = connection.execute(sa.text("SELECT sum(events), sum(dead_letters) FROM activedb_ingestion_ledger "
                                            "WHERE query_id LIKE 'mixed%'")).one()
    assert tuple(ledger) == (4, 0)
    statistics = engine.statistics()
    assert (statistics.events_processed, statistics.per_query["Q"].outputs, statistics.per_query["P"].outputs) == (
        4, 1, 1)


def test_an_engine_with_two_streams_of_any_type_is_refused_for_the_queries_path(db):
    """Two streams that both take any type: a row's stream cannot be told, so the handler refuses the engine
    when the ingestion takes it, saying what to declare."""
    engine = streams.StreamEngine(db, name="ambiguous", durable=False, record_dead_letters=False)
    engine.create_stream("one", attributes=("HCW-ID", "location"))
    engine.create_stream("two", attributes=("HCW-ID", "location"))
    with pytest.raises(IngestError, match=r"ambiguous.*one, two.*types="):
        feed(db, [_rows("EXIT")], source="ambiguous", mapping=MAPPING, handler=streams.QueriesHandler(engine))
