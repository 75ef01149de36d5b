"""Pictures of live transaction trees and the wait-for graph (``db.explain()``), and deadlocks explained
on request (``connect(explain_deadlocks=True)``): the graph object drawn has the expected nodes and edges,
and the rendered file is a real PNG/SVG of non-trivial size."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

import activedb
from activedb.explain import Explanation
from activedb.testing import Watchdog, wait_until

TIMEOUT = 30
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def clean(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
    yield


def assert_png(path, minimum=15_000):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > minimum, f"{path} is only {len(data)} bytes"


def explained_when(db, ready, what: str, release: threading.Event, threads: list[threading.Thread]) -> Explanation:
    """Wait until ``ready()`` (``what`` says what it waits for), take ``db.explain()``, then let the threads go
    (``release``) and join them."""
    wait_until(ready, TIMEOUT, what)
    explanation = db.explain()
    release.set()
    for thread in threads:
        thread.join(TIMEOUT)
    return explanation


def guarded(body, failures: list[BaseException]) -> threading.Thread:
    """A thread (not started) running ``body``; what it raises goes to ``failures``, which the test asserts empty."""
    def target():
        try:
            body()
        except BaseException as error:  # pragma: no cover - reported by the test
            failures.append(error)
    return threading.Thread(target=target)


def row_holder(db, key: str, ids: dict[str, str], holding: threading.Event, release: threading.Event):
    """A body for ``guarded``: the transaction "holder" (its id in ``ids``) writes ``items[key]``, sets ``holding``
    and keeps the row's lock until ``release``."""
    def holder():
        with db.transaction(name="holder") as tx:
            ids["holder"] = tx.id
            tx.write("items", key, value=1)
            holding.set()
            release.wait(TIMEOUT)
    return holder


def test_a_waiting_tree_is_drawn_with_its_locks_and_a_held_edge(db, tmp_path):
    holding, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    ids: dict[str, str] = {}

    def first() -> None:
        with db.transaction(name="first") as tx:
            ids["first"] = tx.id
            with tx.subtransaction(name="writer") as sub:
                ids["writer"] = sub.id
                sub.write("items", "k", value=1)
                holding.set()
                release.wait(TIMEOUT)

    def second() -> None:
        with db.transaction(name="second") as tx:
            ids["second"] = tx.id
            tx.write("items", "k", value=2)

    with Watchdog(TIMEOUT, db.transactions.locks):
        threads = [guarded(first, failures)]
        threads[0].start()
        assert holding.wait(TIMEOUT)
        threads.append(guarded(second, failures))
        threads[1].start()
        explanation = explained_when(db, lambda: db.transactions.locks.statistics().waiting == 1, "second never waited",
                                     release, threads)
    assert failures == []

    graph = explanation.graph
    assert {ids["first"], ids["writer"], ids["second"]} <= set(graph.nodes)
    assert not any("#" in node for node in graph.nodes), "lock segments are folded into their nodes"
    assert graph.nodes[ids["writer"]]["name"] == "writer"
    assert graph.nodes[ids["writer"]]["state"] == "active"
    assert "WRITE items['k']" in graph.nodes[ids["writer"]]["held"]
    assert graph.nodes[ids["second"]]["waiting_for"] == "WRITE items['k']"
    assert graph.edges[ids["first"], ids["writer"]]["kind"] == "commit"     # inline: first waits for it all its life
    assert graph.edges[ids["second"], ids["writer"]]["kind"] == "held"
    assert graph.edges[ids["second"], ids["writer"]]["resource"] == "items['k']"
    assert "waiting for WRITE items['k']" in explanation.text()

    png = explanation.render(tmp_path / "waiting.png")
    assert_png(png)
    svg = explanation.render(tmp_path / "waiting.svg")
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    again = Explanation.load(explanation.save(tmp_path / "waiting.json"))
    assert again == explanation


def test_a_deadlock_carries_its_picture_when_asked(database_url, tmp_path):
    database = activedb.connect(database_url, explain_deadlocks=True)
    first_done, ids = threading.Event(), {}
    caught: list[BaseException] = []
    barrier = threading.Barrier(2, timeout=TIMEOUT)

    def one(mine: str, theirs: str, name: str, closes: bool) -> None:
        try:
            with database.transaction(name=name) as tx:
                ids[name] = tx.id
                tx.write("items", mine, value=1)
                barrier.wait()
                if closes:     # the second request closes the cycle: it is the requester, the victim
                    wait_until(lambda: database.transactions.locks.statistics().waiting == 1, TIMEOUT,
                               "the other transaction never waited")
                tx.write("items", theirs, value=1)
        except activedb.DeadlockDetected as error:
            caught.append(error)
        finally:
            first_done.set()

    try:
        with Watchdog(TIMEOUT, database.transactions.locks):
            threads = [threading.Thread(target=one, args=("a", "b", "left", False)),
                       threading.Thread(target=one, args=("b", "a", "right", True))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(TIMEOUT)
    finally:
        database.close()
    assert len(caught) == 1
    explanation = caught[0].explanation
    graph = explanation.graph
    cycle = [(waiter, target) for waiter, target, data in graph.edges(data=True) if data["in_cycle"]]
    assert sorted(cycle) == sorted([(ids["left"], ids["right"]), (ids["right"], ids["left"])])
    assert {graph.edges[edge]["kind"] for edge in cycle} == {"held"}
    assert explanation.deadlock and "victim" in explanation.deadlock
    assert_png(explanation.render(tmp_path / "deadlock.png"))


def test_a_busy_moment_shows_every_kind_of_lock_and_registered_wait(db, tmp_path):
    from activedb.examples import busy_moment

    with Watchdog(TIMEOUT, db.transactions.locks):
        moment = busy_moment.hold(db)
        try:
            explanation = db.explain()
        finally:
            moment.release()
        db.rules.wait_idle(TIMEOUT)
    ids = moment.ids
    graph = explanation.graph
    action = next(node for node, data in graph.nodes(data=True) if data["name"] == "action:light_badge")
    condition = next(node for node, data in graph.nodes(data=True) if data["name"] == "condition:light_badge")
    child = ids["event:exit w2"]
    expected = {
        (ids["T-badges"], child): "commit",
        (action, condition): "dependency",
        (ids["T-report"], ids["T-badges"]): "retained",
        (ids["T-cleanup"], child): "held",
        (ids["T-audit"], child): "held",
        (ids["T-audit"], ids["T-cleanup"]): "queued",
    }
    for (waiter, target), kind in expected.items():
        assert graph.edges[waiter, target]["kind"] == kind, (waiter, target)
    assert "WRITE worker_status['w1']" in graph.nodes[ids["T-badges"]]["retained"]
    assert "WRITE worker_status['w2']" in graph.nodes[child]["held"]
    assert graph.nodes[action]["state"] == "active"
    assert_png(explanation.render(tmp_path / "busy.png"), minimum=40_000)


def test_the_cli_draws_a_live_process(database_url, tmp_path):
    """``activedb explain --pid`` asks a running process (``explain.serve_on_signal(db)``) for its picture."""
    import os
    import subprocess
    import sys

    from click.testing import CliRunner

    from activedb.cli import main

    home = tmp_path / "home"
    script = (
        "import sys, activedb\n"
        "from activedb import explain\n"
        "from activedb.examples import busy_moment\n"
        f"db = activedb.connect({database_url!r})\n"
        f"explain.serve_on_signal(db, {str(home / 'explain')!r})\n"
        "moment = busy_moment.hold(db)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "moment.release(); db.rules.wait_idle(30); db.close()\n"
    )
    environment = {**os.environ, "PYTHONPATH": os.getcwd()}
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=environment)
    try:
        assert process.stdout.readline().strip() == "ready"
        result = CliRunner().invoke(main, ["--home", str(home), "explain", "--pid", str(process.pid),
                                           "-o", str(tmp_path / "live.png")], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "dependency" in result.output and "queued" in result.output and "retained" in result.output
        assert_png(tmp_path / "live.png", minimum=40_000)
        saved = Explanation.load(home / "explain" / f"{process.pid}.json")
        assert {"child", "commit", "held", "retained", "queued", "dependency"} <= saved.edge_kinds()
    finally:
        process.communicate("go\n", timeout=TIMEOUT)
    assert process.returncode == 0
    assert not (home / "explain" / f"{process.pid}.serving").exists(), "the registration outlived its process"


def test_the_cli_signals_no_process_that_does_not_serve_explanations(tmp_path):
    """``activedb explain --pid`` of a plain process (no handler: SIGUSR1 would kill it), of init, and of a
    pid whose registration was left by another process refuses with what it found, and sends nothing."""
    import json
    import subprocess

    from click.testing import CliRunner

    from activedb.cli import main
    from activedb.explain import process_start_time

    home = tmp_path / "home"
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        for pid in (sleeper.pid, 1):
            result = CliRunner().invoke(main, ["--home", str(home), "explain", "--pid", str(pid), "--timeout", "2"])
            assert result.exit_code == 1, result.output
            assert f"process {pid} does not serve explanations" in result.output, result.output
            assert "nothing was sent" in result.output and "Traceback" not in result.output
            assert sleeper.poll() is None, f"explain --pid {pid} killed the sleeper"
        # A registration naming the sleeper's pid but another start time: a process that ended, pid reused.
        stale = home / "explain" / f"{sleeper.pid}.serving"
        stale.parent.mkdir(parents=True)
        stale.write_text(json.dumps({"pid": sleeper.pid, "start_time": process_start_time(sleeper.pid) - 1}))
        result = CliRunner().invoke(main, ["--home", str(home), "explain", "--pid", str(sleeper.pid)])
        assert result.exit_code == 1 and "is not the process that registered" in result.output, result.output
        assert not stale.exists(), "the stale registration is removed"
        assert sleeper.poll() is None, "explain --pid killed a process whose pid a registration named"
    finally:
        sleeper.kill()
        sleeper.wait(TIMEOUT)


def test_a_parent_waits_for_its_inline_child_whether_it_is_lazy_or_a_node(db):
    """A parent's lock-manager edge to an inline child (begun ``awaited``: a materialized inline child, a group's
    member started on another thread) was left out of ``LockManager.snapshot()``, which ``db.explain()`` is built
    from, so such a parent (a rule group's owner waiting for its members on threads) was drawn waiting for nothing.
    The snapshot has it now, and a lazy inline child (not in the lock manager yet) is given it too, so that the
    picture does not depend on whether the child has materialized: here a child that waits for a row (and so
    materializes) and one that does not are both drawn ``parent -[commit]-> child``."""
    holding, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    ids: dict[str, str] = {}

    def waiting_parent():
        with db.transaction(name="waiting parent") as tx:
            ids["waiting parent"] = tx.id
            with tx.subtransaction(name="waiting child") as sub:
                ids["waiting child"] = sub.id
                sub.write("items", "k", value=2)              # waits for holder: a node from now on

    def lazy_parent():
        with db.transaction(name="lazy parent") as tx:
            ids["lazy parent"] = tx.id
            with tx.subtransaction(name="lazy child") as sub:
                ids["lazy child"] = sub.id
                sub.write("items", "j", value=3)
                holding.wait(TIMEOUT)
                release.wait(TIMEOUT)

    locks = db.transactions.locks
    with Watchdog(TIMEOUT, locks):
        threads = [guarded(row_holder(db, "k", ids, holding, release), failures), guarded(lazy_parent, failures)]
        for thread in threads:
            thread.start()
        assert holding.wait(TIMEOUT)
        threads.append(guarded(waiting_parent, failures))
        threads[-1].start()
        explanation = explained_when(db, lambda: locks.statistics().waiting == 1 and "lazy child" in ids,
                                     "the child never waited", release, threads)
    assert failures == []
    graph = explanation.graph
    assert graph.edges[ids["waiting child"], ids["holder"]]["kind"] == "held"
    assert graph.edges[ids["waiting parent"], ids["waiting child"]]["kind"] == "commit"
    assert graph.edges[ids["lazy parent"], ids["lazy child"]]["kind"] == "commit"
    assert f"{ids['waiting parent']} -[commit]-> {ids['waiting child']}" in explanation.text()


def test_nested_and_children_waits_are_drawn(db, tmp_path):
    """A thread running ``outer`` blocked inside the top-level ``inner`` it opened (``nested``), and a
    thread running ``watcher`` waiting for another tree's child (``children``)."""
    release, holding, spawned = threading.Event(), threading.Event(), threading.Event()
    handles, ids, failures = {}, {}, []
    locks = db.transactions.locks

    def outer():
        with db.transaction(name="outer") as tx:
            ids["outer"] = tx.id
            with db.transaction(name="inner") as inner:        # this thread now waits inside `inner`
                ids["inner"] = inner.id
                inner.write("items", "n", value=2)

    def parent():
        with db.transaction(name="parent") as tx:
            ids["parent"] = tx.id
            handles["child"] = tx.spawn(lambda child: release.wait(TIMEOUT), name="slow child")
            spawned.set()
            handles["child"].result(TIMEOUT)

    def watcher():
        with db.transaction(name="watcher") as tx:
            ids["watcher"] = tx.id
            handles["child"].result(TIMEOUT)               # waits for another tree's child

    with Watchdog(TIMEOUT, locks):
        threads = [guarded(row_holder(db, "n", ids, holding, release), failures), guarded(parent, failures)]
        for thread in threads:
            thread.start()
        assert holding.wait(TIMEOUT) and spawned.wait(TIMEOUT)
        threads += [guarded(outer, failures), guarded(watcher, failures)]
        threads[2].start()
        threads[3].start()
        explanation = explained_when(
            db, lambda: locks.statistics().waiting >= 1 and locks.statistics().registered_waits >= 2,
            "the nested and children waits never appeared", release, threads)
    assert failures == []
    graph = explanation.graph
    child = handles["child"].transaction.id
    assert graph.edges[ids["outer"], ids["inner"]]["kind"] == "nested"
    assert graph.edges[ids["inner"], ids["holder"]]["kind"] == "held"
    assert graph.edges[ids["watcher"], child]["kind"] == "children"
    assert graph.edges[ids["parent"], child]["kind"] == "commit"
    assert graph.nodes[child]["name"] == "slow child"
    assert_png(explanation.render(tmp_path / "registered.png"))


def test_a_box_shows_a_transactions_whole_name():
    """Names are never cut in a picture (it had 'rule:alert_violat…' with room to spare): a long one wraps
    between words onto lines of its own, and the columns are as wide as the widest box."""
    from activedb.explain import ExplainNode, HeldLock
    from activedb.explain._drawing import draw

    deep = "T73353.73409.73413.73414"
    long_name = "s-transaction SANITIZE^6401.125 of worker w11 in room3, released by the punctuation"
    explanation = Explanation(nodes=(
        ExplainNode("T73353", None, None, "active", 0),
        ExplainNode(deep, "T73353", "rule:alert_violation", "active", 1, held=(HeldLock("alerts[1081]", "WRITE"),)),
        ExplainNode("T73353.2", "T73353", long_name, "active", 1)), edges=())
    texts = [text.get_text() for text in draw(explanation, 100).axes[0].texts]
    assert f"{deep}  rule:alert_violation" in texts[1].splitlines()
    assert " ".join(texts[2].split()).startswith(f"T73353.2 {long_name}"), texts[2]
    assert not any("…" in text for text in texts), texts


def test_a_box_of_many_locks_counts_a_tables_rows_per_mode_and_keeps_the_table_locks():
    """More locks than a box has lines for: the row locks of one table in one mode are counted in one line
    ("retains WRITE 12 rows of alerts"), before the table locks."""
    from activedb.explain import ExplainNode, HeldLock
    from activedb.explain._drawing import draw

    rows = tuple(HeldLock(f"alerts[{number}]", "WRITE") for number in range(12))
    held = (HeldLock("table alerts", "IW"), HeldLock("workers[w1]", "READ"), HeldLock("workers[w2]", "READ"))
    explanation = Explanation(nodes=(ExplainNode("T1", None, "busy", "active", 0, held=held, retained=rows),),
                              edges=())
    (text,) = [text.get_text() for text in draw(explanation, 100).axes[0].texts]
    lines = text.splitlines()
    assert "holds READ 2 rows of workers" in lines and "retains WRITE 12 rows of alerts" in lines, lines
    assert any(line.startswith("holds ") and "table alerts" in line for line in lines), lines
    assert not any("alerts[" in line for line in lines), lines


def test_a_node_whose_parent_is_not_in_the_picture_is_shown_as_a_root(tmp_path):
    """An explanation loaded from JSON that was trimmed or edited by hand can hold a node whose parent is not among
    its nodes: ``text()`` left it out, with the tree below it (a waiter whose wait was listed, the waiter nowhere),
    and ``render()`` failed with a bare KeyError.  It is shown as a root, as ``from_snapshot`` shows a node whose
    parent is not drawn; so is a node of a parent cycle, which no root reaches."""
    from activedb.explain import ExplainEdge, ExplainNode

    trimmed = Explanation(nodes=(
        ExplainNode("T1", None, "holder", "active", 0),
        ExplainNode("T2.1", "T2", "waiter", "active", 1),
        ExplainNode("T2.1.1", "T2.1", "below", "active", 2),
        ExplainNode("T3", "T4", "loop", "active", 1), ExplainNode("T4", "T3", None, "active", 1)),
        edges=(ExplainEdge("T2.1", "T1", "held", "items['a']"),))
    loaded = Explanation.load(trimmed.save(tmp_path / "trimmed.json"))
    lines = loaded.text().splitlines()
    assert "T2.1 waiter [active]" in lines and "  T2.1.1 below [active]" in lines, lines
    assert "T3 loop [active]" in lines and "  T4 [active]" in lines, lines
    assert_png(loaded.render(tmp_path / "trimmed.png"), minimum=5_000)


@pytest.mark.parametrize("timeout", [float("nan"), -1, 0, "10", None])
def test_request_refuses_a_timeout_that_is_no_time_before_anything_is_sent(tmp_path, timeout):
    """``request(pid, timeout=nan)`` (``activedb explain --pid P --timeout nan``) signalled the process and then never
    gave up (no time is past a NaN deadline): a process that did not answer hung the command for good; a negative
    or zero timeout signalled it and gave up at once; a text failed with a TypeError after the signal. Each is a
    BadArgument now, before the process is even looked at."""
    import os

    from activedb.explain import request

    with pytest.raises(activedb.BadArgument, match=r"request\(timeout=.*\) takes a number of seconds above 0"):
        request(os.getpid(), tmp_path, timeout=timeout)


@pytest.mark.parametrize("pid", [2**31, 10**11, 2**70])
def test_a_pid_no_process_can_have_is_no_process_in_one_line(tmp_path, pid):
    """``activedb explain --pid 99999999999`` (a mistyped pid beyond what a pid can be) ended with a traceback of
    the OverflowError of ``os.pidfd_open`` ('signed integer is greater than maximum'); it is "no process", as a
    pid that names none is, and nothing is sent."""
    from click.testing import CliRunner

    from activedb.cli import main
    from activedb.explain import request

    with pytest.raises(activedb.PictureError, match=rf"^no process {pid} is running: "):
        request(pid, tmp_path)
    result = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "explain", "--pid", str(pid)])
    assert result.exit_code == 1 and result.output.startswith(f"activedb: error: no process {pid} is running: "), \
        result.output
    assert result.output.count("\n") == 1, result.output


def test_explain_of_a_process_that_is_gone_says_what_to_do_and_removes_its_registration(tmp_path):
    """``activedb explain --pid P`` of a process that served explanations and was killed (SIGKILL: its registration
    stays) said only "no process P", nothing of what to give instead, and left ``P.serving`` behind where Linux has
    pidfds (the pidfd's ProcessLookupError came before the look that removes it). It says the process is not running
    and what to give, in one line, and removes the registration."""
    import json
    import subprocess

    from click.testing import CliRunner

    from activedb.cli import main

    home = tmp_path / "home"
    gone = subprocess.Popen(["true"])
    gone.wait(TIMEOUT)
    registration = home / "explain" / f"{gone.pid}.serving"
    registration.parent.mkdir(parents=True)
    registration.write_text(json.dumps({"pid": gone.pid, "start_time": 1}))
    result = CliRunner().invoke(main, ["--home", str(home), "explain", "--pid", str(gone.pid)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"activedb: error: no process {gone.pid} is running: "), result.output
    assert "serve_on_signal" in result.output and result.output.count("\n") == 1, result.output
    assert not registration.exists(), "the registration of a process that is gone is removed"


def _serving_folder(folder, tmp_path):
    """``folder`` holding the snapshot and registration of a process that is gone, of one whose pid was reused (another
    process runs as it now), of this live process, and files that are no process's; returns the names of those of
    this process and the others', which stay."""
    import json
    import os
    import subprocess

    from activedb.explain import process_start_time

    gone = subprocess.Popen(["true"])
    gone.wait(TIMEOUT)
    folder.mkdir(parents=True)
    for pid, start_time in ((gone.pid, 1), (os.getppid(), -1), (os.getpid(), process_start_time(os.getpid()))):
        (folder / f"{pid}.serving").write_text(json.dumps({"pid": pid, "start_time": start_time}))
        Explanation(nodes=(), edges=(), title=f"process {pid}").save(folder / f"{pid}.json")
    Explanation(nodes=(), edges=()).save(folder / "kept-by-hand.json")
    (folder / "12345.txt").write_text("no snapshot")
    return {f"{os.getpid()}.json", f"{os.getpid()}.serving", "kept-by-hand.json", "12345.txt"}


def test_explain_removes_the_snapshots_of_processes_that_are_gone_and_keeps_those_of_live_ones(tmp_path):
    """``$ACTIVEDB_HOME/explain/PID.json`` stayed after its process ended, one more for every process ever asked:
    ``activedb explain --pid`` removes the snapshots and registrations of processes that are gone (a reused pid is
    another process), whatever it is asked, and keeps those of live ones and files of no process."""
    from click.testing import CliRunner

    from activedb.cli import main

    home = tmp_path / "home"
    kept = _serving_folder(home / "explain", tmp_path)
    result = CliRunner().invoke(main, ["--home", str(home), "explain", "--pid", str(2**31 - 2)])
    assert result.exit_code == 1 and "is running" in result.output, result.output
    assert {path.name for path in (home / "explain").iterdir()} == kept


def test_serving_explanations_removes_the_snapshots_of_processes_that_are_gone(db, tmp_path):
    """A process that starts serving explanations (``serve_on_signal``, as ``activedb run`` does) removes the snapshots
    and registrations of processes that are gone from its folder, and keeps those of live ones."""
    import os
    import signal

    from activedb import explain

    folder = tmp_path / "explain"
    kept = _serving_folder(folder, tmp_path)
    before = signal.getsignal(signal.SIGUSR1)
    try:
        explain.serve_on_signal(db, folder)
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert {path.name for path in folder.iterdir()} == kept
    assert explain.read_registration(folder / f"{os.getpid()}.serving").start_time == \
        explain.process_start_time(os.getpid())


def test_explain_on_a_narrow_terminal_wraps_its_text_between_words(tmp_path):
    """``activedb explain SNAPSHOT`` printed each line whole: on a terminal 40 columns wide a tree's line of locks
    ran on over the edge, split wherever the terminal cut it, in the middle of a word.  On a terminal it wraps to the
    terminal's width between words, a line's rest indented under it; into a pipe each line stays whole (for grep)."""
    import os
    import subprocess
    import sys

    from activedb.explain import ExplainEdge, ExplainNode, HeldLock
    from tests._terminal import run_on_terminal

    locks = tuple(HeldLock(f"items['customer number {number}']", "exclusive") for number in range(4))
    explanation = Explanation(nodes=(
        ExplainNode("T1", None, "monthly settlement of accounts", "active", 0, held=locks),
        ExplainNode("T1.1", "T1", "recompute the balances", "active", 1, retained=locks,
                    waiting_for=HeldLock("table accounts", "share")),
    ), edges=(ExplainEdge("T1.1", "T1", "retained", "items['customer number 0']"),), title="wrapping between words")
    snapshot = explanation.save(tmp_path / "narrow.json")
    command = [sys.executable, "-m", "activedb", "--home", str(tmp_path / "home"), "explain", str(snapshot)]
    environment = {**os.environ, "PYTHONPATH": os.getcwd(), "COLUMNS": "40"}
    code, errors, drawn = run_on_terminal(command, environment, terminal="stdout")
    assert code == 0, errors
    lines = drawn.decode().replace("\r\n", "\n").rstrip("\n").split("\n")
    assert all(len(line) <= 40 for line in lines), lines
    assert " ".join(drawn.decode().split()) == " ".join(explanation.text().split()), lines    # no word split
    assert "  holds: exclusive items['customer" in lines and "      number 0'], exclusive" in lines, lines
    piped = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=TIMEOUT)
    assert piped.returncode == 0 and piped.stdout == explanation.text() + "\n", piped.stderr


def test_a_picture_or_snapshot_that_cannot_be_written_or_read_is_a_picture_error_and_one_line(tmp_path):
    """``render`` into a folder that cannot be made (a file is in the way) let the OSError out — ``activedb explain
    SNAPSHOT -o PATH`` printed its traceback —, and ``Explanation.load`` of a directory let IsADirectoryError out:
    neither an ActivedbError."""
    from click.testing import CliRunner

    from activedb.cli import main
    from activedb.errors import PictureError

    snapshot = Explanation(nodes=(), edges=()).save(tmp_path / "empty.json")
    blocked = tmp_path / "empty.json" / "picture.png"
    with pytest.raises(PictureError, match=r"cannot draw .*picture\.png: "):
        Explanation.load(snapshot).render(blocked)
    with pytest.raises(PictureError, match=r"cannot read the explanation at "):
        Explanation.load(tmp_path)
    result = CliRunner().invoke(main, ["explain", str(snapshot), "-o", str(blocked)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.output.startswith("activedb: error: cannot draw "), result.output


def test_an_explanation_that_cannot_be_saved_is_a_picture_error_and_leaves_no_temporary_file(tmp_path):
    """``Explanation.save`` into a folder that cannot be made (a file is in the way) let the OSError out, and onto a
    path that is a folder left its temporary file beside it: neither an ActivedbError, and a hidden file left behind."""
    from activedb.errors import PictureError

    explanation = Explanation(nodes=(), edges=())
    blocked = explanation.save(tmp_path / "empty.json") / "again.json"
    with pytest.raises(PictureError, match=r"cannot save the explanation to .*again\.json: "):
        explanation.save(blocked)
    (tmp_path / "folder").mkdir()
    with pytest.raises(PictureError, match=r"cannot save the explanation to .*folder: "):
        explanation.save(tmp_path / "folder")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty.json", "folder"]


def test_the_cli_finds_a_live_process_under_a_home_given_with_a_tilde(database_url, tmp_path):
    """``ACTIVEDB_HOME=~/x`` (or ``--home '~/x'``) is expanded by connect() and by ``activedb run``, which register
    for explanations under ``/home/…/x/explain``; ``activedb explain --pid`` looked in a directory literally named
    ``~`` and refused the process as one that does not serve explanations."""
    import os
    import subprocess
    import sys

    from click.testing import CliRunner

    from activedb.cli import main

    home = tmp_path / "home"
    script = (
        "import sys, activedb\n"
        "from activedb import explain\n"
        f"db = activedb.connect({database_url!r})\n"
        f"explain.serve_on_signal(db, {str(home / 'explain')!r})\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "db.close()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert process.stdout.readline().strip() == "ready"
        for arguments, environment in ((["--home", "~/home"], {}), ([], {"ACTIVEDB_HOME": "~/home"})):
            result = CliRunner().invoke(main, [*arguments, "explain", "--pid", str(process.pid), "--text"],
                                        env={"HOME": str(tmp_path), **environment})
            assert result.exit_code == 0, result.output
    finally:
        process.communicate("go\n", timeout=TIMEOUT)


def test_serving_explanations_into_a_folder_that_cannot_be_made_is_a_picture_error_and_installs_no_handler(db, tmp_path):
    """``serve_on_signal`` installed its SIGUSR1 handler and then let the OSError of its registration file out (a
    file in the way of the folder): no ActivedbError, and the process left handling SIGUSR1 by writing where it
    cannot, its former handler replaced."""
    import signal

    from activedb import explain
    from activedb.errors import PictureError

    (tmp_path / "file").write_text("in the way")
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(PictureError, match=r"cannot serve explanations from .*file.*: "):
        explain.serve_on_signal(db, tmp_path / "file" / "explain")
    assert signal.getsignal(signal.SIGUSR1) is before


def test_serving_explanations_from_another_thread_than_the_main_one_is_a_picture_error_saying_where(db, tmp_path):
    """``serve_on_signal`` called from a thread of the application (a web server's, a worker's) let signal.signal's
    ValueError ('signal only works in main thread of the main interpreter') out: no ActivedbError, and nothing said
    of what to do."""
    from activedb import explain
    from activedb.errors import PictureError

    raised: list[BaseException] = []

    def serve() -> None:
        try:
            explain.serve_on_signal(db, tmp_path / "explain")
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join(TIMEOUT)
    [error] = raised
    assert isinstance(error, PictureError), repr(error)
    assert "from the main thread" in str(error), str(error)
    assert not (tmp_path / "explain").exists()


@pytest.mark.parametrize("dpi", [0, -5, "110", None])
def test_render_refuses_a_resolution_that_is_no_whole_number_above_zero_before_drawing(tmp_path, dpi):
    """``render(dpi=0)`` let matplotlib's ValueError out (no ActivedbError), after drawing the figure."""
    from activedb.errors import PictureError

    with pytest.raises(PictureError, match=r"render\(dpi=.*\) takes a whole number of at least 1"):
        Explanation(nodes=(), edges=()).render(tmp_path / "picture.png", dpi=dpi)
    assert not (tmp_path / "picture.png").exists()


def test_two_dumps_at_once_each_publish_a_whole_file(db, tmp_path, monkeypatch):
    """Two quick SIGUSR1 requests (or two threads) save to one ``PID.json`` at once.  Both wrote through one temporary
    name (the pid only), so the second truncated and rewrote the first's temporary file, published it, and the first's
    rename then found nothing (or published a file the second was still writing).  The interleaving made deterministic:
    the first dump is held just before its rename until the second one has finished."""
    import os

    import activedb.explain as explain_module

    path = tmp_path / "dump.json"
    first_written, second_done = threading.Event(), threading.Event()
    rename = os.replace

    def held_replace(source, target):
        if threading.current_thread().name == "first":
            first_written.set()
            assert second_done.wait(TIMEOUT), "the second dump did not end"
        return rename(source, target)

    monkeypatch.setattr(explain_module.os, "replace", held_replace)
    explanations = [activedb.explain.explain(db, title=title) for title in ("first", "second")]
    errors: dict[str, BaseException] = {}

    def save(explanation: Explanation) -> None:
        try:
            explanation.save(path)
        except BaseException as error:       # (reported below, with which dump)
            errors[explanation.title] = error
        finally:
            if threading.current_thread().name == "second":
                second_done.set()

    with Watchdog(TIMEOUT * 2):
        first = threading.Thread(target=save, args=(explanations[0],), name="first")
        first.start()
        assert first_written.wait(TIMEOUT)
        second = threading.Thread(target=save, args=(explanations[1],), name="second")
        second.start()
        second.join()
        first.join()
    assert errors == {}
    assert Explanation.load(path).title == "first"          # (renamed last: a whole file)
    assert [entry.name for entry in tmp_path.iterdir()] == ["dump.json"]


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_a_timeout_that_is_no_wait_is_a_usage_error_naming_the_option(tmp_path, timeout):
    """``activedb explain --pid PID --timeout -1`` is click's usage error naming ``--timeout`` (exit 2), before any pid
    is looked at: it said "request(timeout=-1.0) takes a number of seconds above 0" (exit 1), naming a Python call
    the operator did not make."""
    from click.testing import CliRunner

    from activedb.cli import main

    result = CliRunner().invoke(main, ["--home", str(tmp_path / "home"), "explain", "--pid", "1", "--timeout", timeout])
    assert result.exit_code == 2 and "Invalid value for '--timeout'" in result.output, result.output
    assert "request(" not in result.output, result.output


def test_three_hundred_waiters_on_one_row_give_a_text_and_a_picture_that_grow_with_the_waiters(db, tmp_path):
    """Every queued request waits for every earlier conflicting one, so the lock table of 300 writers of one row has
    about 45,000 wait edges: text() listed each (45,754 lines) and render() drew each (did not finish in 300 s, a
    user ran explain during such an incident). Text and picture show each waiter's nearest predecessor in the queue
    (the first one the holder); ``edges`` and ``.graph`` keep every wait."""
    waiters = 300
    holding, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    ids: dict[str, str] = {}

    def writer(number: int):
        def body() -> None:
            with db.transaction(name=f"w{number}") as tx:
                tx.write("items", "k", value=number)
        return body

    with Watchdog(4 * TIMEOUT, db.transactions.locks):
        threads = [guarded(row_holder(db, "k", ids, holding, release), failures)]
        threads[0].start()
        assert holding.wait(TIMEOUT)
        for number in range(waiters):
            threads.append(guarded(writer(number), failures))
            threads[-1].start()
        explanation = explained_when(db, lambda: db.transactions.locks.statistics().waiting == waiters,
                                     f"{waiters} writers never all waited", release, threads)
    assert failures == [] and not any(thread.is_alive() for thread in threads)

    waits = [edge for edge in explanation.edges if edge.kind != "child"]
    assert len(waits) > waiters * (waiters - 1) // 2, "every wait stays in the data"
    assert explanation.graph.number_of_edges() >= len(waits)
    text = explanation.text()
    lines = text.splitlines()
    assert len(lines) < 4 * waiters, f"text() has {len(lines)} lines for {waiters} waiters"
    wait_lines = [line for line in lines if " -[" in line]
    assert len(wait_lines) == waiters, wait_lines[:5]
    first = [line for line in wait_lines if line.endswith(f"-> {ids['holder']}")]
    assert len(first) == 1, f"only the first waiter is shown waiting for the holder: {first[:5]}"
    assert "implied" in text
    png = explanation.render(tmp_path / "queue.png", dpi=40)
    from PIL import Image

    with Image.open(png) as picture:
        width, height = picture.size
    assert width * height < 3_000 * 3_000 and max(width, height) < 4 * min(width, height), (width, height)
    assert Explanation.load(explanation.save(tmp_path / "queue.json")) == explanation
