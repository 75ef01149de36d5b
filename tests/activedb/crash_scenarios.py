"""Crash scenarios of the detached family: every coupling mode x {trigger commits, trigger aborts} x
{crash before, during, after the trigger's decisive end}.

``python -m tests.activedb.crash_scenarios URL`` runs every scenario in its own thread of one process.
Each scenario's trigger (a top-level transaction named after it) writes ``items[name]`` and signals
``name``; the scenario's rule (coupling = its mode) inserts ``events_seen(rule=name)``.  Each thread stops
at its crash point and prints ``reached NAME``:

* ``before`` — inside the trigger's body, before it commits or aborts;
* ``during`` — inside the PostgreSQL transaction that would make the outcome durable, before its COMMIT:
  the trigger's flush (commits: a commit participant stops at ``about_to_commit``, which the flush calls
  after everything was written and before a COMMIT of its own), or the outbox's own record of the firings
  of the aborted tree (aborts: SQLAlchemy's commit event, before the DBAPI COMMIT; a mode with nothing to
  record there just ends);
* ``after`` — the outcome is durable; every detached rule firing is held before it runs.

The parent SIGKILLs the process once every scenario reached its point, then recovers in another process
(:func:`register` the same rules, ``db.outbox.recover()``) and checks what each mode promises.
"""

from __future__ import annotations

import itertools
import sys
import threading

import sqlalchemy as sa

from activedb import CommitParticipant, Coupling, Observer

MODES = (Coupling.DETACHED, Coupling.DETACHED_CAUSALLY_DEPENDENT, Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT,
         Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT)
OUTCOMES = ("commits", "aborts")
POINTS = ("before", "during", "after")
SCENARIOS = [(mode, outcome, point) for mode, outcome, point in itertools.product(MODES, OUTCOMES, POINTS)]


def name_of(mode: Coupling, outcome: str, point: str) -> str:
    return f"{mode.value}-{outcome}-{point}"


def register(db) -> None:
    for mode, outcome, point in SCENARIOS:
        name = name_of(mode, outcome, point)

        def effect(tx, event, name=name):
            tx.insert("events_seen", rule=name, detail=event.transaction)

        db.rule(on=db.signalled(name), coupling=mode, name=name)(effect)


class _TriggerAborts(Exception):
    pass


class _HoldDetached(Observer):
    """Every detached-family firing is held before it runs (the ``after`` point)."""

    def on_firing_start(self, transaction, firing) -> None:
        if firing.coupling.runs_as_top_level:
            threading.Event().wait()


def main(url: str) -> None:
    import activedb
    from tests._lines import dump_stacks_on_request

    dump_stacks_on_request()       # a parent that waits in vain for our lines gets every thread's stack

    db = activedb.connect(url, outbox_options={"recovery_interval": None})
    register(db)
    db.observe(_HoldDetached())
    armed = threading.local()
    report_mutex = threading.Lock()

    def report(name: str) -> None:
        with report_mutex:
            print(f"reached {name}", flush=True)

    class StopBeforeCommit(CommitParticipant):
        """Inside the trigger's flush, everything written, before its COMMIT."""

        def __init__(self, name: str) -> None:
            self.name = name

        def about_to_commit(self, transaction, connection) -> None:
            report(self.name)
            threading.Event().wait()

    def on_commit(connection) -> None:       # SQLAlchemy's commit event: before the DBAPI COMMIT
        name = getattr(armed, "name", None)
        # (A connection in autocommit makes nothing durable at its commit: it ended a one-statement read, such
        # as the outbox's look-up of its table's sequence before it records the firings.)
        if name is not None and connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            armed.name = None
            report(name)
            threading.Event().wait()

    sa.event.listen(db.engine, "commit", on_commit)

    def scenario(mode: Coupling, outcome: str, point: str) -> None:
        name = name_of(mode, outcome, point)
        try:
            stop = [StopBeforeCommit(name)] if (point, outcome) == ("during", "commits") else []
            with db.transaction(name=name, participants=stop) as tx:
                tx.write("items", name, value=1)
                tx.signal(name)
                if point == "before":
                    report(name)
                    threading.Event().wait()
                if (point, outcome) == ("during", "aborts"):
                    armed.name = name          # the next COMMIT of this thread makes the outcome durable
                if outcome == "aborts":
                    raise _TriggerAborts(name)
        except _TriggerAborts:
            pass
        except BaseException as error:         # the parent waits for every scenario's line: tell it at once
            with report_mutex:
                print(f"failed {name}: {error!r}", flush=True)
            raise
        armed.name = None
        report(name)                           # "after" (and "during" when there was nothing to record)

    threads = [threading.Thread(target=scenario, args=spec, daemon=True) for spec in SCENARIOS]
    for thread in threads:
        thread.start()
    threading.Event().wait()                   # until SIGKILL


if __name__ == "__main__":
    main(sys.argv[1])
