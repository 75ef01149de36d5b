"""Replaying every poison kind of the bridge's README: the replay submits the original row exactly, so it
applies what the original would have applied once its cause is fixed — or is rejected again for the
original reason — and nothing applies twice (event ids are checked across a query and its replays).

Batch 0 comes as Spark delivers it (an Arrow table, with the corrupt-record column), batch 1 as a caller
of ``IngestSink.process`` hands it (dicts, with values Arrow cannot hold: a lone surrogate, NaN)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from pathlib import Path

import pyarrow as pa
import pytest

import spark_bridge
from activedb import deadletters
from activedb.deadletters import LetterFilter
from spark_bridge import EventMapping, IngestSink
from activedb.ingest import replay_dead_letters
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_state, new_app_database

MAPPING = EventMapping("type", "key", "ts", payload_columns=("amount", "seq"), id_column="seq")
QUERY = "counters@00000000-0000-0000-0000-0000000000c1"
BIG_KEY = "b" * 1_000_000
SCHEMA = pa.schema([("type", pa.string()), ("key", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("amount", pa.int32()), ("seq", pa.int32()), ("_corrupt_record", pa.string())])
WRONG_TYPE = '{"type": "add", "key": "k", "ts": "2024-05-01T12:00:12Z", "amount": "many", "seq": 12}'
MALFORMED = '{"type": "add", "key": "k", "ts": "2024-05-01T12:00:09Z", "amount": 1, "seq": 99'


def at(seq: int) -> dt.datetime:
    return BASE_TIME + dt.timedelta(seconds=seq)


def row(seq: int, kind: str, key: str, amount: int | None) -> dict:
    return {"type": kind, "key": key, "ts": at(seq), "amount": amount, "seq": seq, "_corrupt_record": None}


BATCH_0 = [row(1, "add", "k", 10), row(2, "add", "k", 5),
           row(3, "add", "x1\x00evil", 1),                  # NUL in the key: PostgreSQL cannot store it
           row(4, "add", BIG_KEY, 1),                        # 1 MB key: refused at the commit (index row size)
           {**{name: None for name in SCHEMA.names}, "_corrupt_record": MALFORMED},   # Spark could not read it
           row(5, "sub", "k", 100),                          # the rule refuses it until the total allows it
           row(6, "add", "k", -3),                           # the rule always refuses it
           row(7, "mul", "k", 2),                            # no rule knows the type
           {**row(12, "add", "k", None), "_corrupt_record": WRONG_TYPE},   # Spark read all but "amount"
           {**{name: None for name in SCHEMA.names}, "_corrupt_record": "[1, 2, 3]"}]   # not an object
BATCH_1 = [row(1, "add", "k", 10),                           # re-sent: a duplicate of batch 0's event 1
           {**row(8, "add", "k", 1), "ts": math.nan},        # NaN where the time goes
           row(9, "add", "k\ud800", 1),                      # a lone surrogate in the key
           row(10, "add", "k", 200)]                         # makes room for event 5


@pytest.fixture()
def databases(make_database_url):
    ingested, direct = new_app_database(make_database_url, "ingested"), new_app_database(make_database_url, "direct")
    yield ingested, direct
    ingested.close()
    direct.close()


def _app():
    return dataclasses.replace(spark_bridge.load_app(str(Path(app_counters.__file__).resolve()),
                                                     require_mapping=True), mapping=MAPPING)


def _open(database) -> list:
    return deadletters.select(database, LetterFilter(query="counters", replayed=False))


def _replay(database) -> dict[int, str]:
    return {outcome.letter_id: outcome.outcome for outcome in replay_dead_letters(database, _app(), _open(database))}


def _seq(letter: deadletters.LetterRecord) -> int:
    original = letter.row()
    return (original.to_pylist()[0] if hasattr(original, "to_pylist") else original)["seq"]


def _cause(reason: str) -> str:
    """A reason without the transaction that met it (``T35`` — the replay's transaction is another one)."""
    return re.sub(r"\bT\d+(?:\.\d+)*\b", "T", reason)


def _first_letters(database) -> dict[int, deadletters.LetterRecord]:
    """The original letter behind every letter: ``{letter id: the letter of the original query}``."""
    letters = {letter.id: letter for letter in deadletters.select(database)}
    originals = {}
    for letter in letters.values():
        first = letter
        while first.query_id.startswith("replay:"):
            first = letters[first.batch_id]
        originals[letter.id] = first
    return originals


def test_every_poison_kind_replays_to_what_the_original_would_have_applied(databases):
    ingested, direct = databases
    sink = IngestSink(ingested, MAPPING, query_name="counters")
    first = sink.process(pa.Table.from_pylist(BATCH_0, schema=SCHEMA), 0, query_id=QUERY)
    assert (first.events, first.dead_letters) == (2, 8)
    originals = {letter.id: letter for letter in _open(ingested)}

    # Round 1, no cause fixed: every letter is rejected again, for its original reason, with its original row.
    assert set(_replay(ingested).values()) == {"rejected again"}
    again = _open(ingested)
    assert len(again) == len(originals)
    for letter in again:
        original = originals[letter.batch_id]
        assert _cause(letter.reason) == _cause(original.reason), (letter.reason, original.reason)
        assert letter.row().to_pylist() == original.row().to_pylist()
    assert [counter[:4] for counter in app_state(ingested)["counters"]] == [("k", 15, 2, "1,2")]

    # Batch 1 fixes event 5's cause; round 2 applies it, once, and only it.
    second = sink.process(BATCH_1, 1, query_id=QUERY)
    assert (second.events, second.dead_letters) == (1, 3)
    late = sink.process([row(11, "add", "k", 1)], 2, query_id=QUERY, watermark=at(20))     # behind the watermark
    assert (late.events, late.dead_letters) == (0, 1)
    outcomes = _replay(ingested)
    first_of = _first_letters(ingested)
    applied = [_seq(first_of[letter_id]) for letter_id, outcome in outcomes.items() if outcome == "applied"]
    assert applied == [5, 11]                          # fixed by batch 1; late, which a replay is not
    for letter in _open(ingested):                     # the rest: rejected again, each for its original reason
        assert _cause(letter.reason) == _cause(first_of[letter.id].reason), (letter.reason, first_of[letter.id].reason)
    reasons = sorted(letter.reason for letter in _open(ingested))
    assert any("duplicate: event id '1' was already ingested in batch 0" in reason for reason in reasons)
    assert any("NUL character" in reason for reason in reasons)
    assert any("lone surrogate" in reason for reason in reasons)
    assert any("is nan (float), not a finite number" in reason for reason in reasons)
    assert any(reason.startswith("malformed JSON") for reason in reasons)
    assert any("54000" in reason for reason in reasons)
    assert any("field 'amount' is 'many' (str)" in reason for reason in reasons)
    assert any("not an object" in reason for reason in reasons)

    # Nothing applies twice: a third round changes nothing, letters already replayed are skipped, and the
    # source re-sending event 5 (applied by a replay) is a duplicate of the replay.
    before = app_state(ingested)
    assert "applied" not in _replay(ingested).values()
    replayed = deadletters.select(ingested, LetterFilter(query="counters", replayed=True))
    assert {outcome.outcome for outcome in replay_dead_letters(ingested, _app(), replayed)} == {"already replayed"}
    resent = sink.process([row(5, "sub", "k", 100)], 3, query_id=QUERY)
    assert (resent.events, resent.dead_letters) == (0, 1)
    [duplicate] = deadletters.select(ingested, LetterFilter(query="counters", batch=3))
    assert "event id '5' was already ingested" in duplicate.reason and "replay:counters" in duplicate.reason
    assert app_state(ingested) == before

    # What the originals would have applied: events 1, 2, 10 in time order, then events 5 and 11 when replayed.
    with direct.transaction(name="direct") as tx:
        for seq, kind, amount in ((1, "add", 10), (2, "add", 5), (10, "add", 200), (5, "sub", 100), (11, "add", 1)):
            with tx.subtransaction() as sub:
                sub.emit(kind, key="k", ts=at(seq), payload={"amount": amount, "seq": seq})
    assert app_state(ingested) == app_state(direct)
