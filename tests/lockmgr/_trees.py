"""Builders and readers the lock manager's tests share: a manager with a tree of transactions begun, the
lock table of one resource as plain dicts, and a commit as a step of a ``Scenario``."""

from __future__ import annotations

from lockmgr import LockManager
from lockmgr.testing import Scenario, Step


def manager(*tids: str, **options) -> LockManager:
    """A ``LockManager(**options)`` with ``tids`` begun in order; a dotted name is a subtransaction of the
    name before its last dot ("T.1" of "T", "T1.a.b" of "T1.a"), any other a top-level transaction."""
    lm = LockManager(**options)
    for tid in tids:
        parent, dot, _ = tid.rpartition(".")
        lm.begin(tid, parent if dot else None)
    return lm


def held(lm: LockManager, resource) -> dict:
    return dict(lm.holders(resource).held)


def retained(lm: LockManager, resource) -> dict:
    return dict(lm.holders(resource).retained)


def commits(scenario: Scenario, tid: str, *released: Step) -> None:
    """A step of ``scenario``: ``tid`` commits (on a session of its own); then each of ``released``, blocked
    until now, must complete."""
    scenario.run(tid, f"{tid} commits", lambda: scenario.lm.commit(tid))
    for step in released:
        scenario.finish(step)
