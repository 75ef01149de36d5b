"""What a newcomer to change capture met: pruning that kept the last consumed commit for ever, capture's dead letters
(what they keep, and their replay), `capture disable` and `capture consume`'s reports, the status of a consumer on
standby and the latest position once the commits are gone, SQLAlchemy's warning about ``xid8``, and rules on a view.

Writers are raw psycopg connections ("another service"); the rules are ``_app.register``'s unless a test says.
"""

from __future__ import annotations

import json

import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from activedb.capture import Position
from activedb.cli import main
from tests.capture import _app
from tests.capture.conftest import capture_orders, consume_process, leadership_lock, libpq


def retained(db) -> list[tuple[int, int]]:
    """``(commit position, change id)`` of every change the change table still holds, in order."""
    with db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT c.position, ch.id FROM activedb_capture_commits c JOIN activedb_capture_changes ch "
            "ON ch.xid = c.xid ORDER BY c.position, ch.id"))]


def test_the_commit_every_consumer_has_handled_whole_is_pruned_and_nothing_one_has_not(clean, conninfo):
    """Pruning removed the commits *below* the smallest position, so the commit at a consumer's position stayed for
    ever once consumed (and with it its changes).  A consumer's position is a commit and a change of it: a batch may
    end inside a commit, and that commit is not handled whole until no change of it has a larger id.  With two
    consumers, one through a commit and the other halfway in it, nothing of it goes; once both are through, it goes;
    a later commit neither has read stays."""
    db = clean
    _app.register(db)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) SELECT g, 'p', 1 FROM generate_series(1, 4) g")
    whole = db.capture.consumer("whole", batch_size=10, prune_interval=0)
    halfway = db.capture.consumer("halfway", batch_size=3, prune_interval=0)
    try:
        assert halfway.run_once() == 3                  # three of the commit's four changes
        assert whole.run_until_caught_up() == 4         # the whole commit (its round of pruning keeps it)
        [(commit, _), *_, (_, last)] = retained(db)
        assert whole.position == Position(commit, last) and halfway.position == Position(commit, last - 1)
        assert db.capture.prune() == 0 and len(retained(db)) == 4
        assert halfway.run_until_caught_up() == 1       # the fourth: both are through the commit
        assert retained(db) == []                       # (halfway's round of pruning removed it)
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (5, 'p', 1)")
        assert db.capture.prune() == 0 and len(retained(db)) == 1
        assert whole.run_until_caught_up() == 1 and db.capture.prune() == 0      # halfway has not read it
        assert halfway.run_until_caught_up() == 1 and retained(db) == []
    finally:
        whole.close()
        halfway.close()
    with db.engine.connect() as connection:
        logged = connection.execute(sa.text("SELECT order_id FROM order_log WHERE rule = 'log_change' ORDER BY "
                                            "order_id")).scalars().all()
    assert logged == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]     # each change fired each consumer's rule once


REFUSING_APP = '''"""A consumer's application (no MAPPING: it is no `activedb run` app) whose rule on captured orders raises."""


def register(db):
    @db.rule(on=db.captured("orders", "inserted"), coupling="detached")
    def refuse(tx, event):
        raise ValueError("not today")
'''


def _capture_letters(database_url: str, tmp_path, name: str, order_id: int) -> tuple[str, list[int]]:
    """A capture consumer ``name`` whose rule rejects a captured order: its application file and the ids of the dead
    letters of ``capture:<name>``."""
    app_file = tmp_path / f"{name}_app.py"
    app_file.write_text(REFUSING_APP)
    capture_orders(database_url)
    with psycopg.connect(libpq(database_url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (%s, 'refused', 1)", (order_id,))
    consumed = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", str(app_file), "--name", name,
                                         "--until-caught-up"])
    assert consumed.exit_code == 0, consumed.output
    listed = CliRunner().invoke(main, ["--url", database_url, "dead-letters", "list", "--all", "--json", "--limit",
                                       "0", "--query", f"capture:{name}"])
    ids = [letter["id"] for letter in json.loads(listed.output)]
    assert ids, listed.output
    return str(app_file), ids


def test_replaying_capture_letters_with_the_consumers_own_app_says_they_cannot_be_replayed(database_url, tmp_path):
    """`dead-letters replay APP --query capture:NAME` with the consumer's own application (it has no MAPPING: it is
    no `activedb run` app) was refused with "application … has no MAPPING; add for example MAPPING = …" — advice that
    leads nowhere, since capture's letters cannot be replayed by any APP.  The refusal of capture's letters comes
    first: what they are, and what to do instead; nothing is replayed or marked."""
    app_file, ids = _capture_letters(database_url, tmp_path, "unmapped", 91001)
    replayed = CliRunner().invoke(main, ["--url", database_url, "dead-letters", "replay", app_file, "--query",
                                         "capture:unmapped"])
    text = " ".join(replayed.output.split())
    assert replayed.exit_code == 1, replayed.output
    assert "change capture's (capture:unmapped)" in text and "cannot be replayed" in text, text
    assert "write the change again" in text and "nothing was replayed" in text, text
    assert f"`activedb dead-letters show {ids[0]}` shows its old and new values" in text, text
    shown = CliRunner().invoke(main, ["--url", database_url, "dead-letters", "show", str(ids[-1])])   # (91001's)
    assert '"customer": "refused"' in shown.output, shown.output        # (what the letter keeps of the change)
    assert "MAPPING" not in text, text
    listed = CliRunner().invoke(main, ["--url", database_url, "dead-letters", "list", "--all", "--json", "--limit",
                                       "0", "--query", "capture:unmapped"])
    assert [letter["replayed_at"] for letter in json.loads(listed.output)] == [None] * len(ids)
    # A replay of no capture letter with that application still says what it lacks.
    other = CliRunner().invoke(main, ["--url", database_url, "dead-letters", "replay", app_file, "--query", "nothing"])
    assert other.exit_code == 1 and "has no MAPPING" in other.output, other.output


def test_consume_until_caught_up_says_how_many_changes_failed_and_where_they_are(make_database_url, tmp_path):
    """``capture consume APP --until-caught-up`` said "handled N changes, caught up" when rules had failed on some of
    them: nothing said that they were dead letters, nor where to look.  The summary says how many dead letters the
    run wrote and the command that lists them; the exit code stays 0, as `activedb run`'s with dead letters (the stream
    went on past them; a batch that failed outright is an error, exit 1)."""
    app_file = tmp_path / "summary_app.py"
    app_file.write_text(REFUSING_APP)
    url = make_database_url("consume_summary")
    capture_orders(url)
    with psycopg.connect(libpq(url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (92001, 'refused', 1), (92002, 'refused', 1)")
    result = CliRunner().invoke(main, ["--url", url, "capture", "consume", str(app_file), "--name", "summary",
                                       "--until-caught-up"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert ("capture consumer 'summary': handled 2 changes, 2 dead letters (`activedb dead-letters list --query "
            "capture:summary` shows why)") in text, text


def test_disable_says_how_many_pending_changes_it_drops_and_asks_first(make_database_url):
    """``capture disable TABLE`` dropped the table's captured changes no consumer had handled yet, silently: their
    rules never heard of them, and nothing said so.  It counts them — the backlog of the consumer furthest behind, or
    every retained change without a consumer — says how many it drops and asks first (without a terminal: refused
    unless --yes, nothing changed); a table with nothing pending is disabled without a question."""
    url = make_database_url("disable_pending")
    capture_orders(url)
    runner = CliRunner()

    def cli(*args: str, code: int = 0) -> str:
        result = runner.invoke(main, ["--url", url, "capture", *args])
        assert result.exit_code == code, result.output
        return " ".join(result.output.split())

    with psycopg.connect(libpq(url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (93001, 'a', 1)")
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (93002, 'b', 1)")
    cli("consume", _app.__file__, "--name", "ahead", "--until-caught-up")
    cli("consume", _app.__file__, "--name", "behind", "--until-caught-up", "--batch-size", "1")   # both, then …
    with psycopg.connect(libpq(url), autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (93003, 'c', 1), (93004, 'd', 1)")
    cli("consume", _app.__file__, "--name", "ahead", "--until-caught-up")     # … one of them past two more
    refused = cli("disable", "orders", code=1)
    assert ("stop capturing orders and drop its 2 pending changes (captured, not yet handled by every consumer: "
            "their rules will never hear of them)? — refusing without confirmation: pass --yes") in refused, refused
    with psycopg.connect(libpq(url)) as connection:
        assert connection.execute("SELECT count(*) FROM activedb_capture_changes").fetchone() == (2,)
    assert "no longer capturing orders (2 pending changes dropped)" in cli("disable", "orders", "--yes")
    # Nothing pending: no question.
    assert "no longer capturing typed_samples" in cli("disable", "typed_samples")


def test_a_consumer_on_standby_is_shown_standing_by_in_consume_and_status(database_url, tmp_path):
    """``capture consume APP`` said "running" as soon as its thread started, also when another session held its
    name's leadership lock and it consumed nothing (on standby), and ``capture status`` showed no difference between a
    name some process leads and one none does.  ``consume`` says it stands by, naming the leader's backend pid, and
    that it runs once it leads; ``status`` shows the leader's pid per consumer (or that none leads)."""
    from activedb.testing import wait_until

    capture_orders(database_url)
    # A consumer "standby" ran before (status lists the names that have a position) …
    ran = CliRunner().invoke(main, ["--url", database_url, "capture", "consume", _app.__file__, "--name", "standby",
                                    "--until-caught-up"])
    assert ran.exit_code == 0, ran.output
    # … and now another process leads the name: it holds the lock the leader holds, in a session of its own.
    holder = psycopg.connect(libpq(database_url), autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s, %s)", leadership_lock(holder, "standby"))
    holder_pid = holder.info.backend_pid

    def consumers() -> dict[str, dict]:
        status = CliRunner().invoke(main, ["--url", database_url, "capture", "status", "--json"])
        assert status.exit_code == 0, status.output
        return {consumer["name"]: consumer for consumer in json.loads(status.output)["consumers"]}

    def leader() -> dict[str, int | None]:
        return {name: consumer["leader_pid"] for name, consumer in consumers().items()}

    try:
        with consume_process(database_url, tmp_path, _app.__file__, "--name", "standby") as consume:
            wait_until(consume.printed("standing by"), 120, "the consumer to stand by", describe=consume.text)
            said = " ".join(consume.text().split())
            assert (f"capture consumer 'standby' standing by: another session leads its name (PostgreSQL backend "
                    f"pid {holder_pid})") in said, said
            assert "running" not in said, said
            assert leader().get("standby") == holder_pid
            # status lists the consumer standing by (from when it waits for the lock): its session's backend, its process
            wait_until(lambda: consumers()["standby"]["standby"], 60, "status to list the consumer standing by",
                       describe=consumers)
            [standing] = consumers()["standby"]["standby"]
            assert standing["process_id"] == consume.process.pid, standing
            overall = CliRunner().invoke(main, ["--url", database_url, "status"])
            assert (f"consumer 'standby' (led by pid {holder_pid}, standing by: pid {standing['backend_pid']} (process "
                    f"{consume.process.pid}))") in overall.output, overall.output
            holder.close()                                  # the leader's session ends: the consumer takes over
            wait_until(consume.printed("capture consumer 'standby' running (Ctrl-C stops)"), 60, "the consumer to lead",
                       describe=consume.text)
            wait_until(lambda: leader().get("standby") not in (None, holder_pid), 60, "status to show the new leader")
            assert consumers()["standby"]["standby"] == []  # it leads: no longer standing by
            table = CliRunner().invoke(main, ["--url", database_url, "capture", "status"])
            assert f"pid {leader()['standby']}" in table.output, table.output
            overall = CliRunner().invoke(main, ["--url", database_url, "status"])      # (`activedb status` too)
            assert f"consumer 'standby' (led by pid {leader()['standby']})" in overall.output, overall.output
            consume.interrupt()
            assert consume.process.wait(timeout=60) == 0, consume.text()
        assert leader().get("standby") is None              # no process leads it now
    finally:
        holder.close()


def test_status_keeps_the_latest_commit_position_once_its_changes_are_pruned_or_dropped(clean, conninfo):
    """``capture status`` said "latest commit position 0" once the commits were gone — pruned after every consumer
    had handled them, or dropped with ``capture disable`` — as if nothing had ever been captured, beside a consumer
    whose position was above it.  It is the position the sequencer handed out last, whatever the change table
    still holds."""
    db = clean
    _app.register(db)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (94001, 'a', 1)")
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (94002, 'b', 1)")
    consumer = db.capture.consumer("latest", prune_interval=0)
    try:
        assert consumer.run_until_caught_up() == 2
    finally:
        consumer.close()
    latest = consumer.position.commit
    assert db.capture.status().retained_changes == 0                 # pruned
    assert db.capture.status().latest_position == latest
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (94003, 'c', 1)")
    db.capture.remove("orders", discard_pending=True)      # its pending change dropped with it
    try:
        status = db.capture.status()
        assert status.retained_changes == 0 and status.latest_position == latest + 1
    finally:
        db.capture("orders")


def test_capture_s_own_tables_are_reflected_without_a_warning_about_xid8(clean):
    """``db.capture("activedb_capture_changes")`` (or ``activedb capture enable`` of it) printed SQLAlchemy's
    "SAWarning: Did not recognize type 'xid8' of column 'xid'" before its refusal: the table is reflected first, and
    the dialect does not know PostgreSQL's ``xid8``.  The catalog knows it: no warning, and a column of that type."""
    import warnings

    from activedb.capture import CaptureError

    db = clean
    db.schema.refresh()             # (reflected again)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sa.exc.SAWarning)
        assert db.table("activedb_capture_commits").c.xid.type.__visit_name__ != "null"
        with pytest.raises(CaptureError, match="one of change capture's own tables"):
            db.capture("activedb_capture_changes")


@pytest.mark.parametrize("kind", ["VIEW", "MATERIALIZED VIEW"])
def test_a_rule_on_a_captured_view_is_refused_saying_to_capture_the_tables_it_reads(clean, kind):
    """``db.captured(view)`` warned "table … is not captured: … db.capture(view)", and ``db.capture(view)`` then
    failed with PostgreSQL's "… is a view" (a view has no rows of its own for a row trigger to see; a materialized
    view is written only by REFRESH, which no row trigger sees either).  Both refuse it, saying what works: capture
    the tables it reads and declare the rules on them."""
    from activedb.capture import CaptureError

    db = clean
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE {kind} big_orders AS SELECT id, customer FROM orders WHERE amount > 100"))
    db.schema.refresh()
    try:
        for declare in (lambda: db.captured("big_orders", "inserted"), lambda: db.capture("big_orders")):
            with pytest.raises(CaptureError) as refused:
                declare()
            message = str(refused.value)
            assert f"'big_orders' is a {kind.lower()}" in message, message
            assert "capture the tables it reads" in message and "db.captured(table)" in message, message
        assert "big_orders" not in [captured.name for captured in db.capture.tables()]
        # enable_capture in a revision runs the statements themselves: PostgreSQL refuses the trigger.
        from activedb.capture import _sql

        with pytest.raises(sa.exc.DBAPIError), db.engine.begin() as connection:
            for statement in _sql.install_statements("big_orders"):
                connection.execute(statement)
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"DROP {kind} big_orders"))
        db.schema.refresh()


def test_a_capture_dead_letter_keeps_the_changed_rows_old_and_new_values(clean, conninfo):
    """A dead letter of a captured change held where the change was (table, operation, transaction, position, key)
    but not what it was: neither the row before nor after, so nobody could see which change failed, nor write it
    again.  Its row keeps both — readable in ``raw`` (as `dead-letters show` prints it) and exact in the original
    (``LetterRecord.row()``: a Decimal stays one) —, None where the operation has none; a change that could not become
    an event (its table dropped) keeps them as captured."""
    import decimal

    from activedb import deadletters

    db = clean

    @db.rule(on=db.captured("orders", "modified"), coupling="detached")
    def refuse(tx, event):
        raise ValueError("not today")

    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) VALUES (95001, 'ann', 9.50)")
        psql.execute("UPDATE orders SET customer = 'bob' WHERE id = 95001")
        psql.execute("DELETE FROM orders WHERE id = 95001")
    consumer = db.capture.consumer("keeps_rows")
    try:
        assert consumer.run_until_caught_up() == 3
    finally:
        consumer.close()
    letters = deadletters.select(db, deadletters.LetterFilter(query="capture:keeps_rows"))
    images = [(letter.raw["operation"], letter.raw["old"], letter.raw["new"]) for letter in letters]
    customers = [(operation, old and old["customer"], new and new["customer"]) for operation, old, new in images]
    assert customers == [("inserted", None, "ann"), ("updated", "ann", "bob"), ("deleted", "bob", None)], images
    assert images[0][2]["amount"] == "9.50"                            # readable
    assert letters[0].row()["new"]["amount"] == decimal.Decimal("9.50")   # exact
    # A change of a table dropped since: no event, its rows as the trigger captured them.
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE IF EXISTS fleeting; CREATE TABLE fleeting (id integer PRIMARY KEY, "
                                   "note text)"))
    db.schema.refresh()
    db.capture("fleeting")
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO fleeting VALUES (1, 'gone soon')")
        psql.execute("DROP TABLE fleeting")
    db.schema.refresh()
    consumer = db.capture.consumer("keeps_rows")
    try:
        assert consumer.run_until_caught_up() == 1
    finally:
        consumer.close()
        db.capture.remove("fleeting")
    [gone] = deadletters.select(db, deadletters.LetterFilter(query="capture:keeps_rows", reason="no longer exists"))
    assert gone.raw["old"] is None and gone.raw["new"] == {"id": 1, "note": "gone soon"}, gone.raw
