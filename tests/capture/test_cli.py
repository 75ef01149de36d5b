"""``activedb capture status|enable|disable|consume|drop-consumer`` (in-process, through click's runner)."""

from __future__ import annotations

import json
import os
import signal
import threading

import psycopg
import pytest
from click.testing import CliRunner

import activedb
from activedb.cli import main
from tests.capture import _app
from tests.capture.conftest import MIGRATIONS, capture_orders, consume_process, libpq

APP_FILE = _app.__file__


def test_capture_commands_show_the_backlog_and_consume_it(database_url):
    database = activedb.connect(database_url)
    database.upgrade_app(MIGRATIONS, "c0001")        # tables, not yet captured
    database.close()
    runner = CliRunner()

    def cli(*args: str):
        result = runner.invoke(main, ["--url", database_url, "capture", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    assert "no table is captured" in cli("status")
    assert "capturing orders" in cli("enable", "orders")
    _app.run_workload(libpq(database_url), _app.workload(seed=3, transactions=6))
    output = cli("status")
    assert "orders" in output and "no consumer" in output
    overall = runner.invoke(main, ["--url", database_url, "status"], catch_exceptions=False)
    assert overall.exit_code == 0, overall.output      # `activedb status` shows the backlog too
    assert "change capture (1 captured table(s)" in overall.output and "changes and no consumer" in overall.output
    document = json.loads(cli("status", "--json"))
    pending = document["unconsumed"][0]["changes"]
    assert document["tables"][0]["name"] == "orders" and pending > 0 and document["warnings"]

    output = cli("consume", APP_FILE, "--until-caught-up", "--batch-size", "4")
    assert f"handled {pending:,} changes" in output
    document = json.loads(cli("status", "--json", "--behind-changes", "0"))
    [consumer] = document["consumers"]
    assert consumer["name"] == "default" and consumer["handled"] == pending and not consumer["behind"]
    assert document["warnings"] == []

    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (9999, 'late', 1)")
    document = json.loads(cli("status", "--json", "--behind-changes", "0"))
    assert document["consumers"][0]["behind"] and "far behind" in document["warnings"][0]
    assert "BEHIND" in cli("status", "--behind-changes", "0")

    # consume upgraded the app's migrations (_app.MIGRATIONS), whose head captures typed_samples too.  Disabling drops
    # the late order no consumer has handled: it asks first (refused without a terminal unless --yes).
    refused = runner.invoke(main, ["--url", database_url, "capture", "disable", "orders", "typed_samples"])
    assert refused.exit_code == 1 and "drop 1 pending change (orders: 1;" in refused.output, refused.output
    assert "no longer capturing orders (1 pending change dropped)" in cli("disable", "orders", "typed_samples", "--yes")
    assert "no table is captured" in cli("status")


def test_consume_names_a_missing_application_clearly(database_url):
    result = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", "no_such_app_module"])
    assert result.exit_code == 1 and "no module named 'no_such_app_module'" in result.output


def test_enable_and_disable_check_every_table_before_changing_any(database_url):
    """A name that is not a table (enable) or not a captured table (disable) is an error that changes nothing —
    not the tables named before it, and not a "no longer capturing" of a typo."""
    database = activedb.connect(database_url)
    database.upgrade_app(MIGRATIONS, "c0001")        # tables, not yet captured
    runner = CliRunner()

    def cli(*args: str):
        return runner.invoke(main, ["--url", database_url, "capture", *args])

    try:
        result = cli("enable", "orders", "no_such_table")
        assert result.exit_code == 1 and "no table 'no_such_table'" in result.output, result.output
        assert not database.capture.is_captured("orders")
        assert cli("enable", "orders").exit_code == 0
        result = cli("disable", "oders")
        assert result.exit_code == 1 and "'oders' is not captured (captured: orders)" in result.output, result.output
        result = cli("disable", "orders", "typed_samples")
        assert result.exit_code == 1 and "'typed_samples' is not captured" in result.output, result.output
        assert database.capture.is_captured("orders")
    finally:
        database.capture.remove("orders")
        database.close()


def test_capture_commands_follow_the_schema_rule_and_never_upgrade_activedbs_tables(make_database_url):
    """Only `activedb db upgrade` changes activedb's own schema (`activedb --help`): `capture status` on a database
    without activedb's tables says so and creates none."""
    url = make_database_url("no_schema")
    result = CliRunner().invoke(main, ["--url", url, "capture", "status"])
    assert result.exit_code == 1 and "has no activedb tables yet" in result.output, result.output
    with psycopg.connect(libpq(url)) as connection:
        assert connection.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def test_a_negative_threshold_of_capture_status_is_a_usage_error(database_url):
    result = CliRunner().invoke(main, ["--url", database_url, "capture", "status", "--behind-changes", "-1"])
    assert result.exit_code == 2 and "-1 is not in the range x>=0" in result.output, result.output


def test_a_negative_lead_timeout_of_capture_consume_is_a_usage_error(database_url):
    """``--lead-timeout -5`` was taken, and silently meant "do not wait" (the consumer waits only above 0)."""
    result = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", APP_FILE, "--until-caught-up",
                                       "--lead-timeout", "-5"])
    assert result.exit_code == 2 and "--lead-timeout" in result.output, result.output
    assert "-5.0 is not in the range x>=0" in result.output, result.output


def test_consume_finds_an_applications_relative_migrations_next_to_its_file(database_url, tmp_path, monkeypatch):
    """``MIGRATIONS = 'migrations'`` is relative to the application's file, as ``activedb run`` and ``dead-letters
    replay`` read it: ``capture consume`` looked for it in the current directory, so run from anywhere else it failed
    ('no Alembic environment at migrations') — or upgraded another application's directory of that name there."""
    from activedb import _migrate

    home = tmp_path / "shop"
    home.mkdir()
    _migrate.init_app(home / "migrations", "shop")
    (home / "shop_consumer.py").write_text("MIGRATIONS = 'migrations'\n\n\ndef register(db):\n"      # (a rule: one
                                           "    db.rule(on=db.signalled('shop'))(lambda tx, event: None)\n")  # is needed)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", str(home / "shop_consumer.py"),
                                       "--name", "shop", "--until-caught-up"])
    assert result.exit_code == 0, result.output
    database = activedb.connect(database_url)
    try:
        heads, head = database.schema.app_revision(home / "migrations")
    finally:
        database.close()
    assert heads == [head], (heads, head)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # (the consumer thread's end)
def test_consume_exits_with_the_error_when_its_consumer_thread_dies(database_url, monkeypatch):
    """``capture consume`` (without --until-caught-up) only waited for Ctrl-C/SIGTERM: when the consumer's thread died
    of a database error that is not a lost connection (here a refused privilege on the change table), the command
    went on looking "running" for ever while consuming nothing.  It now stops, exit code 1, naming the error.  (A
    timer stands in for the user's Ctrl-C, so the command ends either way.)  ``orders``, whose captured changes the
    app's rules hear, is captured first: the module's earlier tests stop capturing it, and a rule declared on an
    uncaptured table warns (``CaptureNotEnabledWarning``, twice) — not what this test is about."""
    import sqlalchemy as sa

    from activedb.capture._fetch import ChangeReader
    from activedb.cli.running import StopRequest

    database = activedb.connect(database_url)
    try:
        database.upgrade_app(MIGRATIONS)      # the app's tables (consume upgrades them too)
        database.capture("orders")            # (idempotent)
    finally:
        database.close()

    refused = psycopg.errors.InsufficientPrivilege("permission denied for table activedb_capture_changes")

    def fetch(self, start, limit):
        raise sa.exc.ProgrammingError("SELECT … FROM activedb_capture_changes", {}, refused)

    monkeypatch.setattr(ChangeReader, "fetch", fetch)
    install = StopRequest.install
    timers: list[threading.Timer] = []

    def install_with_a_deadline(self: StopRequest) -> None:
        install(self)
        timers.append(threading.Timer(30.0, self.event.set))     # the user's Ctrl-C, later
        timers[-1].start()

    monkeypatch.setattr(StopRequest, "install", install_with_a_deadline)
    try:
        result = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", APP_FILE, "--name", "dies"])
    finally:
        for timer in timers:
            timer.cancel()
    assert result.exit_code == 1, result.output
    assert "activedb: error: capture consumer 'dies' stopped" in result.output
    assert "permission denied for table activedb_capture_changes" in result.output


@pytest.mark.parametrize("option, value, refusal", [("--batch-size", "0", "0 is not in the range x>=1"),
                                                    ("--batch-size", "-5", "-5 is not in the range x>=1"),
                                                    ("--retention", "-1", "-1.0 is not in the range x>=0")])
def test_a_batch_size_or_retention_out_of_range_is_a_usage_error_before_anything_is_written(make_database_url, option,
                                                                                            value, refusal):
    """``capture consume APP --batch-size 0`` (or a negative retention) was refused by the consumer — after the
    command had created activedb's tables in a new database, upgraded the application's and persisted its rules.
    It is click's usage error now (exit 2), and the database is as it was."""
    url = make_database_url(f"consume_options_{value.lstrip('-')}")
    result = CliRunner().invoke(main, ["--url", url, "capture", "consume", APP_FILE, "--until-caught-up", option,
                                       value])
    assert result.exit_code == 2 and option in result.output and refusal in result.output, result.output
    with psycopg.connect(libpq(url)) as connection:
        assert connection.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def test_a_metrics_port_that_is_no_port_is_a_usage_error_before_anything_is_written(make_database_url):
    """``capture consume APP --metrics-port notaport`` was refused only when the exporter started — after the
    command had created activedb's tables in a new database and upgraded the application's (exit 1).  It is click's
    usage error now (exit 2), and the database is as it was."""
    url = make_database_url("consume_metrics_notaport")
    result = CliRunner().invoke(main, ["--url", url, "capture", "consume", APP_FILE, "--until-caught-up",
                                       "--metrics-port", "notaport"])
    assert result.exit_code == 2 and "--metrics-port" in result.output, result.output
    assert "give a port (e.g. 9464) or ADDRESS:PORT" in result.output, result.output
    with psycopg.connect(libpq(url)) as connection:
        assert connection.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


STUCK_APP = '''"""A rule on captured orders that never returns (it says so first)."""
import threading


def register(db):
    @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
    def never_returns(tx, event):
        print("in the rule", flush=True)
        threading.Event().wait()
'''


def test_a_second_ctrl_c_ends_consume_at_once_while_a_rule_never_returns(database_url, tmp_path):
    """``capture consume`` whose rule never returns: the first Ctrl-C says it lets the batch in progress finish and
    that Ctrl-C again stops at once; the second ends the process at once (exit 130), the change still pending, as
    `activedb run` does.  The second Ctrl-C did nothing — the command waited for the consumer's thread 30 s, then
    30 s more as the database closed, and exited 1 ("did not stop within 30.0 s")."""
    from activedb.testing import wait_until

    capture_orders(database_url)
    app_file = tmp_path / "stuck_app.py"
    app_file.write_text(STUCK_APP)
    with consume_process(database_url, tmp_path, str(app_file), "--name", "stuck", "--rule-deadline", "0",
                         "--batch-deadline", "0") as consume:
        wait_until(consume.printed("running (Ctrl-C stops)"), 120, "the consumer to start", describe=consume.text)
        with psycopg.connect(libpq(database_url), autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (77001, 'stuck', 1)")
        wait_until(consume.printed("in the rule"), 60, "the rule to run", describe=consume.text)
        consume.interrupt()
        wait_until(consume.printed("Ctrl-C again to stop at once"), 60, "the first stop", describe=consume.text)
        assert "stopping: letting batch" in consume.text(), consume.text()
        consume.interrupt()
        assert consume.process.wait(timeout=20) == 130, consume.text()
        assert "stopped at once" in consume.text(), consume.text()
    document = json.loads(CliRunner().invoke(main, ["--url", database_url, "capture", "status", "--json"]).output)
    [stuck] = [consumer for consumer in document["consumers"] if consumer["name"] == "stuck"]
    assert stuck["handled"] == 0 and stuck["tables"][0]["changes"] == 1, stuck


HANGING_APP = '''"""A rule on captured orders that never returns on the order of customer 'hangs' and logs the others."""
import threading


def register(db):
    @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
    def hangs_on_one(tx, event):
        if event.new["customer"] == "hangs":
            threading.Event().wait()
        tx.insert("order_log", rule="hangs_on_one", kind="inserted", order_id=event.key)
'''


def test_consume_gives_up_a_rule_past_its_deadline_dead_letters_its_change_and_restarts_to_apply_the_next(
        database_url, tmp_path):
    """``capture consume --rule-deadline`` (as `activedb run` takes it, 60 s by default): a rule that never returns
    fails its batch at the deadline, its change becomes a dead letter, and the command restarts itself and applies
    the batch without it — the next change included — then exits caught up.  There was no such option: the rule held
    the consumer until a second Ctrl-C."""
    import os
    import subprocess
    import sys

    capture_orders(database_url)
    app_file = tmp_path / "hanging_app.py"
    app_file.write_text(HANGING_APP)
    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (78001, 'hangs', 1), (78002, 'next', 1)")
    done = subprocess.run(
        [sys.executable, "-m", "activedb.cli", "--url", database_url, "capture", "consume", str(app_file), "--name",
         "deadline", "--until-caught-up", "--rule-deadline", "1"], capture_output=True, text=True, timeout=300,
        check=False,
        env={**os.environ, "ACTIVEDB_HOME": str(tmp_path / "home")}, start_new_session=True)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "rule 'hangs_on_one' did not return within its deadline of 1 s" in said, said
    assert "restarting this command (1 of at most 3" in said, said
    assert "activedb run" not in said, said         # the deadline's message names no other command
    assert "capture consumer 'deadline': handled" in said, said
    with psycopg.connect(libpq(database_url)) as connection:
        logged = connection.execute("SELECT order_id FROM order_log WHERE rule = 'hangs_on_one' AND order_id IN "
                                    "(78001, 78002)").fetchall()
        letters = connection.execute("SELECT reason, raw->>'key' FROM activedb_dead_letters WHERE query_id = "
                                     "'capture:deadline'").fetchall()
    assert logged == [(78002,)]
    [(reason, key)] = letters
    assert "did not return within its deadline of 1 s" in reason and key == "78001", letters


MAPPED_APP = '''"""An application with a mapping (as `activedb run` takes) whose rule on captured orders raises."""
from activedb.ingest import EventMapping

MAPPING = EventMapping(type_column="type", key_column="key", ts_column="ts")


def register(db):
    @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
    def refuse(tx, event):
        raise ValueError("not today")
'''


def test_replaying_a_dead_letter_of_change_capture_is_refused_and_marks_nothing(database_url, tmp_path):
    """A captured change a rule rejected is a dead letter of capture:NAME that keeps the change's description, not a
    row a mapping reads.  `dead-letters replay APP --query capture:NAME` fed that description through APP's mapping:
    the letter was marked replayed (and left the default `dead-letters list`) and a new letter "event type ('type')
    is missing" was written.  It is refused, saying why, and nothing is replayed or marked."""
    capture_orders(database_url)
    app_file = tmp_path / "mapped_app.py"
    app_file.write_text(MAPPED_APP)
    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (88001, 'refused', 1)")
    consumed = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", str(app_file), "--name",
                                         "refusing", "--until-caught-up"])
    assert consumed.exit_code == 0, consumed.output

    def letters() -> list[dict]:
        listed = CliRunner().invoke(main, ["--url", database_url, "dead-letters", "list", "--all", "--json"])
        return json.loads(listed.output)

    # (every order still retained is refused: the module's earlier tests' too, which this new consumer reads)
    ids = [letter["id"] for letter in letters() if letter["query_id"] == "capture:refusing"]
    assert ids, letters()
    replayed = CliRunner().invoke(main, ["--url", database_url, "dead-letters", "replay", str(app_file), "--query",
                                         "capture:refusing"])
    assert replayed.exit_code == 1, replayed.output
    named = f"dead letters {', '.join(map(str, ids))} are" if len(ids) > 1 else f"dead letter {ids[0]} is"
    assert f"{named} change capture's (capture:refusing)" in " ".join(replayed.output.split()), replayed.output
    assert "cannot be replayed" in replayed.output and "nothing was replayed" in replayed.output, replayed.output
    after = letters()
    assert [entry["replayed_at"] for entry in after if entry["id"] in ids] == [None] * len(ids)
    assert not [entry for entry in after if entry["query_id"] == "replay:capture:refusing"]


def test_a_consumer_far_behind_says_how_to_forget_it_and_drop_consumer_asks_first(make_database_url):
    """The "far behind" warning said to check that the consumer runs, not how to forget one that no longer runs and
    holds back pruning — and no command did: only ``db.capture.drop_consumer(NAME)`` from Python.  The warning names
    both; ``activedb capture drop-consumer NAME`` asks first (refuses without a terminal unless --yes), refuses a name
    no consumer has, and drops the consumer with --yes."""
    url = make_database_url("drop_consumer")
    database = activedb.connect(url)
    database.upgrade_app(MIGRATIONS, "c0001")
    database.close()
    runner = CliRunner()

    def cli(*args: str, code: int = 0) -> str:
        result = runner.invoke(main, ["--url", url, "capture", *args])
        assert result.exit_code == code, result.output
        return result.output

    cli("enable", "orders")
    cli("consume", APP_FILE, "--name", "gone", "--until-caught-up")
    _app.run_workload(libpq(url), _app.workload(seed=4, transactions=3))
    [warning] = json.loads(cli("status", "--json", "--behind-changes", "0"))["warnings"]
    assert "'gone' is far behind" in warning, warning
    assert "db.capture.drop_consumer('gone')" in warning and "activedb capture drop-consumer gone" in warning, warning

    refused = cli("drop-consumer", "gone", code=1)
    assert "refusing without confirmation: pass --yes" in refused, refused
    assert "no capture consumer named 'elsewhere'" in cli("drop-consumer", "elsewhere", "--yes", code=1)
    assert [c["name"] for c in json.loads(cli("status", "--json"))["consumers"]] == ["gone"]
    assert "dropped capture consumer 'gone'" in cli("drop-consumer", "gone", "--yes")
    assert json.loads(cli("status", "--json"))["consumers"] == []


def test_consume_refuses_an_app_that_declares_no_rule_before_it_consumes(database_url, tmp_path):
    """``capture consume APP`` with an application whose register(db) declares no rule: the first batch was refused
    (NoRuleRegistered) saying to run the application with `activedb capture consume APP` — the command the user ran;
    with nothing pending it said "handled 0 changes" (--until-caught-up) or ran on, consuming nothing, until the first
    change stopped it.  It is refused once register(db) returned, before the consumer reads: one line, exit 1, and
    the changes stay pending for a consumer of the name with rules."""
    capture_orders(database_url)
    app_file = tmp_path / "ruleless_consumer.py"
    app_file.write_text("def register(db):\n    pass\n")
    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (88101, 'norules', 1)")
    result = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", str(app_file), "--name",
                                       "norules", "--until-caught-up"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert (f"activedb: error: {app_file}: register(db) declared no rule, and a capture consumer runs rules on the "
            f"changes: every batch would be refused (NoRuleRegistered); nothing was applied") in text, text
    assert "Traceback" not in result.output
    consumed = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", APP_FILE, "--name", "norules",
                                         "--until-caught-up"])
    assert consumed.exit_code == 0 and "handled 0 changes" not in consumed.output, consumed.output


def test_consume_says_when_every_rule_of_its_app_is_disabled(database_url):
    """With every rule of the application disabled (``activedb rules disable``, the operator's choice), ``capture
    consume`` consumes the changes with no rule run on them, and said nothing of it: its line "handled N changes"
    read as a run of the rules.  It says so first now, naming the command that enables them."""
    capture_orders(database_url)
    database = activedb.connect(database_url)
    try:
        _app.register(database)
        names = database.rules.names()
        for name in names:
            database.rules.disable(name)
    finally:
        database.close()
    try:
        result = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", APP_FILE, "--name",
                                           "alldisabled", "--until-caught-up"])
    finally:
        database = activedb.connect(database_url)
        try:
            for name in names:
                database.rules.enable(name)
        finally:
            database.close()
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert (f"{APP_FILE}: all {len(names)} of its rules are disabled: its batches apply with no rule run on their "
            f"events, recorded as done (activedb rules enable NAME)") in text, text


def test_a_retention_of_inf_keeps_every_consumed_change(make_database_url):
    """``capture consume APP --retention inf``, which its help gives as "for ever" (and ``retention=math.inf`` of the
    Python API is), was refused as "no finite number of seconds" (exit 2).  Now the changes are consumed and kept;
    NaN is still a usage error."""
    url = make_database_url("consume_retention_inf")
    capture_orders(url)
    _app.run_workload(libpq(url), _app.workload(seed=5, transactions=4))
    with psycopg.connect(libpq(url)) as connection:
        changes = connection.execute("SELECT count(*) FROM activedb_capture_changes").fetchone()[0]
    assert changes > 0
    result = CliRunner().invoke(main, ["--url", url, "capture", "consume", APP_FILE, "--until-caught-up",
                                       "--retention", "inf"])
    assert result.exit_code == 0 and f"handled {changes:,} changes" in result.output, result.output
    with psycopg.connect(libpq(url)) as connection:
        assert connection.execute("SELECT count(*) FROM activedb_capture_changes").fetchone() == (changes,)
    refused = CliRunner().invoke(main, ["--url", url, "capture", "consume", APP_FILE, "--until-caught-up",
                                        "--retention", "nan"])
    assert refused.exit_code == 2 and "nan is no number of seconds (inf: for ever)" in refused.output, refused.output


def _leaders_of(database_url: str, name: str) -> list[int]:
    """The backends that hold consumer ``name``'s leadership lock now (``pg_locks``: the lock of its row's id)."""
    from activedb.capture import _sql

    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        return [pid for (pid,) in psql.execute(
            f"SELECT l.pid FROM pg_locks l JOIN {_sql.CONSUMERS} k ON l.objid = k.id::oid WHERE l.locktype = "
            f"'advisory' AND l.classid = %s AND l.objsubid = 2 AND l.granted AND k.name = %s",
            (_sql.CONSUMER_LOCK_CLASS, name)).fetchall()]


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_consumer_stopped_by_a_signal_releases_its_lead_so_the_next_leads_at_once(database_url, tmp_path,
                                                                                     stop_signal):
    """``capture consume`` ended by SIGTERM (as a service manager stops it) or Ctrl-C gives up its name's leadership
    before it exits: the next consumer of the name leads at once, never standing by behind the one that ended.  (A
    SIGKILL'd one's lock goes when PostgreSQL sees its session end.)"""
    from activedb.testing import wait_until

    capture_orders(database_url)
    name = f"signalled-{stop_signal.name}"
    first_home, second_home = tmp_path / "first", tmp_path / "second"
    first_home.mkdir()
    second_home.mkdir()
    with consume_process(database_url, first_home, APP_FILE, "--name", name) as first:
        wait_until(first.printed("running (Ctrl-C stops)"), 120, "the first consumer to lead", describe=first.text)
        os.killpg(first.process.pid, stop_signal)
        assert first.process.wait(timeout=60) == 0, first.text()
    assert _leaders_of(database_url, name) == [], f"the ended consumer's lead outlived it:\n{first.text()}"
    with consume_process(database_url, second_home, APP_FILE, "--name", name) as second:
        wait_until(lambda: "running (Ctrl-C stops)" in second.text() or "standing by" in second.text(), 120,
                   "the second consumer to lead or stand by", describe=second.text)
        assert "standing by" not in second.text(), second.text()


GATED_APP = '''"""A rule on captured orders that logs each, and on the order of customer 'gated' first waits until the file
GATE exists (saying "in the rule" as it starts waiting)."""
import os
import threading


def register(db):
    @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
    def gated(tx, event):
        if event.new["customer"] == "gated" and not os.path.exists(GATE):
            print("in the rule", flush=True)
            while not os.path.exists(GATE):
                threading.Event().wait(0.05)
        tx.insert("order_log", rule="gated", kind="inserted", order_id=event.key)
'''


def test_sigterm_ends_consume_until_caught_up_as_ctrl_c_does(database_url, tmp_path):
    """``capture consume --until-caught-up`` had no SIGTERM handler: a service manager's ``kill -TERM`` killed it
    (exit -15) wherever it was, as a SIGKILL would.  It now ends as a Ctrl-C does there: exit 130, "activedb:
    interrupted" and no traceback, its name's lead released before it exits, the batch in progress not committed —
    and the next consume handles the pending changes, each once."""
    from activedb.testing import wait_until

    capture_orders(database_url)
    gate = tmp_path / "gate"
    app_file = tmp_path / "gated_app.py"
    app_file.write_text(GATED_APP.replace("GATE", repr(str(gate))))
    first_home, second_home = tmp_path / "first", tmp_path / "second"
    first_home.mkdir()
    second_home.mkdir()
    name = "sigterm-until-caught-up"
    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (79101, 'gated', 1), (79102, 'next', 1)")
    # (no deadline: the rule waits for the test alone)
    deadlines = ("--rule-deadline", "0", "--batch-deadline", "0")
    with consume_process(database_url, first_home, str(app_file), "--name", name, "--until-caught-up",
                         *deadlines) as first:
        wait_until(first.printed("in the rule"), 120, "the rule to run", describe=first.text)
        assert _leaders_of(database_url, name) != [], first.text()
        os.killpg(first.process.pid, signal.SIGTERM)
        assert first.process.wait(timeout=60) == 130, first.text()
    said = first.text()
    assert "activedb: interrupted" in said and "Traceback" not in said, said
    assert _leaders_of(database_url, name) == [], f"the ended consumer's lead outlived it:\n{said}"

    gate.touch()
    with consume_process(database_url, second_home, str(app_file), "--name", name, "--until-caught-up",
                         *deadlines) as second:
        assert second.process.wait(timeout=120) == 0, second.text()
    assert f"capture consumer {name!r}: handled" in second.text(), second.text()   # (and the module's earlier orders)
    with psycopg.connect(libpq(database_url)) as connection:
        logged = connection.execute("SELECT order_id FROM order_log WHERE rule = 'gated' AND order_id IN (79101, "
                                    "79102) ORDER BY order_id").fetchall()
    assert logged == [(79101,), (79102,)], logged


DETACHED_STUCK_APP = '''"""A rule on captured orders signals `stuck` for each of customer 'detached-stuck' (the module's other
tests' orders are captured too: a consumer of a new name sees them all); the detached rule on `stuck` never returns."""
import threading

from activedb import Coupling


def register(db):
    @db.rule(on=db.captured("orders", "inserted"), coupling=Coupling.DETACHED)     # (in the consumer's batch)
    def signals(tx, event):
        if event.new["customer"] == "detached-stuck":
            tx.signal("stuck", order=event.key)

    @db.rule(on=db.signalled("stuck"), coupling=Coupling.DETACHED)
    def never_returns(tx, event):
        threading.Event().wait()
'''


def test_consumes_rule_deadline_gives_up_a_detached_firing_of_its_rules_that_never_returns(database_url, tmp_path):
    """``capture consume --rule-deadline`` timed the firings of its batches only: a detached firing of the
    application's rules (run by the outbox's group runners after the batch committed) that never returned held its
    runner until the process ended, and its record stayed pending.  The command passes the deadline to the outbox
    (``OutboxOptions.rule_deadline``): the firing is given up and its record fails saying so and what to do."""
    from activedb.testing import wait_until

    capture_orders(database_url)
    app_file = tmp_path / "detached_stuck_app.py"
    app_file.write_text(DETACHED_STUCK_APP)
    home = tmp_path / "consumer"
    home.mkdir()
    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (79001, 'detached-stuck', 1)")

    def failed() -> list[tuple[str, str]]:
        with psycopg.connect(libpq(database_url), autocommit=True) as psql:
            return psql.execute("SELECT rule, error FROM activedb_outbox WHERE rule = 'never_returns' AND "
                                "status = 'failed'").fetchall()

    with consume_process(database_url, home, str(app_file), "--name", "detached-deadline",
                         "--rule-deadline", "1") as consumer:
        def given_up() -> bool:
            assert consumer.process.poll() is None, f"consume exited ({consumer.process.returncode}):\n{consumer.text()}"
            return bool(failed())

        wait_until(given_up, 120, "the stuck detached firing to be given up",
                   describe=lambda: f"{consumer.text()}\noutbox: {_outbox_rows(database_url)}")
        os.killpg(consumer.process.pid, signal.SIGINT)
        assert consumer.process.wait(timeout=60) == 0, consumer.text()
    [(rule, error)] = failed()
    assert "rule 'never_returns' did not return within its deadline of 1 s" in error, error
    assert "activedb outbox --retry" in error, error


def _outbox_rows(database_url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        return psql.execute("SELECT id, rule, status, error FROM activedb_outbox ORDER BY id").fetchall()
