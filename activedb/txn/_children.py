"""A node's children (``Children``, a mixin of :class:`~activedb.txn.Transaction`, stateless): spawned ones
(``spawn`` → :class:`SubtransactionHandle`), inline ones (lazy when they can be, README "Lazy inline
subtransactions"), and waiting for them (holds become retains first; the wait is an edge of the wait-for graph).
"""

from __future__ import annotations

import logging
import threading
import time
import types
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from lockmgr import TxnState

from activedb._closedset import ClosedSet
from activedb.errors import (BadArgument, DeadlockDetected, RuleFailed, SerializationConflict, WaitTimeout, causes,
                             check_call_fits, check_plain_function, check_seconds, check_switch, check_whole_number)
from activedb.txn._hooks import WaitKind
from activedb.txn._pool import Task

if TYPE_CHECKING:  # pragma: no cover
    from activedb.txn._manager import TransactionManager
    from activedb.txn._tree import Transaction

logger = logging.getLogger("activedb.transaction")

# A node's children or tasks until its first: read-only, typed as the dict it stands for (copy on write: the
# first use installs a dict of the node's own).
_EMPTY: Any = types.MappingProxyType({})
# Enum members as module constants: a class attribute lookup of an Enum member costs several times a
# global's, and the hot path of a firing tests states a dozen times.
_ACTIVE, _COMMITTING, _COMMITTED, _ABORTED = (TxnState.ACTIVE, TxnState.COMMITTING, TxnState.COMMITTED,
                                             TxnState.ABORTED)


class Subtransactions(ClosedSet):
    """How inline subtransactions are represented (``TransactionManager.subtransactions``; README, "Lazy
    inline subtransactions", "Frames" and "The lean run"): ``FRAMES`` is equivalent to the reference
    ``MATERIALIZED``, which the equivalence tests check.  ``TransactionManager(subtransactions=...)`` chooses it
    (default ``FRAMES``)."""

    FRAMES = "frames"              # a savepoint or a frame when it can be one, else lazy, else registered
    MATERIALIZED = "materialized"  # every node registered in the lock manager from its start (the reference)


_FRAMES = Subtransactions.FRAMES

# The lean run (``_lean.py``, README "The lean run"), installed by that module when it is imported (it subclasses the
# transaction, which this module's mixin is part of).
Savepoint: type = type(None)
open_savepoint: Callable[..., "Transaction | None"]
end_savepoint: Callable[["Transaction"], None]


def _wait_seconds(owner: str, timeout: float | None) -> float | None:
    """``timeout`` given to ``owner(timeout=...)`` as a thread's wait takes it: None (no limit) for None and for what no
    wait can be bounded by (infinity); anything but a number of at least 0 is a :class:`BadArgument` (a lock's
    ``acquire`` would read -1 as "for ever", NaN and other negative numbers as a bare ValueError)."""
    check_seconds(owner, "timeout", timeout, none="wait without limit")
    return None if timeout is None or timeout >= threading.TIMEOUT_MAX else timeout


class SubtransactionHandle:
    """The handle ``spawn`` returns: ``result(timeout)``, ``wait(timeout)``, ``done()``, ``state``."""

    def __init__(self, transaction: "Transaction", task: Task):
        self.transaction = transaction
        self._task = task

    @property
    def state(self) -> TxnState:
        return self.transaction.state

    def done(self) -> bool:
        return self._task.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the subtransaction ended (runs it here if no worker started it).  The wait is an edge of the
        wait-for graph: if it closes a cycle and is the victim, ``DeadlockDetected`` is raised and the
        subtransaction goes on (``state`` says so) — wait again later, or let the parent's commit wait for it.
        ``timeout``: seconds (infinity, like None, waits without limit)."""
        return self._wait(_wait_seconds("handle.wait", timeout))

    def _wait(self, timeout: float | None) -> bool:
        """``wait`` of a checked timeout (``_wait_seconds``)."""
        task = self._task
        if task.done():
            return True
        child = self.transaction
        manager = child.manager
        observers = manager.observers
        if not observers.on_wait_start and not observers.on_wait_end and task.claim_to_help():
            # Nobody has started it: this thread runs it, and the wait's edge is registered only if the
            # thread blocks meanwhile (README, "A helped child's wait edge, registered when needed").
            # (A spawned child has its parent: ``child.parent`` is never None here and below.)
            with manager.waiting(child.parent, WaitKind.CHILDREN, child.id,  # type: ignore[arg-type]
                                 helps=True, late=True):
                task.run_claimed()
            return True
        with manager.waiting(child.parent, WaitKind.CHILDREN, child.id, helps=True):  # type: ignore[arg-type]
            return task.wait(timeout)

    @staticmethod
    def wait_all(handles: "list[SubtransactionHandle]") -> None:
        """Wait until every one of ``handles`` (children of one parent) ended, running queued ones in this
        thread: one wait of the parent for all of them (one registration in the wait-for graph, with an
        edge to each), not one per handle."""
        handles = list(handles)     # (read twice below: a generator would be empty the second time)
        parents = {id(handle.transaction.parent): handle.transaction.parent for handle in handles}
        if len(parents) > 1:
            raise BadArgument(f"SubtransactionHandle.wait_all takes children of one parent; these have "
                              f"{len(parents)} parents ({', '.join(str(parent) for parent in parents.values())}): "
                              f"call wait_all once per parent's children")
        pending = [handle for handle in handles if not handle._task.done()]
        if not pending:
            return
        if len(pending) == 1:
            pending[0].wait()
            return
        parent: Transaction = pending[0].transaction.parent  # type: ignore[assignment]  # (children: a parent)
        manager = parent.manager
        with manager.waiting(parent, WaitKind.CHILDREN, None, targets=[handle.transaction.id for handle in pending],
                             helps=True):
            # Run here every one no worker has started, then wait for those that others run.
            running = [handle._task for handle in pending if not handle._task.help()]
            for task in running:
                task.wait(None)

    def result(self, timeout: float | None = None) -> Any:
        """The function's return value once the subtransaction committed; re-raises its error; raises
        :class:`~activedb.errors.WaitTimeout` (a ``TimeoutError``) if it is still running after ``timeout`` seconds.  A
        ``DeadlockDetected`` is the subtransaction's own only if it ended ABORTED (``state``); otherwise this wait
        was the victim and it goes on (:meth:`wait`)."""
        if not self._wait(_wait_seconds("handle.result", timeout)):
            raise WaitTimeout(f"subtransaction {self.transaction.id} did not end within {timeout} s; it is still "
                              f"running: wait longer (timeout=None waits until it ends) or make its function return")
        if self._task.error is not None:
            raise self._task.error
        return self._task.result

    def __repr__(self) -> str:
        return f"<SubtransactionHandle {self.transaction.id} {self.state.value}>"


class Children:
    """Creating, running and waiting for a node's children (see the module docstring)."""

    # Its methods take ``self: Transaction``: the only class it is mixed into (mypy asks a self type to be a
    # supertype of the class; each ``ignore[misc]`` below is that).
    __slots__ = ()


    def _materialize(self: Transaction) -> None:  # type: ignore[misc]
        """Give this lazy inline subtransaction its own lock-manager transaction now (it is about to
        create a child, wait, or wait for a lock); a no-op for any other node.  Called by the thread
        running it.  See README, "Lazy inline subtransactions"."""
        if self._lazy:
            self.manager.locking.materialize(self)

    def _want_end_hooks(self: Transaction) -> None:  # type: ignore[misc]
        """``lowlevel.want_end_hooks`` (see there)."""
        self._end_hooks = True

    def spawn(self: Transaction, function: Callable[..., Any], *args: Any,  # type: ignore[misc]
              name: str | None = None, eager: bool = False, **kwargs: Any) -> SubtransactionHandle:
        """Run ``function(child, *args, **kwargs)`` as a subtransaction that may run concurrently with this
        one and its siblings, on a worker thread or on a thread that waits for it.  ``function`` is a plain function
        (as for ``retry`` and ``Database.run``): an ``async def`` or a generator function is refused (``BadArgument``),
        and so is a Python function that cannot take ``(child, *args, **kwargs)`` for their count (``lambda: ...``):
        its child would abort where it runs, unseen unless the handle is asked.

        The child commits when the function returns and aborts (with its descendants)
        if it raises; ``handle.result()`` returns the value or re-raises the error.  Only the handle tells: a parent
        that commits without asking commits without the aborted child's work (a child's abort is its parent's to
        handle, as in nested transactions), so keep the handle and ask it when the child's outcome matters.

        It is queued, and runs on the first of: a thread waiting for it (``result``, ``wait``, this
        transaction's commit — that thread runs it, no hand-off), a worker woken when a thread blocks (a
        database round trip, a wait for a lock, a gate or a running child) or when the pool has been idle for a
        millisecond (whoever spawned it is blocked elsewhere).  ``eager=True`` wakes a worker at once: for a
        spawner that goes on to wait by other means (a condition its children signal).  See txn README,
        "Spawned children: a thread only when something blocks".
        """
        if not callable(function):      # (else queued, and failing only where it runs: an abort nobody may ask about)
            raise BadArgument(f"tx.spawn({function!r}) takes the function to run as the child, function(child, "
                              f"*args, **kwargs); got a {type(function).__name__}")
        check_plain_function("tx.spawn", function)     # (else the child commits empty; its result a coroutine)
        check_call_fits("tx.spawn", "function(child, *args, **kwargs)", function, 1 + len(args), kwargs)
        _check_name("tx.spawn", name)
        check_switch("tx.spawn", "eager", eager)
        child = _new_child(self, name, body=(function, args, kwargs))
        task = self._tasks[child.id]    # registered with the child, before any worker can end it
        try:
            self.manager.pool.start(task, eager)
        except BaseException as error:      # the pool is shut down: the child ends (and is forgotten) here
            child.abort(error)
            raise
        return SubtransactionHandle(child, task)

    def subtransaction(self: Transaction, name: str | None = None) -> "InlineSubtransaction":  # type: ignore[misc]
        """``with tx.subtransaction() as child:`` runs a subtransaction inline in this thread: it commits at the
        block's end, aborts (re-raising) when the block raises, and ``child.abort()`` inside the block undoes it
        alone — the parent goes on."""
        _check_name("tx.subtransaction", name)
        return InlineSubtransaction(self, name)

    def _run_subtransaction(self: Transaction, function: Callable[..., Any], *args: Any,  # type: ignore[misc]
                            name: str | None = None, **kwargs: Any) -> Any:
        """Run ``function(child, ...)`` as an inline subtransaction and return its result; the child
        commits when it returns and aborts (re-raising) when it raises — ``with tx.subtransaction()`` as
        one call, for code that needs the outcome without managing a context."""
        _check_name("run_subtransaction", name)
        if len(args) == 1 and not kwargs:
            return run_inline(self, function, args[0], name)
        return run_inline(self, lambda child, _: function(child, *args, **kwargs), None, name)

    def retry(self: Transaction, function: Callable[..., Any], *args: Any,  # type: ignore[misc]
              attempts: int = 3, **kwargs: Any) -> Any:
        """Run ``function(child, ...)`` as an inline subtransaction, re-running it (in a fresh
        subtransaction) when it is chosen as a deadlock victim or its commit finds that another process
        changed a row it read, at most ``attempts`` times — also when that is one of the rule firings it set off,
        which reaches it as ``RuleFailed`` (its cause), as ``Database.run`` does."""
        check_whole_number("tx.retry", "attempts", attempts, 1, " (how many times to run the function at most)")
        check_plain_function("tx.retry", function)
        _check_name("tx.retry", kwargs.get("name"))      # (its subtransaction's name: ``run_subtransaction``'s)
        for attempt in range(1, attempts + 1):
            try:
                return self._run_subtransaction(function, *args, **kwargs)
            except (DeadlockDetected, SerializationConflict, RuleFailed) as error:
                if not any(isinstance(cause, (DeadlockDetected, SerializationConflict)) for cause in causes(error)):
                    raise
                if attempt == attempts:
                    raise
                logger.info("subtransaction of %s failed (%s); retry %d of %d", self.id,
                            type(error).__name__, attempt, attempts)

    def _wait_children(self: Transaction, timeout: float | None = None) -> None:  # type: ignore[misc]
        """Wait until every child has ended, running queued ones in this thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._mutex:
                pending = [task for task in self._tasks.values() if not task.done()]
            if not pending:
                return
            with self.manager.waiting(self, WaitKind.CHILDREN, None):
                for task in pending:
                    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                    if not task.wait(remaining):
                        raise WaitTimeout(f"children of {self.id} did not end within {timeout} s; they are still "
                                          f"running: wait longer (timeout=None waits until they end) or make their "
                                          f"functions return")


def run_inline(parent: "Transaction", function: Callable[[Any, Any], Any], argument: Any, name: str | None,
               kind: type | None = None) -> Any:
    """``run_subtransaction(parent, function, argument, name=name)``, its arguments positional: a rule firing's
    path (no argument tuple, keyword dictionary or unpacking call per firing).  ``kind``: the type of
    ``argument``, which is then the child's object of that type (``slot(child, kind)``) from its begin — the
    rule manager's ``Firing``.  A child that is a frame and that nothing hears of (no extension's frame hooks,
    no observer of node events, no recorder) is begun and ended here, without ``_begin_inline``'s and
    ``commit``'s calls (README, "Frames": "What is left per firing")."""
    manager = parent.manager
    extensions = manager.extensions
    slots = {kind: argument} if kind is not None else None
    # A savepoint of the lean run when the tree is exclusive (README, "The lean run").
    child = open_savepoint(parent, name, slots) if parent.parent is None or type(parent) is Savepoint else None
    push = True
    if child is None:
        if type(parent) is Savepoint:
            # (Its object used inside its running child's block, or something now hears of frames.)
            parent._decode()  # type: ignore[attr-defined]  # (a Savepoint)
        observers = manager.observers
        if (manager.subtransactions is not _FRAMES or (parent._lazy and (not parent._frame or parent._guarded))
                or parent._lazy_child is not None or parent._children or manager.recorder
                or observers.on_begin or observers.on_spawn or observers.on_commit or observers.on_abort
                or extensions.on_begin_in_frames):
            child = _begin_inline(parent, name, None, slots, lean=False)      # (which pushes it)
            push = False
        else:
            # The frame's begin: what ``_begin_inline`` does for a frame when nothing hears of it.
            child = _open_frame(parent, manager, name, None, slots)
    try:
        running = manager._local.running
    except AttributeError:      # (the thread's first)
        running = manager._local.running = []
    if push:
        running.append(child)        # (push_running, without its call)
    try:
        try:
            result = function(child, argument)
        except BaseException as error:
            child.abort(error)
            raise
        # Its commit: a savepoint's (decoded meanwhile: as its frame's); for a frame that is active, not doomed, and
        # whose before-commit hooks are none (an extension that asked for its end hooks makes it go round),
        # ``commit`` would go straight to ``_end_frame``; any other child commits — unless the function committed
        # it itself (``child.commit()``), as ``_end_inline`` leaves a child its block committed.
        if type(child) is Savepoint:
            end_savepoint(child)
        elif (child._end_hooks or extensions.before_commit_in_frames or child._doomed is not None
                or child._state is not _ACTIVE or not child._frame):
            if child._state is not _COMMITTED:
                child.commit()
        else:
            child._end_frame()
    finally:
        running.pop()       # (pop_running, without its call)
    return result


def _begin_inline(parent: "Transaction", name: str | None, number: int | None = None,
                  slots: dict[type, object] | None = None, lean: bool = True) -> "Transaction":
    """Create an inline child of ``parent`` and make it the transaction this thread runs; extensions and
    observers hear of its begin.  It is a *frame* (README, "Frames") when ``parent`` is not lazy and has no
    live child and no observer wants node events: a lazy child that is not registered among the children.
    (A member of a group run as frames is a leaf: its inline child makes it a node first, README "Groups on
    threads".)  ``number``: the child's number, reserved by a group; ``slots``: its typed slots from the start
    (``run_inline``'s ``kind``); ``lean``: it may be a savepoint of the lean run (README, "The lean run"; not a
    group's member)."""
    manager = parent.manager
    child = open_savepoint(parent, name, slots) if lean and (parent.parent is None or type(parent) is Savepoint) else None
    if child is not None:
        try:
            manager._local.running.append(child)        # (push_running, without its call)
        except AttributeError:
            manager.push_running(child)
        return child
    if type(parent) is Savepoint:
        parent._decode()  # type: ignore[attr-defined]  # (a Savepoint)
    observers = manager.observers
    if (manager.subtransactions is _FRAMES and (not parent._lazy or parent._frame and not parent._guarded)
            and parent._lazy_child is None
            and not parent._children and not (observers.on_begin or observers.on_spawn or observers.on_commit
                                            or observers.on_abort)):
        child = _open_frame(parent, manager, name, number, slots)
        if manager.recorder:
            manager.recorder.record("spawn", parent.id, root=parent.root.id, detail=child.id)
    else:
        child = _new_child(parent, name, inline=True, number=number)
        for kind, value in (slots or {}).items():
            child._set_slot(kind, value)
    try:
        manager._local.running.append(child)        # (push_running, without its call)
    except AttributeError:
        manager.push_running(child)
    try:
        for hook in manager.extensions.on_begin_in_frames if child._frame else manager.extensions.on_begin:
            hook(child)
        if observers.on_begin:
            observers.call("on_begin", child)
    except BaseException as error:
        child.abort(error)
        manager.pop_running()
        raise
    return child


def _open_frame(parent: "Transaction", manager: "TransactionManager", name: str | None, number: int | None,
                slots: dict[type, object] | None) -> "Transaction":
    """A frame child of ``parent``, which may have one (README, "Frames"): ``parent`` checked active, its grants
    retained if it is a frame itself (a frame in a frame, README) or its holds released (``release_holds`` has
    nothing else to do: no lazy child, not lazy), the frame made and remembered as its lazy child."""
    if parent._doomed is not None or parent._state is not _ACTIVE:
        parent._check_active("starting a subtransaction")
    if parent._frame:
        manager.locking.retain_grants(parent)
    elif parent._holds:
        manager.locking.release_holds(parent)
    child = parent._lazy_child = parent._new_frame(name, number, slots)
    return child


def _end_inline(child: "Transaction", error: BaseException | None) -> None:
    """End the inline ``child``: commit it, or abort it because its block raised ``error``; a child its block ended
    itself (``child.abort()``, ``child.commit()``) is left as it is."""
    try:
        if error is not None:
            child.abort(error)
        elif child._state is _ABORTED or child._state is _COMMITTED:
            pass
        elif type(child) is Savepoint:
            end_savepoint(child)
        else:
            child.commit()
    finally:
        child.manager.pop_running()


class InlineSubtransaction:
    """``with tx.subtransaction() as child:``: commit on normal exit, abort (re-raising) on an exception; a child
    ended inside the block (``child.abort()``: undone alone, the parent goes on) is not ended again."""

    __slots__ = ("_parent", "_name", "transaction")

    def __init__(self, parent: Transaction, name: str | None):
        self._parent = parent
        self._name = name
        self.transaction: Transaction | None = None

    def __enter__(self) -> Transaction:
        child = self.transaction = _begin_inline(self._parent, self._name)
        return child

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: types.TracebackType | None) -> Literal[False]:
        _end_inline(self.transaction, exc)  # type: ignore[arg-type]  # (set by __enter__)
        return False

    if not TYPE_CHECKING:       # (hidden from type checkers: they go on refusing ``tx.subtransaction().write``)
        def __getattr__(self, name):
            raise not_entered(self, name, "tx.subtransaction()", "child")


class TransactionBlock(AbstractContextManager["Transaction"]):
    """What ``db.transaction()`` returns: the block of a top-level transaction (``block``, the transaction manager's),
    entered with ``with``.  Used as the transaction itself (``db.transaction().write(...)``), it says to enter it."""

    __slots__ = ("_block",)

    def __init__(self, block: AbstractContextManager["Transaction"]) -> None:
        self._block = block

    def __enter__(self) -> "Transaction":
        return self._block.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: types.TracebackType | None) -> bool | None:
        return self._block.__exit__(exc_type, exc, traceback)

    if not TYPE_CHECKING:       # (hidden from type checkers: they go on refusing ``db.transaction().write``)
        def __getattr__(self, name):
            raise not_entered(self, name, "db.transaction()", "tx")


def not_entered(block: object, name: str, call: str, variable: str) -> AttributeError:
    """The AttributeError of ``block.name`` for a block (what ``call`` returns) that has no such attribute: Python's
    message, and for a transaction's method or attribute, that ``call`` returns the block and how to enter it."""
    from activedb.txn._tree import Transaction     # (a transaction's names; _tree imports this module)

    message = f"{type(block).__name__!r} object has no attribute {name!r}"
    if not name.startswith("_") and hasattr(Transaction, name):
        message += (f": {call} returns the block of a transaction, not the transaction; write `with {call} as "
                    f"{variable}:` and use {variable}.{name}(...) inside it")
    return AttributeError(message)


def _check_name(call: str, name: object) -> None:
    """Raise :class:`BadArgument` unless ``name`` (given as ``call(name=name)``) is None or a text: a transaction's
    name is what ``db.transaction_event(kind, name)`` matches and histories show."""
    if name is not None and not isinstance(name, str):
        raise BadArgument(f"{call}(name={name!r}) takes a text (or None for no name), got a {type(name).__name__}")


def _new_child(node: "Transaction", name: str | None = None, *, inline: bool = False,
               body: tuple[Callable[..., object], tuple[object, ...], dict[str, object]] | None = None,
               number: int | None = None) -> "Transaction":
    """A child of ``node``, registered among its children (spawned, or inline and not a frame); ``body``:
    ``(function, args, kwargs)`` of a spawned child, whose task is registered with it (one mutex section)."""
    if node._doomed is not None or node._state is not TxnState.ACTIVE:
        node._check_active("starting a subtransaction")
    manager = node.manager
    if node._lazy:
        node._materialize()
    manager.locking.release_holds(node)
    # Lazy: an inline child of a node with no other live child (so no sibling can conflict with it).
    lazy = inline and manager.subtransactions is not Subtransactions.MATERIALIZED and not node._children
    child = type(node)(manager, node, name=name, inline=inline, lazy=lazy, number=number)
    if lazy:
        node._lazy_child = child
    with node._mutex:
        if node._children is _EMPTY:
            node._children = {}
        node._children[child.id] = child
        if body is not None:
            if node._tasks is _EMPTY:
                node._tasks = {}
            node._tasks[child.id] = Task(_run_body, child, *body)
    if manager.recorder:
        manager.recorder.record("spawn", node.id, root=node.root.id, detail=child.id)
    if manager.observers.on_spawn:
        manager.observers.call("on_spawn", node, child)
    return child


def _run_body(node: "Transaction", function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> Any:
    """A spawned child's task on a worker: run ``function``, then commit (abort if it raised).  A child aborted or
    doomed before its task started (its parent aborted it, or the tree) ends here: its function and begin hooks never
    run — its parent no longer waits for an aborted child, which may have ended long before its task is taken."""
    node._thread = threading.get_ident()
    if node._doomed is not None or node._state is not _ACTIVE:
        try:
            node._check_active("start of the function of the subtransaction")
        except BaseException as error:
            node.abort(error)           # (an aborted node: nothing more; a doomed one ends as if its function raised)
            raise
    manager = node.manager
    manager.push_running(node)
    try:
        try:
            for hook in manager.extensions.on_begin:
                hook(node)
            if manager.observers.on_begin:
                manager.observers.call("on_begin", node)
            result = function(node, *args, **kwargs)
        except BaseException as error:
            node.abort(error)
            raise
        if node._state is not _COMMITTED:       # (unless the function committed it itself: ``child.commit()``)
            node.commit()
    finally:
        manager.pop_running()
    return result


def before_waiting_for_children(node: "Transaction") -> None:
    """The thread running ``node`` is about to wait: a lazy node materializes (a waiter is a node of
    the wait-for graph), and its holds become retained (README, "Locks: holds become retains") — only by
    its own thread (a lock another thread's operation just took must stay held)."""
    if node._lazy:
        node.manager.locking.materialize(node)
    if node._thread == threading.get_ident() and node._state in (TxnState.ACTIVE, TxnState.COMMITTING):
        node.manager.locking.release_holds(node)


class AbortAfterChildren:
    """``node``'s slot while its abort, called by a descendant one of its tasks runs (``child.parent.abort()``), waits
    for its children to end: ``finish``, the rest of that abort, is called by ``forget`` of its last task's child."""

    __slots__ = ("finish",)

    def __init__(self, finish: Callable[[], None]) -> None:
        self.finish = finish


def forget(node: "Transaction", child: "Transaction") -> None:
    """``child`` ended: drop it (its effects were delegated, or discarded); the last task's child of a node whose
    abort waits for its children (``AbortAfterChildren``) ends that abort."""
    pending = None
    with node._mutex:
        if node._children:
            node._children.pop(child.id, None)
        if node._tasks:
            node._tasks.pop(child.id, None)
            if not node._tasks and node._state is _ABORTED and node._slots:
                pending = node._slots.pop(AbortAfterChildren, None)
    if pending is not None:
        pending.finish()
