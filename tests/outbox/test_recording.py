"""A tree whose commit outcome a lost connection hid (``activedb/outbox/README.md``, "The outcome is unknown"):
its detached-family firings are settled by its ``activedb_transaction_log`` row once PostgreSQL answers again —
run once, with the outcome the row says, never lost and never run for the outcome it did not have.

The connection breaks at the flush's COMMIT, on the package's own server (``conftest.py``): the commit that happened
is held at COMMIT by a synchronous-replication wait, when PostgreSQL has committed locally, and its backend is then
ended; the commit that did not happen has its backend ended just before its COMMIT.  Meanwhile the database accepts
no connection, so the flush cannot read the log."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

import activedb
from activedb import Coupling
from activedb.lowlevel import CommitParticipant
from tests.outbox.conftest import TIMEOUT, back, cut_off, wait_for_the_standby

MODES = (Coupling.DETACHED, Coupling.DETACHED_CAUSALLY_DEPENDENT, Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT)


class _BreaksAtCommit(CommitParticipant):
    """Breaks the flush's connection at its COMMIT: after PostgreSQL committed (``committed``: the COMMIT waits for
    the standby, and the test cuts the database off then) or just before it (cut off at ``about_to_commit``).
    ``back_at_abort``: the database takes connections again when the tree's abort reaches the participants (this
    one is enlisted before the outbox's), else later."""

    def __init__(self, embedded, committed: bool, back_at_abort: bool):
        self.embedded, self.commits, self.back_at_abort = embedded, committed, back_at_abort
        self.pid: int | None = None

    def write(self, transaction, connection):
        self.pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        if self.commits:
            connection.exec_driver_sql("SET LOCAL synchronous_commit = on")

    def acts_before_commit(self, transaction) -> bool:
        return not self.commits

    def about_to_commit(self, transaction, connection):
        cut_off(self.embedded)

    def aborted(self, transaction, error):
        if self.back_at_abort:
            back(self.embedded)


def _commit_whose_outcome_is_unknown(database, embedded, committed: bool, back_at_abort: bool, body,
                                     name: str | None = None):
    """Run ``body(tx)`` in a transaction (named ``name``) whose flush's connection breaks at its COMMIT, after
    PostgreSQL committed it or before (``_BreaksAtCommit``), the log unreadable; then, the database back, a recovery
    pass and the detached firings run.  Returns the commit's error and the tree's log id."""
    breaker = _BreaksAtCommit(embedded, committed, back_at_abort)
    outcome: dict[str, object] = {}

    def commit() -> None:
        try:
            with database.transaction(name=name, participants=[breaker]) as tx:
                outcome["log_id"] = tx.log_id
                body(tx)
        except BaseException as error:
            outcome["error"] = error

    committing = threading.Thread(target=commit)
    committing.start()
    if committed:
        wait_for_the_standby(embedded, lambda: breaker.pid)
        cut_off(embedded)
    committing.join(TIMEOUT)
    assert not committing.is_alive()
    error, log_id = outcome.get("error"), outcome["log_id"]
    # (``unknown_outcome``: the id a caller looks up)
    assert isinstance(error, activedb.DatabaseUnavailable) and error.unknown_outcome == log_id, error
    if not back_at_abort:
        back(embedded)
    database.outbox.recover()
    database.rules.wait_idle(TIMEOUT)
    return error, log_id


def _what_happened(database, log_id):
    """The tree's transaction-log rows (0 or 1), the rows the test's rules wrote, and the outbox's records."""
    with database.engine.connect() as connection:
        logged = connection.execute(sa.text("SELECT count(*) FROM activedb_transaction_log WHERE "
                                            "transaction_id = :id"), {"id": log_id}).scalar()
        seen = sorted(connection.execute(sa.text("SELECT rule, detail FROM events_seen")).all())
        records = sorted(connection.execute(sa.text(
            "SELECT rule, status, trigger_outcome FROM activedb_outbox")).all())
    return logged, seen, records


@pytest.mark.parametrize("back_at_abort", [False, True], ids=["back-later", "back-at-the-abort"])
@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_firings_of_a_commit_whose_outcome_is_unknown_run_once_for_the_outcome_the_log_shows(own_server, committed,
                                                                                             back_at_abort):
    home, embedded = own_server
    database = activedb.connect(home=home, outbox_options={"recovery_interval": None})
    try:
        with database.engine.begin() as connection:
            connection.execute(sa.text("TRUNCATE events_seen, activedb_outbox RESTART IDENTITY"))
        for mode in MODES:
            database.rule(on=database.signalled("go"), coupling=mode, name=mode.value)(
                lambda tx, event, name=mode.value: tx.insert("events_seen", rule=name, detail=event.payload["n"]))
        error, log_id = _commit_whose_outcome_is_unknown(database, embedded, committed, back_at_abort,
                                                         lambda tx: tx.signal("go", n="1"))
        assert "applied all of it or nothing" in str(error) and "activedb_transaction_log" in str(error), error
        logged, seen, records = _what_happened(database, log_id)
        assert logged == (1 if committed else 0)
        expected = ([Coupling.DETACHED.value, Coupling.DETACHED_CAUSALLY_DEPENDENT.value] if committed
                    else [Coupling.DETACHED.value, Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT.value])
        assert seen == [(rule, "1") for rule in expected]
        assert records == [(rule, "done", "committed" if committed else "aborted") for rule in expected]
        assert database.outbox.statistics().lost == 0
    finally:
        back(embedded)
        database.close()


@pytest.mark.parametrize("fires_detached", [False, True], ids=["fires-nothing-detached", "fires-a-detached-rule"])
@pytest.mark.parametrize("back_at_abort", [False, True], ids=["back-later", "back-at-the-abort"])
@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
@pytest.mark.parametrize("mode", [Coupling.DETACHED, Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT])
def test_rules_on_the_aborted_event_of_a_commit_whose_outcome_is_unknown_do_not_claim_an_abort(
        own_server, mode, committed, back_at_abort, fires_detached):
    """The flush's connection breaks at its COMMIT and the log cannot be read: the tree is aborted in memory only.  A
    rule on the transaction's ``aborted`` event waits for the tree's log row as the tree's own firings do: it never
    runs if the row shows the commit, and runs once if it does not — also for a tree that fired nothing detached
    (which has no outbox participant)."""
    home, embedded = own_server
    database = activedb.connect(home=home, outbox_options={"recovery_interval": None})
    try:
        with database.engine.begin() as connection:
            connection.execute(sa.text("TRUNCATE events_seen, activedb_outbox RESTART IDENTITY"))
        on_aborted = f"on_aborted_{mode.value}"       # (one rule per mode: a rule whose coupling changes warns)
        database.rule(on=database.transaction_event("aborted", "unsure"), coupling=mode, name=on_aborted)(
            lambda tx, event: tx.insert("events_seen", rule="on_aborted", detail="1"))
        database.rule(on=database.signalled("go"), coupling=Coupling.DETACHED, name="on_go")(
            lambda tx, event: tx.insert("events_seen", rule="on_go", detail="1"))

        def body(tx) -> None:
            tx.insert("events_seen", rule="the transaction", detail="1")
            if fires_detached:
                tx.signal("go")

        _, log_id = _commit_whose_outcome_is_unknown(database, embedded, committed, back_at_abort, body, "unsure")
        logged, seen, records = _what_happened(database, log_id)
        assert logged == (1 if committed else 0)
        ran = (["on_go"] if fires_detached else []) + (["the transaction"] if committed else ["on_aborted"])
        assert seen == sorted((rule, "1") for rule in ran), seen
        assert records == sorted((on_aborted if rule == "on_aborted" else rule, "done",
                                  "committed" if committed else "aborted")
                                 for rule in ran if rule != "the transaction"), records
        counters = database.rules.statistics().per_rule[on_aborted]
        assert (counters.executed, counters.cancelled) == ((0, 1) if committed else (1, 0)), counters
        statistics = database.outbox.statistics()
        assert (statistics.parked, statistics.lost) == (0, 0), statistics
    finally:
        back(embedded)
        database.close()
