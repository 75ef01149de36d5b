"""Poison rows never stop a stream: every row PostgreSQL cannot store, and every row Spark cannot read,
ends as one dead letter with a true reason and its raw text, while the batch's other rows apply.

* without Spark (``IngestSink.process``): a NUL character and a lone surrogate in a key (refused at the
  write), a 1 MB key (refused by PostgreSQL at the commit: the batch is bisected to find it), and a key
  that collides with another event's insert;
* through real Spark (a file stream read with the corrupt-record column): NUL, a 1 MB key, malformed
  JSON, a value of the wrong type, a line that is not an object — in the first of three batches; the
  stream goes on, and the applied rows equal the good rows applied directly;
* duplicate events: with ``EventMapping(id_column=...)``, a re-sent event (same id) is one dead letter,
  in the same batch or a later one;
* a refusal no trial of the events reproduces re-runs the batch as it was (nobody is blamed), and only a
  second one names the batch's last event;
* on the TPG path, a state transaction's value the table cannot hold is a dead letter alone, and a commit
  PostgreSQL refuses is searched for its events as on the rule path.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import string

import pytest

import spark_bridge
from activedb import deadletters
from activedb.errors import InvalidValue
from activedb.txn import CommitParticipant
from spark_bridge import EventMapping, IngestSink
from activedb.ingest._failures import find_culprits
from spark_bridge._sources import with_corrupt_column
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import (
    BASE_TIME,
    app_state,
    apply_directly,
    dead_letters,
    iso,
    ledger,
    new_app_database,
    run_to_end,
)

BIG_KEY = "".join(random.Random(3).choice(string.ascii_letters) for _ in range(1_000_000))   # incompressible


def _row(seq: int, key: str, amount: int = 5, kind: str = "add") -> dict:
    return {"type": kind, "key": key, "ts": iso(BASE_TIME + dt.timedelta(seconds=seq)), "amount": amount, "seq": seq}


@pytest.fixture()
def databases(make_database_url, request):
    name = request.node.name[5:30]
    ingested, direct = new_app_database(make_database_url, name), new_app_database(make_database_url, name + "_d")
    yield ingested, direct
    ingested.close()
    direct.close()


def _parsed(rows: list[dict]) -> list[dict]:
    return [{**row, "ts": dt.datetime.fromisoformat(row["ts"].replace("Z", "+00:00"))} for row in rows]


def test_rows_postgresql_cannot_store_become_dead_letters_and_the_rest_applies(databases):
    ingested, direct = databases
    good = [_row(seq, f"k{seq % 3}") for seq in range(1, 21)]
    poison = [_row(21, "k\x00nul"), _row(22, "k\ud800surrogate"), _row(23, BIG_KEY)]
    rows = good[:7] + poison[:1] + good[7:12] + poison[1:] + good[12:]
    sink = IngestSink(ingested, app_counters.MAPPING, query_name="poison")
    outcome = sink.process(_parsed(rows), 0, query_id="poison@direct")

    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 20, 3)
    reference = apply_directly(direct, good)
    assert app_state(ingested) == app_state(direct)
    letters = {raw["seq"]: (reason, raw) for _, _, reason, raw in dead_letters(ingested)}
    assert sorted(letters) == [21, 22, 23]
    assert "NUL character" in letters[21][0] and letters[21][1]["key"] == "k\\u0000nul"
    assert "lone surrogate" in letters[22][0] and letters[22][1]["key"].startswith("k\\ud800")
    assert "PostgreSQL refused this event's writes at the commit" in letters[23][0]
    assert "54000" in letters[23][0] and "index row" in letters[23][0]
    assert letters[23][1]["key"] == BIG_KEY                      # the raw text, whole
    assert ledger(ingested) == [("poison@direct", 0, 20, 3)]
    assert reference.applied == 20


@contextlib.contextmanager
def _one_total_of_ten(database):
    """A unique index on ``counters.total`` where it is 10: two keys reaching 10 collide in PostgreSQL."""
    with database.engine.begin() as connection:
        connection.exec_driver_sql("CREATE UNIQUE INDEX one_total_of_ten ON counters (total) WHERE total = 10")
    try:
        yield
    finally:
        with database.engine.begin() as connection:
            connection.exec_driver_sql("DROP INDEX one_total_of_ten")


def test_a_failure_that_needs_two_events_names_the_later_one(databases):
    """Two events insert the same milestone row (a key collision only their combination causes): the
    halves pass alone, the first failing prefix names the later event."""
    ingested, _ = databases
    rows = [_row(1, "a", amount=10), _row(2, "b", amount=10)]
    sink = IngestSink(ingested, app_counters.MAPPING, query_name="pair")
    with _one_total_of_ten(ingested):                                 # a row both events' writes collide with
        outcome = sink.process(_parsed(rows), 0, query_id="pair@direct")
    assert (outcome.events, outcome.dead_letters) == (1, 1)
    [(_, _, reason, raw)] = dead_letters(ingested)
    assert raw["seq"] == 2 and "23505" in reason and "together with an earlier event" in reason


class _RefusesOnce(CommitParticipant):
    """A commit participant that makes the first commit it takes part in refused as for a value (what a
    concurrent transaction's row could cause), and never again: a refusal no trial of the events reproduces."""

    def __init__(self) -> None:
        self.refused = 0

    def write(self, transaction, connection) -> None:
        if not self.refused:
            self.refused += 1
            raise InvalidValue("refused once, by the test")


def test_a_refusal_no_trial_reproduces_reruns_the_batch_and_blames_nobody(databases):
    """The batch's commit is refused once, but no trial of its events is: the batch is re-run as it was,
    every event applied, no dead letter (it used to name the batch's last event)."""
    ingested, _ = databases
    rows = [_row(1, "a"), _row(2, "b"), _row(3, "a")]
    sink = IngestSink(ingested, app_counters.MAPPING, query_name="once")
    refuses = _RefusesOnce()
    outcome = sink.process(_parsed(rows), 0, query_id="once@direct", participants=[refuses])
    assert refuses.refused == 1
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 3, 0)
    assert dead_letters(ingested) == []


def test_a_one_event_batch_whose_refusal_no_trial_reproduces_is_rerun_and_its_event_applied(databases):
    """As with more events: the batch of one event is re-run as it was and its event applied.  Its event was made
    a dead letter at once, without a trial — a refusal that was not the event's cost the stream a good event."""
    ingested, _ = databases
    sink = IngestSink(ingested, app_counters.MAPPING, query_name="once")
    refuses = _RefusesOnce()
    outcome = sink.process(_parsed([_row(1, "a")]), 0, query_id="once@direct", participants=[refuses])
    assert refuses.refused == 1
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 1, 0)
    assert dead_letters(ingested) == []


def test_a_refusal_no_trial_reproduces_twice_names_the_last_event():
    """Met a second time for the same batch, such a refusal names the last event (the stream goes on);
    ``find_culprits`` alone: the first time nobody."""
    events = ["e1", "e2", "e3"]
    never = lambda subset: None                                        # noqa: E731 (no trial is refused)
    failure = InvalidValue("refused")
    assert find_culprits(never, events, failure, blame_unreproduced=False) == []
    [(event, reason)] = find_culprits(never, events, failure, blame_unreproduced=True)
    assert event == "e3" and "together with an earlier event" in reason
    poison = lambda subset: failure if "e2" in subset else None       # noqa: E731
    assert [event for event, _ in find_culprits(poison, events, failure, blame_unreproduced=False)] == ["e2"]
    assert find_culprits(never, ["e1"], failure, blame_unreproduced=False) == []      # one event: the same
    assert [event for event, _ in find_culprits(never, ["e1"], failure, blame_unreproduced=True)] == ["e1"]
    assert [event for event, _ in find_culprits(poison, ["e2"], failure, blame_unreproduced=False)] == ["e2"]


def test_values_a_tpg_batch_cannot_store_are_dead_letters_and_the_stream_goes_on(databases):
    """On the TPG path (``TpgHandler``) a state transaction whose written value the table cannot hold —
    a NUL in a text column, a string for a number — is a dead letter alone: the batch commits without it and
    the next batch runs (such a value used to fail the whole batch, again on every restart)."""
    from activedb import batch
    from activedb.batch._ingest import TpgHandler

    ingested, _ = databases
    transactions = batch.StateTransactions("counters, some values unstorable")

    @transactions.on("add")
    def add(event, ops):
        amount, seq = event.payload["amount"], event.payload["seq"]
        trail = {2: "nul\x00", 3: "fine"}.get(seq, str(seq))
        ops.write("counters", event.key, lambda own: {
            "total": (own or {"total": 0})["total"] + amount if seq != 3 else "three", "trail": trail})

    sink = IngestSink(ingested, app_counters.MAPPING, query_name="tpg-values", handler=TpgHandler(transactions))
    rows = [_row(seq, "a" if seq % 2 else "b", amount=seq) for seq in range(1, 6)]
    outcome = sink.process(_parsed(rows), 0, query_id="tpg-values@direct")
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 3, 2)
    reasons = {raw["seq"]: reason for _, _, reason, raw in dead_letters(ingested)}
    assert sorted(reasons) == [2, 3] and "NUL" in reasons[2] and "total" in reasons[3]
    assert {key: (total, trail) for key, total, _, trail, _ in app_state(ingested)["counters"]} == {
        "a": (6, "5"), "b": (4, "4")}
    assert sink.process(_parsed([_row(6, "b", amount=1)]), 1, query_id="tpg-values@direct").committed


def test_a_tpg_batch_postgresql_refuses_is_searched_for_the_events_that_caused_it(databases):
    """On the TPG path a commit PostgreSQL itself refuses — a 1 MB key beyond its index's row limit, two events'
    rows colliding on a unique index — is searched like the rule path's: those events are dead letters with
    PostgreSQL's reason, the rest commits (it used to fail the batch on every restart)."""
    from activedb import batch
    from activedb.batch._ingest import TpgHandler

    ingested, _ = databases
    transactions = batch.StateTransactions("counters at commit")

    @transactions.on("add")
    def add(event, ops):
        ops.write("counters", event.key, lambda own: {"total": (own or {"total": 0})["total"] + event.payload["amount"],
                                                     "trail": str(event.payload["seq"])})

    sink = IngestSink(ingested, app_counters.MAPPING, query_name="tpg-poison", handler=TpgHandler(transactions))
    rows = [_row(1, "a", amount=10), _row(2, "b", amount=3), _row(3, BIG_KEY, amount=1), _row(4, "c", amount=10),
            _row(5, "b", amount=4)]
    with _one_total_of_ten(ingested):                                 # a row both a's and c's writes collide with
        outcome = sink.process(_parsed(rows), 0, query_id="tpg-poison@direct")
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 3, 2)
    reasons = {raw["seq"]: reason for _, _, reason, raw in dead_letters(ingested)}
    assert sorted(reasons) == [3, 4]
    assert "54000" in reasons[3] and "23505" in reasons[4] and "together with an earlier event" in reasons[4]
    assert {key: (total, trail) for key, total, _, trail, _ in app_state(ingested)["counters"]} == {
        "a": (10, "1"), "b": (7, "5")}


def test_duplicate_event_ids_are_dead_letters_in_the_same_batch_and_later(databases):
    ingested, direct = databases
    mapping = EventMapping("type", "key", "ts", payload_columns=("amount", "seq"), id_column="seq")
    sink = IngestSink(ingested, mapping, query_name="dedup")
    first = [_row(seq, "k") for seq in range(1, 6)] + [_row(3, "k")]          # seq 3 twice in one batch
    second = [_row(seq, "k") for seq in range(5, 9)]                         # seq 5 re-sent a batch later
    one = sink.process(_parsed(first), 0, query_id="dedup@a")
    two = sink.process(_parsed(second), 1, query_id="dedup@a")
    assert (one.events, one.dead_letters, two.events, two.dead_letters) == (5, 1, 3, 1)
    reasons = sorted(reason for _, _, reason, _ in dead_letters(ingested))
    assert "event id '3' appears more than once in this batch" in reasons[0]
    assert "event id '5' was already ingested in batch 0 of dedup@a" in reasons[1]
    apply_directly(direct, [_row(seq, "k") for seq in range(1, 9)])
    assert app_state(ingested) == app_state(direct)


@pytest.mark.spark
def test_poison_lines_through_spark_are_dead_letters_and_the_stream_goes_on(spark, tmp_path, databases):
    ingested, direct = databases
    good = [[_row(seq, f"k{seq % 4}") for seq in range(start, start + 10)] for start in (1, 101, 201)]
    lines = [[json.dumps(row) for row in batch] for batch in good]
    poison = [
        json.dumps(_row(50, "k\x00nul")),                                  # NUL: refused at the write
        json.dumps(_row(51, BIG_KEY)),                                    # 1 MB key: refused at the commit
        '{"type": "add", "key": "k1", "ts": "2024-05-01T12:00:52Z", "amount": 1, "seq": 52',   # malformed
        json.dumps({**_row(53, "k1"), "amount": "many"}),                 # wrong type for INT
        json.dumps({**_row(54, "k1"), "ts": "not a time"}),               # wrong type for TIMESTAMP
        "[1, 2, 3]",                                                      # not an object
    ]
    lines[0] = lines[0][:4] + poison + lines[0][4:]
    source = tmp_path / "in"
    source.mkdir()
    for index, batch in enumerate(lines):
        path = source / f"part-{index:03d}.json"
        path.write_text("\n".join(batch) + "\n")
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
    frame = (spark.readStream.schema(with_corrupt_column(app_counters.SCHEMA))
             .option("columnNameOfCorruptRecord", "_corrupt_record").option("maxFilesPerTrigger", 1)
             .json(str(source)))
    query = spark_bridge.ingest(ingested, frame, mapping=app_counters.MAPPING, query_name="poison-spark",
                                checkpoint_location=str(tmp_path / "checkpoint"), trigger={"availableNow": True})
    run_to_end(query)

    apply_directly(direct, [row for batch in good for row in batch])
    assert app_state(ingested) == app_state(direct)
    assert [batch for _, batch, *_ in ledger(ingested)] == [0, 1, 2]
    letters = dead_letters(ingested)
    assert len(letters) == len(poison) and {batch for _, batch, _, _ in letters} == {0}
    by_line = {}
    for _, _, reason, raw in letters:
        line = raw.get("_corrupt_record")
        by_line[line if line is not None else raw["seq"]] = reason
    assert "NUL character" in by_line[50]
    assert "PostgreSQL refused this event's writes at the commit" in by_line[51]
    assert by_line[poison[2]].startswith("malformed JSON:")
    assert "field 'amount' is 'many' (str), which does not fit the stream's schema (amount int32)" in by_line[poison[3]]
    assert "field 'ts' is 'not a time' (str)" in by_line[poison[4]]
    assert "not an object" in by_line[poison[5]]
    assert not any("is null" in reason for reason in by_line.values())


def _run_the_source_activedb_run_builds(spark, database, source, name, checkpoint) -> None:
    """The JSON files in ``source`` read as ``activedb run --source file:`` reads them (``build_stream``: the lines
    parsed with ``from_json``, each kept in ``_line``, Spark's corrupt-record column), ingested to the end."""
    from spark_bridge._sources import build_stream, parse_source

    loaded = spark_bridge.load_app(str(app_counters.__file__), require_mapping=True)
    frame = build_stream(spark, parse_source(f"file:{source}"), loaded, file_format="json", max_files_per_trigger=1,
                         rows_per_second=1, event_types=[])
    query = spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name=name,
                                checkpoint_location=str(checkpoint), trigger={"availableNow": True})
    run_to_end(query)


@pytest.mark.spark
def test_lone_surrogates_through_spark_are_dead_letters_not_question_marks(spark, tmp_path, databases):
    """Spark's string conversion turns a lone surrogate escape into '?': its own JSON reader delivers a value
    no one sent.  The source ``activedb run`` builds keeps each line (``_line``), so such a row is a dead letter
    naming the field, with its line; a surrogate pair, a real '?' and a lone surrogate in a field the schema
    does not read are applied."""
    ingested, direct = databases
    rows = [_row(1, "k\ud800lone"), _row(2, "k\udc00low"), _row(3, "k\U0001F600pair"), _row(4, "k?real"),
            {**_row(5, "k1"), "note": "\ud83d"}]
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-000.json").write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")   # \\ud800 escapes

    delivered = spark.read.schema(app_counters.SCHEMA).json(str(source)).toArrow().column("key").to_pylist()
    assert delivered == ["k?lone", "k?low", "k\U0001F600pair", "k?real", "k1"]      # what Spark alone makes of them

    _run_the_source_activedb_run_builds(spark, ingested, source, "surrogates", tmp_path / "checkpoint")

    apply_directly(direct, [rows[2], rows[3], rows[4]])
    assert app_state(ingested) == app_state(direct)
    assert ledger(ingested)[0][2:] == (3, 2)
    letters = deadletters.select(ingested)
    assert [letter.reason.split(" holds")[0] for letter in letters] == ["field 'key'", "field 'key'"]
    assert [json.loads(letter.row().column("_line")[0].as_py())["key"] for letter in letters] == [
        "k\ud800lone", "k\udc00low"]


@pytest.mark.spark
def test_the_letters_of_a_source_activedb_run_builds_keep_the_application_s_columns_and_the_line_only_as_evidence(
        spark, tmp_path, databases):
    """The source ``activedb run`` builds adds two columns of its own: ``_corrupt_record`` (Spark's) and ``_line``
    (the row's line).  Every letter kept both in its row — ``_line`` beside the columns it was parsed into,
    ``_corrupt_record: null`` — noise in ``dead-letters show``, columns the application never had (a plain
    ``ingest`` of the same file has neither).  A letter's row is the application's columns; the corrupt-record
    column only where it holds the unreadable line, ``_line`` only where it is the evidence the parsed columns lose
    (a lone surrogate Spark made '?'): a replay of such a letter is rejected again."""
    ingested, _ = databases
    lines = [json.dumps(_row(1, "k1", amount=-5)),           # rejected by a rule
             json.dumps(_row(2, "")),                         # rejected by validation: an empty key
             '{"type": "add", "key": ',                       # malformed
             json.dumps(_row(4, "k\ud800lone")),              # a lone surrogate: the line is the evidence
             json.dumps(_row(5, "k5"))]
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-000.json").write_text("\n".join(lines) + "\n")
    _run_the_source_activedb_run_builds(spark, ingested, source, "columns", tmp_path / "checkpoint")

    letters = {letter.reason.split(" ")[0] + " " + letter.reason.split(" ")[1]: letter
               for letter in deadletters.select(ingested)}
    application = ["type", "key", "ts", "amount", "seq"]
    columns = {reason: (letter.row().column_names, sorted(letter.raw)) for reason, letter in letters.items()}
    assert columns == {
        "rejected by": (application, sorted(application)),
        "key ('key')": (application, sorted(application)),
        "malformed JSON:": ([*application, "_corrupt_record"], sorted([*application, "_corrupt_record"])),
        "field 'key'": ([*application, "_line"], sorted([*application, "_line"]))}, columns
    assert letters["malformed JSON:"].raw["_corrupt_record"] == lines[2]
    assert json.loads(letters["field 'key'"].row().column("_line")[0].as_py())["key"] == "k\ud800lone"
