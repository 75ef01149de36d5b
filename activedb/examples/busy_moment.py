"""A busy moment of a process, held still so that ``db.explain()`` can draw it: the picture of the how-to
docs/howto/explain.md (``docs/explain.png``) and a test of the picture use it; which transactions wait for
what: this package's ``README.md``.

:func:`hold` sets the moment up and returns a handle whose ``release()`` lets everything finish.  Run
``python -m activedb.examples.busy_moment OUT.png`` to draw it (on ``ACTIVEDB_DATABASE_URL`` or the
embedded database).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from dataclasses import dataclass, field

from activedb import Coupling
from activedb.examples.hand_hygiene import MIGRATIONS
from activedb.testing import wait_until

TIMEOUT = 30.0
RULE = "light_badge"


@dataclass
class BusyMoment:
    """The running moment: the threads, the ids of its transactions, and how to end it."""

    ids: dict[str, str] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    _release: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def release(self, timeout: float = TIMEOUT) -> None:
        """Let every transaction of the moment finish, and wait for them."""
        self._release.set()
        for thread in self._threads:
            thread.join(timeout)
        if self.errors:
            raise self.errors[0]


def hold(db) -> BusyMoment:
    """Set the moment up on ``db`` (its hand-hygiene tables are created if needed) and return it once every
    wait described in this package's README.md is in the lock manager's graph."""
    db.upgrade_app(MIGRATIONS)
    with db.transaction() as tx:
        for worker in ("w1", "w2"):
            tx.write("worker_status", worker, status="safe", changes=0)
    moment = BusyMoment()
    if RULE in db.rules.names():
        db.rules.remove(RULE)
    db.rule(on=db.signalled("status_changed"), when=lambda tx, event: moment._release.wait(TIMEOUT),
            coupling=Coupling.IMMEDIATE, action_coupling=Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT, name=RULE)(
        lambda tx, event: tx.insert("badge_lights", worker=event.payload["worker"], color="yellow",
                                    status="warning", at=0.0))
    holding = threading.Event()
    locks = db.transactions.locks

    def run(name, body) -> None:
        def target() -> None:
            try:
                with db.transaction(name=name) as tx:
                    moment.ids[name] = tx.id
                    body(tx)
            except BaseException as error:  # reported by release()
                moment.errors.append(error)
        thread = threading.Thread(target=target, name=name, daemon=True)
        moment._threads.append(thread)
        thread.start()

    def badges(tx) -> None:
        with tx.subtransaction(name="event:enter w1") as first:
            first.write("worker_status", "w1", status="warning", changes=1)

        def second(child) -> None:
            moment.ids["event:exit w2"] = child.id
            child.write("worker_status", "w2", status="violation", changes=1)
            holding.set()
            moment._release.wait(TIMEOUT)
        tx.spawn(second, name="event:exit w2").result(TIMEOUT)

    run("T-badges", badges)
    if not holding.wait(TIMEOUT):
        raise TimeoutError("the badge transaction never got its rows")
    run("T-light", lambda tx: tx.signal("status_changed", worker="w1"))
    wait_until(lambda: any(kind == "dependency" for targets in locks.snapshot().waits.values()
                           for kind, _ in targets.values()),
               TIMEOUT, "the rule's action never waited for its condition")
    run("T-report", lambda tx: tx.read("worker_status", "w1"))
    wait_until(lambda: locks.statistics().waiting >= 1, TIMEOUT, "T-report never waited")
    run("T-cleanup", lambda tx: tx.write("worker_status", "w2", room=None))
    wait_until(lambda: locks.statistics().waiting >= 2, TIMEOUT, "T-cleanup never waited")
    run("T-audit", lambda tx: tx.read("worker_status", "w2"))
    wait_until(lambda: locks.statistics().waiting >= 3, TIMEOUT, "T-audit never waited")
    return moment


def main(argv: list[str]) -> int:
    import activedb

    if len(argv) != 1:
        print("usage: python -m activedb.examples.busy_moment OUT.png|OUT.svg", file=sys.stderr)
        return 2
    db = activedb.connect()
    try:
        moment = hold(db)
        try:
            explanation = db.explain()
        finally:
            moment.release()
        explanation = dataclasses.replace(explanation, title="activedb explain: a busy moment")
        print(explanation.text())
        print(f"wrote {explanation.render(argv[0])}")
        db.rules.wait_idle(TIMEOUT)
    finally:
        db.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
