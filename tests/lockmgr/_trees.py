"""Builders and readers the lock manager's tests share: a manager with a tree of transactions begun, and
the lock table of one resource as plain dicts."""

from __future__ import annotations

from lockmgr import LockManager


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
