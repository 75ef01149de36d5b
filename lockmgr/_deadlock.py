"""Deadlock resolution (design note §8): what a found cycle is made of, which waiter is the victim, and telling it.

It never reads the manager: every function is given the path, the policy, the graph mutex and a
``resource_count(node)`` function, and changes nothing in the graph.  Mutex order: callers hold the graph
mutex (and no stripe mutex); :func:`choose_victim` releases it while a callable policy runs.
:class:`VictimNotifier` runs ``on_victim`` callbacks on its own thread with no mutex held.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from typing import TYPE_CHECKING, Callable, Hashable, TypeAlias, cast

from lockmgr._graph import edge_kind
from lockmgr._records import DeadlockCycle, VictimCandidate
from lockmgr.errors import Deadlock, Lazy, WaitEdge

if TYPE_CHECKING:
    from lockmgr._manager import ExternalWait
    from lockmgr._table import _Request, _Txn

    #: What a node waits on behind one edge: its lock request or one of its registered waits.
    Wait: TypeAlias = "_Request | ExternalWait"



class VictimPolicy(enum.StrEnum):
    """Which waiting transaction of a deadlock cycle is told (gets ``Deadlock``); ``LockManager`` also takes
    a callable ``policy(cycle: DeadlockCycle) -> tid``.  A member compares equal to its value, and
    ``LockManager(victim_policy="youngest")`` is accepted for ``VictimPolicy.YOUNGEST``."""

    REQUESTER = "requester"            # the one whose new wait edge closed the cycle (the paper's choice)
    YOUNGEST = "youngest"              # the latest ``begin``
    SMALLEST_TREE = "smallest_tree"    # fewest transactions in its subtree, then fewest locks


#: The policies' names (``VictimPolicy``'s values).
VICTIM_POLICIES = tuple(policy.value for policy in VictimPolicy)


def wait_of(node: _Txn, following: _Txn) -> Wait | None:
    """The wait behind the edge ``node -> following``: its lock request, a registered wait, or None (a
    commit edge).  A lock request is the node's ``request``; anything else returned is a registered wait."""
    request = node.request
    if request is not None and following in node.waits:
        return request
    return next((wait for wait in node.external if following in wait.targets), None)


def queue_jumper(path: list[_Txn]) -> _Txn | None:
    """The node of the cycle ``path`` that is blocked by ``queued`` edges alone and whose request goes first
    to break it (no victim needed), or None when the cycle is not only a queueing artefact."""
    for index, node in enumerate(path):
        following = path[(index + 1) % len(path)]
        if edge_kind(node, following) == "queued" and all(kind == "queued" for kind in node.waits.values()):
            return node
    return None


class Cycle:
    """A deadlock cycle described for victim choice and for the ``Deadlock`` error.

    ``edges`` are the node pairs along the cycle, ``kinds`` their edge kinds, ``waits`` the wait behind each
    edge (:func:`wait_of`), ``wait_edges`` the public :class:`~lockmgr.errors.WaitEdge` tuple, ``candidates``
    the nodes that can be told (a lock waiter, a registered waiter with ``on_victim``, or ``source`` itself,
    the wait whose new edge closed the cycle: ``add_wait`` raises), ``requester`` the candidate whose new
    edge closed the cycle (or the first candidate; None if nobody can be told), ``volunteer`` the first
    candidate that registered its wait with ``preferred_victim=True`` (or None).
    """

    __slots__ = ("edges", "kinds", "waits", "wait_edges", "candidates", "requester", "volunteer")

    def __init__(self, path: list[_Txn], requester: _Txn, source: Wait) -> None:
        self.edges = [(node, path[(index + 1) % len(path)]) for index, node in enumerate(path)]
        self.kinds = [edge_kind(node, following) for node, following in self.edges]
        self.waits = [wait_of(node, following) for node, following in self.edges]
        self.wait_edges = tuple(
            WaitEdge(node.tid, following.tid, kind,
                     node.request.lock.resource if wait is not None and wait is node.request else None)
            for (node, following), kind, wait in zip(self.edges, self.kinds, self.waits)
        )
        self.candidates = [
            node for (node, _), wait in zip(self.edges, self.waits)
            if wait is not None
            and (wait is node.request or cast("ExternalWait", wait).on_victim is not None or wait is source)
        ]
        self.requester = requester if requester in self.candidates else next(iter(self.candidates), None)
        self.volunteer = next(
            (node for (node, _), wait in zip(self.edges, self.waits)
             if node in self.candidates and wait is not node.request and cast("ExternalWait", wait).preferred),
            None,
        )

    def wait_of_victim(self, victim: _Txn) -> Wait:
        """The wait through which ``victim`` (a candidate) is told: its lock request or its registered wait."""
        wait = self.waits[[node for node, _ in self.edges].index(victim)]
        assert wait is not None, "a candidate waits"
        return wait

    def still_there(self) -> bool:
        """True if every edge of the cycle still exists with the same kind (after the graph mutex was
        released while a callable policy ran)."""
        for (node, following), kind in zip(self.edges, self.kinds):
            if kind == "commit":
                if following not in node.children:
                    return False
            elif wait_of(node, following) is None or edge_kind(node, following) != kind:
                return False
        return True


def choose_victim(policy: "VictimPolicy | Callable[[DeadlockCycle], Hashable]", cycle: Cycle,
                  graph_mutex: threading.Lock, resource_count: Callable[[_Txn], int]
                  ) -> tuple[_Txn | None, "Lazy | str"]:
    """``(victim, note)`` for ``cycle`` (which has a requester): a volunteer first, then the policy.
    ``note`` explains an override.  Returns ``(None, "")`` if the cycle changed while a callable policy ran
    with ``graph_mutex`` released: the caller looks for a cycle again.  Caller holds ``graph_mutex``."""
    if cycle.volunteer is not None:
        return cycle.volunteer, Lazy("(it volunteered: its work is re-run after the wait)")
    requester, candidates = cycle.requester, cycle.candidates
    assert requester is not None, "choose_victim is called for a cycle with a requester"
    if policy is VictimPolicy.REQUESTER:
        return requester, ""
    if policy is VictimPolicy.YOUNGEST:
        return max(candidates, key=lambda node: node.serial), ""
    if policy is VictimPolicy.SMALLEST_TREE:
        return min(candidates, key=lambda node: (subtree_size(node), resource_count(node), -node.serial)), ""
    description = DeadlockCycle(edges=cycle.wait_edges, requester=requester.tid, candidates=tuple(
        VictimCandidate(node.tid, node.serial, node.depth, subtree_size(node), resource_count(node))
        for node in candidates))
    note: Lazy | str = ""
    graph_mutex.release()
    try:
        choice = policy(description)
    except Exception as error:  # a broken policy must not leave the cycle in place
        choice, note = None, Lazy("(victim policy raised {!r}; the requester was chosen instead)", error)
    finally:
        graph_mutex.acquire()
    if not cycle.still_there():
        return None, ""
    for node in candidates:
        if node.tid == choice:
            return node, note
    if not note:
        note = Lazy("(victim policy returned {!r}, not a waiting member of the cycle; the requester was chosen)",
                    choice)
    return requester, note


def policy_name(policy: "VictimPolicy | Callable[[DeadlockCycle], Hashable]") -> str:
    """The policy as ``Deadlock`` reports it: its name, or the callable's ``__name__``."""
    return policy.value if isinstance(policy, VictimPolicy) else getattr(policy, "__name__", "callable")


def subtree_size(node: _Txn) -> int:
    """How many active transactions the subtree of ``node`` has (``node`` included)."""
    size = 0
    stack = [node]
    while stack:
        current = stack.pop()
        size += 1
        stack.extend(current.children)
    return size


class VictimNotifier:
    """Tells victims that are registered waits: ``tell(on_victim, error)`` queues the call, and one daemon
    thread (started on first ``start()``) runs it with no mutex held, so that no callback runs inside the
    lock manager.  A callback that raises is logged and does not stop the thread."""

    def __init__(self) -> None:
        self._notices: queue.SimpleQueue[tuple[Callable[[Deadlock], None], Deadlock]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_mutex = threading.Lock()

    def start(self) -> None:
        """Start the thread if it is not running (any thread, any mutex held or not)."""
        if self._thread is None:
            self._start_thread()

    def _start_thread(self) -> None:
        with self._start_mutex:
            if self._thread is not None:       # (another thread started it since start() looked)
                return
            thread = threading.Thread(target=self._run, name="lockmgr-notifier", daemon=True)
            thread.start()
            self._thread = thread

    def tell(self, on_victim: Callable[[Deadlock], None], error: Deadlock) -> None:
        self._notices.put((on_victim, error))

    def _run(self) -> None:
        while True:
            callback, error = self._notices.get()
            try:
                callback(error)
            except Exception:  # a broken callback must not stop the notifier
                logging.getLogger("lockmgr").exception("on_victim callback raised")
