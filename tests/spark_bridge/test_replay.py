"""``activedb dead-letters replay APP``: dead letters go back through the same path as a micro-batch
(``IngestSink.process``), exactly once — without Spark, on real PostgreSQL."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from activedb.cli import main
from spark_bridge import IngestSink
from activedb.ingest import replay_dead_letters
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_database, ledger

APP = str(Path(app_counters.__file__).resolve())


def event(seq: int, *, kind: str = "add", amount: int = 1) -> dict:
    return {"type": kind, "key": "k", "ts": BASE_TIME + dt.timedelta(seconds=seq), "amount": amount, "seq": seq}


def letters(database) -> list[dict]:
    with database.engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(sa.text(
            "SELECT id, query_id, batch_id, reason, raw, replayed_at, replay_query_id FROM activedb_dead_letters "
            "ORDER BY id"))]


def total(database) -> int:
    with database.engine.connect() as connection:
        return connection.execute(sa.text("SELECT total FROM counters WHERE key = 'k'")).scalar()


@pytest.fixture()
def url(make_database_url, request):
    return make_database_url(request.node.name[5:40])


def test_replay_applies_a_dead_letter_once_and_marks_it(url):
    database = app_database(url)
    try:
        sink = IngestSink(database, app_counters.MAPPING, query_name="badges")
        sink.process([event(1, amount=5), event(2, kind="sub", amount=50), {**event(3), "type": "nope"}], 0,
                     query_id="badges@00000000-0000-0000-0000-00000000000a")
        by_kind = {"apply_sub" in letter["reason"]: letter for letter in letters(database)}
        overdrawn, unknown = by_kind[True], by_kind[False]
        assert "rejected by rule 'apply_sub'" in overdrawn["reason"] and total(database) == 5
        sink.process([event(4, amount=100)], 1, query_id="badges@00000000-0000-0000-0000-00000000000a")
    finally:
        database.close()

    runner = CliRunner()
    result = runner.invoke(main, ["--url", url, "dead-letters", "replay", APP, "--query", "badges"],
                           catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "replayed 2 dead letter(s) as replay:badges: 1 applied, 1 rejected again" in result.output

    database = app_database(url)
    try:
        assert total(database) == 55                         # 5 + 100 - 50: the subtraction now applied
        after = {letter["id"]: letter for letter in letters(database)}
        assert after[overdrawn["id"]]["replayed_at"] is not None
        assert after[overdrawn["id"]]["replay_query_id"] == "replay:badges"
        assert after[unknown["id"]]["replayed_at"] is not None
        [again] = [letter for letter in after.values() if letter["query_id"] == "replay:badges"]
        assert again["batch_id"] == unknown["id"] and again["replayed_at"] is None   # rejected again: a new letter
        assert ("replay:badges", overdrawn["id"], 1, 0) in ledger(database)

        # Exactly once: the same letters again change nothing, through the CLI and below it.
        second = runner.invoke(main, ["--url", url, "dead-letters", "replay", APP, "--id", str(overdrawn["id"])],
                               catch_exceptions=False)
        assert "no dead letters to replay match" in second.output
        loaded = _loaded_app()
        outcomes = replay_dead_letters(database, loaded, [overdrawn])
        assert [outcome.outcome for outcome in outcomes] == ["already replayed"]       # the ledger has it
        renamed = {**overdrawn, "query_id": "elsewhere@00000000-0000-0000-0000-00000000000b"}
        outcomes = replay_dead_letters(database, loaded, [renamed])
        assert [outcome.outcome for outcome in outcomes] == ["already replayed"]       # the mark has it
        assert total(database) == 55
    finally:
        database.close()


def _loaded_app():
    import spark_bridge

    return spark_bridge.load_app(APP, require_mapping=True)


def test_replay_refuses_an_app_that_declares_no_rule_and_marks_nothing(url, tmp_path):
    """``dead-letters replay APP`` with an application whose register(db) declares no rule and that names its
    KNOWN_TYPES (so the rule path's "no enabled rule listens" check does not speak): the first letter was refused by
    the ingestion (NoRuleRegistered) advising to run the application with activedb's command (activedb run APP, …) —
    not the command the user ran, nor what is wrong.  It is refused once register(db) returned, in one line naming
    the application, and no letter is replayed."""
    database = app_database(url)
    try:
        sink = IngestSink(database, app_counters.MAPPING, query_name="badges")
        sink.process([event(1, kind="sub", amount=50)], 0, query_id="badges@00000000-0000-0000-0000-00000000000b")
        [letter] = letters(database)
    finally:
        database.close()
    app = tmp_path / "ruleless_replay.py"
    app.write_text("from tests.spark_bridge.app_counters import MAPPING\n\nKNOWN_TYPES = {'add', 'sub'}\n\n\n"
                   "def register(db):\n    pass\n")
    result = CliRunner().invoke(main, ["--url", url, "dead-letters", "replay", str(app), "--query", "badges"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert (f"activedb: error: {app}: register(db) declared no rule, and a replay sends the letters to the rules (it "
            f"has no QUERIES, and no EXECUTOR = 'tpg'): every batch would be refused (NoRuleRegistered); nothing was applied") in text, text
    database = app_database(url)
    try:
        assert [entry["replayed_at"] for entry in letters(database)] == [None], letters(database)
    finally:
        database.close()


def test_replay_sends_a_tpg_apps_letters_to_its_executor(url):
    """An application whose batches go to the TPG executor (``EXECUTOR = "tpg"``, ``app_ledger``: no rules): its
    dead letters (a transfer the balance refused) were refused by ``dead-letters replay APP`` — "register(db)
    declared no rule, and a replay sends the letters to the rules" — so they could not be replayed at all.  A replay
    goes through the application's own handler now: once the balance allows the transfer, it applies."""
    import activedb
    from activedb.batch import TpgHandler
    from activedb.ingest import feed
    from tests.spark_bridge import app_ledger

    ledger_app = str(Path(app_ledger.__file__).resolve())
    database = activedb.connect(url)
    try:
        database.upgrade_app(app_ledger.MIGRATIONS)
        app_ledger.reset(database)
        row = {name: None for name in app_ledger.PAYLOAD}
        transfer = {**row, "type": "transfer", "k": "sl", "ts": 1.0, "src_account": 1, "dst_account": 2,
                    "src_asset": 1, "dst_asset": 2, "amount": 1000}
        feed(database, [[transfer]], source="ledger", mapping=app_ledger.MAPPING,
             handler=TpgHandler(app_ledger.TRANSACTIONS()))
        [letter] = letters(database)
        assert "insufficient" in letter["reason"], letter
        deposit = {**row, "type": "deposit", "k": "sl", "ts": 2.0, "account": 1, "asset": 1, "amount": 1000}
        feed(database, [[deposit]], source="deposits", mapping=app_ledger.MAPPING,
             handler=TpgHandler(app_ledger.TRANSACTIONS()))
    finally:
        database.close()

    result = CliRunner().invoke(main, ["--url", url, "dead-letters", "replay", ledger_app, "--query", "ledger"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, text
    assert "replayed 1 dead letter(s) as replay:ledger: 1 applied" in text, text
    database = activedb.connect(url)
    try:
        state = app_ledger.stored_state(database)
        assert state[("tpg_accounts", 1)]["balance"] == 400 and state[("tpg_accounts", 2)]["balance"] == 1400, state
        assert [entry["replayed_at"] is not None for entry in letters(database)] == [True], letters(database)
    finally:
        database.close()


QUERIES_APP = '''\
from activedb import streams
from tests.spark_bridge.app_counters import MAPPING, MIGRATIONS, Overdrawn


def _apply(sign):
    def apply(tx, new):
        row = tx.read("counters", new["key"]) or {"total": 0, "events": 0, "trail": ""}
        total = row["total"] + sign * new["amount"]
        if total < 0:
            raise Overdrawn(f"{new['key']}: {row['total']} - {new['amount']} < 0")
        trail = f"{row['trail']},{new['seq']}" if row["trail"] else str(new["seq"])
        tx.write("counters", new["key"], total=total, events=row["events"] + 1, trail=trail, last_ts=new.ts)
    return apply


def QUERIES(db, scheduler=None):
    engine = streams.StreamEngine(db, name="counting", record_dead_letters=False)
    engine.create_stream("badges", types=["add", "sub"], attributes=["key", "amount", "seq"])
    for kind, sign in (("add", 1), ("sub", -1)):
        seen = streams.event(kind)
        engine.query(f"SEEN_{kind}", stream="badges", pattern=streams.seq(kind),
                     returns=[seen["key"], seen["amount"], seen["seq"]])
        engine.rule(f"apply_{kind}", on_output=f"SEEN_{kind}", action=_apply(sign), reads=["counters"],
                    writes=["counters"])
    return engine


def register(db):
    pass
'''


def test_replay_refuses_a_queries_app_and_marks_nothing(url, tmp_path):
    """An application whose batches go to its pattern queries (``QUERIES``, no rules): a subtraction its query's
    rule refused (overdrawn) is a dead letter.  ``dead-letters replay APP`` sent it through the application's
    queries, whose engine had released a punctuation past it: it was rejected again as late — a new dead letter —
    and the letter marked replayed, each time.  The replay is refused up front now, saying why, and nothing is
    marked."""
    from activedb.ingest import Batch, feed
    from activedb.streams import QueriesHandler

    app = tmp_path / "counting_queries.py"
    app.write_text(QUERIES_APP)
    loaded = spark_bridge_load(str(app))
    database = app_database(url)
    try:
        watermark = BASE_TIME + dt.timedelta(minutes=1)
        feed(database, [Batch(0, [event(1, kind="sub", amount=50), event(2, amount=100)], watermark=watermark)],
             source="badges", mapping=loaded.mapping, handler=QueriesHandler(loaded.queries))
        [letter] = letters(database)
        assert "rule apply_sub raised Overdrawn: k: 0 - 50 < 0" in letter["reason"], letter
        assert total(database) == 100
    finally:
        database.close()

    result = CliRunner().invoke(main, ["--url", url, "dead-letters", "replay", str(app), "--query", "badges"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text
    assert (f"activedb: error: {loaded.name}: its batches go to its pattern queries (QUERIES), which take events in "
            f"time order, and its engines have already released a punctuation past each letter's event: a replay "
            f"would reject every letter again as late") in text, text
    assert "nothing was replayed" in text, text
    database = app_database(url)
    try:
        assert [(entry["id"], entry["replayed_at"]) for entry in letters(database)] == [(letter["id"], None)]
        assert total(database) == 100
    finally:
        database.close()


def spark_bridge_load(path: str):
    import spark_bridge

    return spark_bridge.load_app(path, require_mapping=True)


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_replay_logs_what_the_rules_reject_again_on_the_console_only_with_verbose_and_leaves_the_log_as_it_was(
        url, verbose):
    """``--verbose``: "Also log each event the rules reject again" — on the console (activedb's log file has them
    either way); without it the rules' log is quiet.  Either way the rules' log is as it was once the command ended
    (its level, its handlers): the command may run in another program's process, as here in ``CliRunner``'s."""
    import logging

    database = app_database(url)
    try:
        sink = IngestSink(database, app_counters.MAPPING, query_name="badges")
        sink.process([event(1, amount=5), event(2, kind="sub", amount=50)], 0,
                     query_id="badges@00000000-0000-0000-0000-00000000000a")
    finally:
        database.close()
    rules_log = logging.getLogger("activedb.rules")
    before = (rules_log.level, list(rules_log.handlers))
    result = CliRunner().invoke(main, ["--url", url, "dead-letters", "replay", APP, *(["--verbose"] * verbose)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "replayed 1 dead letter(s) as replay:badges: 1 rejected again" in result.output, result.output
    assert ("rule 'apply_sub' failed on" in result.output) is verbose, result.output
    assert (rules_log.level, list(rules_log.handlers)) == before
