"""A group of sibling subtransactions that may run concurrently (``run_group``: a priority group of rule firings on
threads), run one after another as frames by the thread that waits for them until another thread has to start one;
then the running frame becomes a node and the rest run as nodes.  Design: README, "Groups on threads".

The *guard* (``_Group.lock``) makes a frame safe to materialize from another thread: the waiting thread (the
*owner*) holds it whenever it is inside activedb code for the running frame, never while the frame's user code runs,
and another thread that starts a member (``_take_over``) takes it (README, "Groups on threads").

Thread-safety: ``_Group``'s ``concurrent``, ``next``, ``running`` and ``tasks`` change under ``lock``; ``inside``
and ``results[i]`` are written by the thread running the member concerned only.  Mutex order: a group's guard
before everything of the node's and the lock manager's (nothing that holds one of those takes a guard).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from activedb.errors import BadArgument
from activedb.txn import _help_edges
from activedb.txn._children import _ACTIVE, _COMMITTED, SubtransactionHandle, Subtransactions, _begin_inline, _run_body
from activedb.txn._pool import Task, WorkerPool
from activedb.txn._tree import Transaction

#: The running guarded frame -> its group (a frame is guarded only while it runs as a member of a group).
_GROUPS: dict[Transaction, "_Group"] = {}


class _Group:
    __slots__ = ("parent", "function", "arguments", "names", "numbers", "lock", "inside", "concurrent", "next",
                 "running", "tasks", "results", "token")

    def __init__(self, parent: Transaction, function: Callable[[Any, Any], Any], arguments: Sequence[Any],
                 names: Sequence[str | None]):
        self.parent = parent
        self.function = function
        self.arguments = arguments
        self.names = names
        # The members' numbers (ids), reserved in order as spawning them all at once would give them.
        ids = parent.manager._ids
        self.numbers = [next(ids) for _ in arguments]
        self.lock = threading.Lock()
        self.inside = False          # the owner holds ``lock`` for an operation of the running frame
        self.concurrent = False
        self.next = 0                # the first member nobody has started
        self.running: Transaction | None = None    # the owner's running frame, while it is one
        self.tasks: list[Task] = []  # the members left when the group became concurrent, one task each
        self.results: list[tuple[bool, Any] | None] = [None] * len(arguments)
        self.token: Task | None = None


def run_group(parent: Transaction, function: Callable[[Any, Any], Any], arguments: Sequence[Any],
              names: Sequence[str | None]) -> list[tuple[bool, Any]]:
    """Run ``function(child, argument)`` for each of ``arguments`` as a child of ``parent`` (named as ``names``
    says), as siblings that may run concurrently — what ``parent.spawn`` for each and a wait for all of them
    does — and return, in order, ``(True, value)`` or ``(False, error)`` for each.  Called by the thread running
    ``parent``, which waits for the whole group (README, "Groups on threads")."""
    if len(names) != len(arguments):    # (as frames a member past the names failed alone; as spawned ones, dropped)
        raise BadArgument(f"run_group(parent, function, arguments, names) names each member: {len(arguments)} "
                          f"arguments but {len(names)} names; give one name (or None) per argument")
    manager = parent.manager
    observers = manager.observers
    if (manager.subtransactions is not Subtransactions.FRAMES or len(arguments) < 2
            or observers.on_begin or observers.on_spawn or observers.on_commit or observers.on_abort
            or observers.on_wait_start or observers.on_wait_end):
        return _spawned(parent, function, arguments, names)
    if parent._doomed is not None or parent._state is not _ACTIVE:
        parent._check_active("starting a subtransaction")
    if parent._lazy:
        parent._materialize()       # (as a spawn does: its children need it in the tree)
    if parent._holds or parent._lazy_child is not None:
        manager.locking.release_holds(parent)
    if parent._children or parent._lazy_child is not None:
        return _spawned(parent, function, arguments, names)
    group = _Group(parent, function, arguments, names)
    pool = manager.pool
    group.token = pool.start(Task(_take_over, group))
    _run_frames(group, pool)
    # Concurrent now, or every member has started: the members nobody has started become tasks — taken by this
    # thread, or by the worker that took the token (it queues them and returns) — and run here unless a worker
    # has them.
    # Before this thread blocks, the edges of the children it helps (if it runs in one) are registered, as for
    # every wait of a node (``_help_edges``); its own edges to the members are theirs (``awaited``).
    token = group.token
    if token.cancel():         # (and the token no longer refers to the group: no cycle for the collector)
        if group.next < len(arguments):
            _take_rest(group)
    elif not token.done():
        _help_edges.flush()
        token.wait(None)
    tasks = group.tasks
    for task in tasks:
        task.help()
    pending = [task for task in tasks if not task.done()]
    if pending:
        _help_edges.flush()
        for task in pending:
            task.wait(None)
    return group.results     # type: ignore[return-value]


def _spawned(parent: Transaction, function: Callable[[Any, Any], Any], arguments: Sequence[Any],
             names: Sequence[str | None]) -> list[tuple[bool, Any]]:
    """The group as spawned children and one wait for all of them (the reference representation).  A member whose
    spawn is refused (the pool shut down meanwhile) has its refusal as its result, as a frame's has: the members
    spawned before it run and are waited for, not left running while the caller unwinds."""
    handles: list[SubtransactionHandle | BaseException] = []
    for argument, name in zip(arguments, names):
        try:
            handles.append(parent.spawn(function, argument, name=name))
        except BaseException as refused:
            handles.append(refused)
    SubtransactionHandle.wait_all([handle for handle in handles if isinstance(handle, SubtransactionHandle)])
    results: list[tuple[bool, Any]] = []
    for handle in handles:
        if not isinstance(handle, SubtransactionHandle):
            results.append((False, handle))
            continue
        try:
            results.append((True, handle.result()))
        except BaseException as error:
            results.append((False, error))
    return results


def _run_frames(group: _Group, pool: WorkerPool) -> None:
    """Run members on the owner's thread, one after another, as guarded frames until the group is concurrent or
    every member has started.  The guard is held from one member's end to the next one's start (one acquire
    for both), and given up while a member's user code runs."""
    lock, parent, function, arguments = group.lock, group.parent, group.function, group.arguments
    results = group.results
    count = len(arguments)
    manager = parent.manager
    lock.acquire()
    group.inside = True
    while not group.concurrent and group.next < count:
        index = group.next
        group.next = index + 1
        try:
            child = _begin_inline(parent, group.names[index], group.numbers[index], lean=False)
        except BaseException as refused:
            results[index] = (False, refused)
            continue
        if child._frame:
            child.__class__ = GuardedFrame
            _GROUPS[child] = group
            group.running = child
        else:                    # (not a frame after all: a node from the start, so the rest are nodes too)
            if child._lazy:
                child.manager.locking.materialize_now(child)
            group.concurrent = True
        pool.activity += 1       # progress, for the pool's waker (as a claimed task counts)
        group.inside = False
        lock.release()
        error: BaseException | None = None
        try:
            value = function(child, arguments[index])
        except BaseException as caught:
            error = caught
        try:
            # Its end: under the guard while it is a frame (a commit that materializes it gives the guard up
            # there: ``_materialize_guarded``), without it once it is a node (its end may run user code).
            if child.__class__ is GuardedFrame:
                lock.acquire()
                group.inside = True
                if child.__class__ is not GuardedFrame:     # another thread made it a node meanwhile
                    group.inside = False
                    lock.release()
            try:
                if error is None:
                    if child._state is not _COMMITTED:     # (unless the function committed it itself)
                        Transaction.commit(child)
                    results[index] = (True, value)
                else:
                    Transaction.abort(child, error)
                    results[index] = (False, error)
            except BaseException as caught:
                results[index] = (False, caught)
        finally:
            manager._local.running.pop()       # (``_begin_inline`` pushed it: ``pop_running`` without its call)
            if not group.inside:
                lock.acquire()
                group.inside = True
            if child.__class__ is GuardedFrame:
                _unguard(child, group)
    group.inside = False
    lock.release()


def _unguard(frame: Transaction, group: _Group) -> None:
    """``frame`` is no longer a guarded member (it ended, or it is a node now).  Caller holds the guard."""
    frame.__class__ = Transaction
    _GROUPS.pop(frame, None)
    if group.running is frame:
        group.running = None


def _take_rest(group: _Group) -> None:
    """The group is concurrent: every member nobody has started becomes a task (queued: a thread waiting for
    it, or a worker, runs it), listed in ``group.tasks``."""
    with group.lock:
        group.concurrent = True
        first, group.next = group.next, len(group.arguments)
        tasks = [Task(_run_node, group, index) for index in range(first, len(group.arguments))]
        group.tasks.extend(tasks)
    pool = group.parent.manager.pool
    for task in tasks:
        pool.start(task)


def _take_over(group: _Group) -> None:
    """The group's token, run by another thread than the owner (a worker given it because the owner blocked, or
    the pool sat idle): the group becomes concurrent — the owner's running frame a node, under the guard — and
    the members nobody has started become tasks."""
    with group.lock:
        group.concurrent = True
        frame = group.running
        if frame is not None:
            if frame._state is _ACTIVE and frame._lazy:
                try:
                    frame.manager.locking.materialize_now(frame)
                except BaseException as error:
                    # (An ancestor's abort reached the lock manager first: TransactionAborted.)  The frame stays the
                    # owner's, guarded, and ends as its own; every member nobody has started ends with the error,
                    # unstarted — their parent's tree is aborted — so that each has a result.
                    first, group.next = group.next, len(group.arguments)
                    for index in range(first, len(group.arguments)):
                        group.results[index] = (False, error)
                    raise
            _unguard(frame, group)
    _take_rest(group)     # (queued: this worker's next task is likely the first of them)


def _run_node(group: _Group, index: int) -> None:
    """Member ``index`` of a concurrent group as a node of its own, on the calling thread (what a spawned
    child's task does, with the child made when it starts)."""
    parent = group.parent
    manager = parent.manager
    try:
        if parent._doomed is not None or parent._state is not _ACTIVE:
            parent._check_active("starting a subtransaction")
        # An inline child's registration (the parent waits for it for its whole life: ``awaited``), not lazy.
        node = Transaction(manager, parent, group.names[index], None, True, False, group.numbers[index])
    except BaseException as error:
        group.results[index] = (False, error)
        return
    with parent._mutex:
        if not parent._children:
            parent._children = {}
        parent._children[node.id] = node
    if manager.recorder:
        manager.recorder.record("spawn", parent.id, root=parent.root.id, detail=node.id)
    # (An observer of node events makes a group spawned children from its start; this is for one that came since.)
    if manager.observers.on_spawn:
        manager.observers.call("on_spawn", parent, node)
    try:        # what a spawned child's task runs: the hooks of its begin, the function, commit or abort
        group.results[index] = (True, _run_body(node, group.function, (group.arguments[index],), {}))
    except BaseException as error:
        group.results[index] = (False, error)


def _bracketed(name: str) -> Callable[..., object]:
    method = getattr(Transaction, name)

    def bracketed(self: Transaction, *args: object, **kwargs: object) -> object:
        group = _GROUPS.get(self)
        if group is None or group.inside:       # a node again, or an operation inside another one
            return method(self, *args, **kwargs)
        lock = group.lock
        lock.acquire()
        group.inside = True
        try:
            if self.__class__ is not GuardedFrame:   # another thread made it a node while this one waited
                group.inside = False
                lock.release()
            return method(self, *args, **kwargs)
        finally:
            if group.inside:        # (not given up meanwhile by a materialization: ``_materialize_guarded``)
                group.inside = False
                lock.release()

    bracketed.__name__ = bracketed.__qualname__ = name
    bracketed.__doc__ = method.__doc__
    return bracketed


class GuardedFrame(Transaction):
    """A running member of a group run as frames: a frame whose operations take the group's guard (the module
    docstring).  Its class goes back to :class:`Transaction` when it ends or materializes, so no other node pays
    for the guard."""

    __slots__ = ()
    _guarded = True

    def _materialize_guarded(self) -> None:
        """``Locking.materialize`` of this frame: by its own thread, inside an operation (it holds the guard) or
        outside one (it takes the guard); afterwards it is a node and the guard is free.  The group stays
        sequential: while this node runs, a worker that takes the group over starts the rest as nodes beside it
        (nothing to materialize); if none has when it ends, the next member is a frame again (the parent has no
        live child then)."""
        group = _GROUPS.get(self)
        if group is None:              # a node already (another thread materialized it meanwhile)
            if self._lazy:
                self.manager.locking.materialize_now(self)
            return
        held = group.inside
        if not held:
            group.lock.acquire()
        try:
            if self.__class__ is GuardedFrame:
                if self._lazy:
                    self.manager.locking.materialize_now(self)
                _unguard(self, group)
        finally:
            group.inside = False
            group.lock.release()


for _name in ("read", "_read_then_written", "prefetch", "read_many", "scan", "write", "insert", "delete", "write_many",
              "signal", "emit", "_enlist", "commit", "abort", "spawn", "_want_end_hooks", "_wait_children"):
    setattr(GuardedFrame, _name, _bracketed(_name))
del _name
