"""Randomized list-append histories of transaction trees, checked like Jepsen's Elle.

Worker threads run random trees of parallel nested transactions that read and append to a few hot
lists (the workload: ``_list_append_workload.py``), recording every micro-operation per node
themselves.  After the run the final lists are read from PostgreSQL and the whole history goes to
``activedb.testing.check_list_append``, which infers the dependency graph from the lists and looks
for anomalies among the committed top-level transactions *and* among the committed children of
every parent together with the parent's own operations (its docstring is the design note).

* ``test_one_process``: the trees of one process are isolated by the lock manager.
* ``test_two_processes``: a second OS process runs the same workload on the same database; trees
  of different processes are isolated only by the validation at the top-level flush, so
  ``SerializationConflict`` is a common (expected) outcome there.

``ACTIVEDB_LIST_APPEND_FOR_UPDATE`` is the share of the appends after a row read whose read is for update in the runs
under the default representation of inline subtransactions (frames; the reference one, materialized, keeps the
scripts as they were): rows held in PostgreSQL by trees whose waits there are edges of their process's wait-for
graph (txn README, "A PostgreSQL row wait is an edge of the wait-for graph") — a cycle through both lock systems of
one process is a deadlock found when it forms.  Default 0.5 in one process, 0 in two: a cycle through both
processes' lock managers and PostgreSQL is seen by no detector and broken only by the bounded row waits (10 s each),
which with these few hot keys made the two-process run outlast its watchdog.

Seed: ``ACTIVEDB_TEST_SEED`` (default 9) fixes what every tree tries to do; the interleavings are
the threads'.  Size: ``ACTIVEDB_LIST_APPEND_TRANSACTIONS`` top-level transactions per worker thread
(default 400 in one process, 350 per process in two; e.g. 1000 for a long run).
``ACTIVEDB_LIST_APPEND_WATCHDOG`` (seconds, default 120) turns a hang into a failure that prints the
wait-for graph and every stack.  A failing run leaves its history and final lists as JSON in the
test's ``tmp_path`` and names the file.

What it catches (each tree-isolation fix (bugs A, B, C of the regression tests) reverted alone, CI sizes and seed):

* A (a child's read returns a committed image it cached instead of its ancestor's write): one process
  -- backward reads, incompatible orders, lost appends, G-single cycles; two processes -- the same and
  G2-item cycles;
* B (a parent's own locks stay held while it waits for its children): the lock manager reports the
  cycle as a ``Deadlock`` (it no longer hangs); the workload fails on any deadlock in which a node
  waiting for its children holds a lock another transaction waits for (``breaks_hold_retain``);
* C (siblings relying on different committed images of a row): two processes -- G-single cycles at
  the top level.  One process cannot show it (its trees are isolated by locks).

It also found, on today's core, write skew between a flush that validated a scan (SERIALIZABLE, no
row locks) and another process's READ COMMITTED flush (fixed: scanned rows are re-read FOR SHARE),
and a doomed node's ``handle.result()`` raising lockmgr's raw ``AbortedTransaction``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from activedb import testing
from activedb.txn import Subtransactions
from activedb.testing import RecordedTransaction
from tests.scenarios._list_append_workload import WATCHDOG_TIMEOUT, Recorder, Workload, final_lists, reset

SEED = os.environ.get("ACTIVEDB_TEST_SEED", "9")
THREADS = 4
# representation -> the workload's for_update (else 0)
_FOR_UPDATE = os.environ.get("ACTIVEDB_LIST_APPEND_FOR_UPDATE")
FOR_UPDATE = {Subtransactions.FRAMES.value: float(_FOR_UPDATE or "0.5")}
FOR_UPDATE_TWO_PROCESSES = {Subtransactions.FRAMES.value: float(_FOR_UPDATE or "0")}


def transactions(default: int) -> int:
    """Top-level transactions per worker thread: ``ACTIVEDB_LIST_APPEND_TRANSACTIONS`` or ``default``."""
    return int(os.environ.get("ACTIVEDB_LIST_APPEND_TRANSACTIONS", default))
REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, params=[representation.value for representation in Subtransactions])
def representation(request, db):
    """Every representation of inline subtransactions (see ``activedb/txn/README.md``, "Lazy inline
    subtransactions" and "Frames") must produce serializable histories; the second process runs the same one."""
    saved = db.transactions.subtransactions
    db.transactions.subtransactions = Subtransactions(request.param)
    yield request.param
    db.transactions.subtransactions = saved


@pytest.fixture(autouse=True)
def empty_lists(db):
    reset(db)


def verify(db, tmp_path: Path, history: list[RecordedTransaction], *, errors: list[str], unended: list[str],
           outcomes: dict, aborted_reads: bool = True) -> testing.ListAppendReport:
    """Check the history against the final lists; fail with every problem found at once:
    unexpected errors, anomalies, nodes that never ended."""
    final = final_lists(db)
    report = testing.check_list_append(history, final, aborted_reads=aborted_reads)
    print(f"seed {SEED}: {report.statistics}\noutcomes: {dict(sorted(outcomes.items()))}")
    problems = []
    if errors:
        problems.append(f"{len(errors)} unexpected error(s) in the workers (the first ones):\n" + "\n".join(errors[:3]))
    if not report.ok:
        saved = tmp_path / "list-append-history.json"
        saved.write_text(json.dumps({"seed": SEED, "final": final,
                                     "history": [transaction.to_json() for transaction in history]}))
        try:
            report.assert_ok()
        except AssertionError as error:
            problems.append(f"{error}\n(history and final lists saved to {saved})")
    if unended:
        # Every node must have committed or aborted once its top-level transaction ended.  A node
        # doomed by an ancestor's abort (or whose own lock request was a deadlock victim) whose body
        # then returns normally must end ABORTED, not stay ACTIVE (a top-level one keeping its locks).
        problems.append(f"{len(unended)} node(s) still not ended after their top-level transaction ended: "
                        f"{', '.join(unended[:10])}")
    assert not problems, "\n\n".join(problems)
    return report


def assert_exercised(report: testing.ListAppendReport, outcomes: dict, top_level: int) -> None:
    """The run did what it is meant to test (a vacuous history would pass any checker)."""
    statistics = report.statistics
    assert statistics.committed_top_level >= top_level // 6, statistics
    assert statistics.effectively_committed > statistics.committed_top_level, "no committed child"
    assert statistics.sibling_dependencies > 0, "children and parents never touched the same list"
    assert statistics.dependencies["wr"] > 0 and statistics.dependencies["rw"] > 0, statistics
    assert any("child aborted" in outcome for outcome in outcomes), outcomes


def test_one_process(db, tmp_path, representation):
    count = transactions(400)
    for_update = FOR_UPDATE.get(representation, 0.0)
    recorder = Workload(db, "p0", SEED, for_update).run(THREADS, count, WATCHDOG_TIMEOUT)
    history, unended = recorder.history()
    # With reads for update a tree's plain read of a row another tree's flush holds in PostgreSQL returns the last
    # committed image (txn README, "Reads for update"): such a tree may see two committed versions and fails its
    # flush, so only effectively committed reads are held to never going backwards, as across two processes.
    report = verify(db, tmp_path, history, errors=recorder.errors, unended=unended, outcomes=recorder.outcomes,
                    aborted_reads=not for_update)
    assert_exercised(report, recorder.outcomes, THREADS * count)


def test_two_processes(db, database_url, tmp_path, representation):
    count = transactions(350)
    for_update = FOR_UPDATE_TWO_PROCESSES.get(representation, 0.0)
    output = tmp_path / "p1-history.json"
    errors = tmp_path / "p1-stderr.txt"
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    with open(errors, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.scenarios._list_append_workload", database_url, "p1", SEED,
             str(THREADS), str(count), str(output), representation, str(for_update)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPOSITORY,
            env=environment)
        try:
            assert process.stdout.readline().strip() == f"ready {representation}", errors.read_text()
            process.stdin.write("go\n")      # both processes start their workers now
            process.stdin.flush()
            recorder: Recorder = Workload(db, "p0", SEED, for_update).run(
                THREADS, count, WATCHDOG_TIMEOUT)
            process.communicate(timeout=WATCHDOG_TIMEOUT + 30)
            assert process.returncode == 0, f"the second process failed:\n{errors.read_text()}"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    other = json.loads(output.read_text())
    history, unended = recorder.history()
    history += [RecordedTransaction.from_json(item) for item in other["history"]]
    outcomes = {f"p0 {what}": number for what, number in recorder.outcomes.items()}
    outcomes.update({f"p1 {what}": number for what, number in other["outcomes"].items()})
    # A tree whose flush will fail may have seen two committed versions of a row meanwhile (a scan
    # reads PostgreSQL afresh, a row read the image the tree relied on first): only committed reads
    # are held to never going backwards here.
    report = verify(db, tmp_path, history, errors=recorder.errors + other["errors"],
                    unended=unended + other["unended"], outcomes=outcomes, aborted_reads=False)
    assert_exercised(report, outcomes, 2 * THREADS * count)
    # The processes did interleave: a committed transaction of one depended on one of the other.
    assert any(edge_crosses_processes(source, target) for source, target in report.graphs["top level"].edges), \
        "the two processes never depended on each other"


def edge_crosses_processes(source: str, target: str) -> bool:
    return source.split("w", 1)[0] != target.split("w", 1)[0]
