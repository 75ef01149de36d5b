"""The tests' sequential reference model of Rules 1–5, over plain dicts.

The model is deliberately naive -- a dict of held modes and a dict of retained modes keyed by
(transaction, resource), the rules written as directly as Concurrent Rule Execution §3.1 states them, with
eager inheritance -- and shares no code with lockmgr except the conflict table (which test_lock_rules checks
against the textbook matrix).  ``test_lock_model`` runs the manager against it under Hypothesis,
``test_lock_lazy_inheritance`` checks that lazy inheritance decides as it does, and ``test_lock_stress``
recomputes ancestries with :func:`ancestors`.
"""

from __future__ import annotations

from lockmgr import Mode, conflicts, join


def ancestors(parent: dict, tid: str) -> set[str]:
    """``tid``'s proper ancestors, following ``parent`` (None above a top-level transaction)."""
    result = set()
    node = parent[tid]
    while node is not None:
        result.add(node)
        node = parent[node]
    return result


class ReferenceModel:
    """Rules 1–5 over plain dicts.  ``parent[tid]`` is None for a top-level transaction."""

    def __init__(self) -> None:
        self.parent: dict[str, str | None] = {}
        self.active: set[str] = set()
        self.held: dict[tuple[str, str], Mode] = {}
        self.retained: dict[tuple[str, str], Mode] = {}

    def begin(self, tid: str, parent: str | None) -> None:
        self.parent[tid] = parent
        self.active.add(tid)

    def ancestors(self, tid: str) -> set[str]:
        return ancestors(self.parent, tid)

    def children(self, tid: str) -> set[str]:
        return {child for child in self.active if self.parent[child] == tid}

    def descendants(self, tid: str) -> set[str]:
        result = set()
        stack = [tid]
        while stack:
            for child in self.children(stack.pop()):
                result.add(child)
                stack.append(child)
        return result

    def allows(self, tid: str, resource: str, mode: Mode) -> bool:
        """Rule 1 (for an upgrade, the mode asked for is the join with the mode already held)."""
        current = self.held.get((tid, resource))
        wanted = mode if current is None else join(current, mode)
        for (other, other_resource), other_mode in self.held.items():
            if other_resource == resource and other != tid and conflicts(other_mode, wanted):
                return False
        ancestors = self.ancestors(tid)
        for (other, other_resource), other_mode in self.retained.items():
            if other_resource == resource and other != tid and other not in ancestors and conflicts(other_mode, wanted):
                return False
        return True

    def grant(self, tid: str, resource: str, mode: Mode) -> None:
        current = self.held.get((tid, resource))
        self.held[(tid, resource)] = mode if current is None else join(current, mode)

    def commit(self, tid: str) -> None:
        """Rule 2 (subtransaction) or Rule 3 (top level)."""
        parent = self.parent[tid]
        for store in (self.held, self.retained):
            for (owner, resource), mode in list(store.items()):
                if owner != tid:
                    continue
                del store[(owner, resource)]
                if parent is not None:
                    previous = self.retained.get((parent, resource))
                    self.retained[(parent, resource)] = mode if previous is None else join(previous, mode)
        self.active.discard(tid)

    def abort(self, tid: str) -> None:
        """Rule 4, for tid and its active descendants."""
        doomed = {tid} | self.descendants(tid)
        for store in (self.held, self.retained):
            for key in [key for key in store if key[0] in doomed]:
                del store[key]
        self.active -= doomed

    def downgrade(self, tid: str, resource: str, mode: Mode) -> None:
        """Rule 5."""
        current = self.held[(tid, resource)]
        self.held[(tid, resource)] = mode
        previous = self.retained.get((tid, resource))
        self.retained[(tid, resource)] = current if previous is None else join(previous, current)
