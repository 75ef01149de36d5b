"""A node of a transaction tree: its attributes, state machine, place in the tree, seams, commit and abort.
Its reads, writes and children are stateless mixins (``_reads.py``, ``_writes.py``, ``_children.py``);
locking, the view and the flush are delegated (``_locking``, ``_view``, ``_flush``).  Design: ``README.md``.

State machine (``TxnState``, shared with ``lockmgr``)::

    ACTIVE ──commit()──▶ COMMITTING ──▶ COMMITTED
      │                      │
      └──────abort()─────────┴──────▶ ABORTED

Thread-safety: a ``Transaction`` is used by the thread running it (``_thread``); its parent's and
children's threads touch it only through ``_mutex`` (what it protects and the mutex order: ``README.md``,
"Mutexes and their order").
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from lockmgr import Mode, TxnState

from activedb.errors import BadArgument, SerializationConflict, TransactionAborted, TransactionError
from activedb.store import same_image
from activedb.txn import _flush, _ids
from activedb.txn._children import (_ABORTED, _ACTIVE, _COMMITTED, _COMMITTING, _EMPTY, AbortAfterChildren,
                                     Children, forget)
from activedb.txn._participants import CommitParticipant
from activedb.txn._reads import Reads
from activedb.txn._view import TreeRows
from activedb.txn._writes import Writes, take_back_writes

if TYPE_CHECKING:  # pragma: no cover
    from lockmgr import Grant

    from activedb.store import Entry, Key
    from activedb.txn._manager import TransactionManager
    from activedb.txn._pool import Task
    from activedb.txn._view import ReadBase

logger = logging.getLogger("activedb.transaction")

SlotType = TypeVar("SlotType")


_new_mutex, _get_ident = threading.Lock, threading.get_ident     # (module constants: one lookup less per node)
_new_node = object.__new__
# A node's scans or participants until its first (its children and tasks: ``_EMPTY``): read-only, typed as
# the list it stands for (copy on write: the first use installs a list of the node's own).
_NONE: Any = ()


#: The logs of a node that is not a root (``Transaction._lean_undo``, ``_lean_grants``): empty, never written.
_NO_LOG: list[Any] = []

class Transaction(Reads, Writes, Children):
    """A node of a transaction tree.  See the module docstring.

    Its public methods are the application tier: ``read``, ``read_many``, ``prefetch``, ``scan``, ``write``,
    ``write_many``, ``insert``, ``delete``, ``signal``, ``emit``, ``spawn``, ``subtransaction``, ``retry``,
    ``commit``, ``abort`` (and the properties ``state``, ``parent``, ``children``, ``ancestors``, ``root``, …).
    What an extension needs — slots, participants, doom, frames' hooks, materialization — is the extender tier,
    functions of the transaction in :mod:`activedb.lowlevel` (``_lowlevel.py``); the methods behind them are
    private."""

    __slots__ = ("manager", "parent", "root", "depth", "id", "name", "began_at", "info", "subtransactions_committed",
                 "_mutex", "_state", "_children", "_tasks", "_writes", "_db_reads", "_scans", "_participants",
                 "_slots", "_doomed", "_thread", "_read_base", "_holds", "_lazy", "_lazy_child", "_modes_held",
                 "_modes_retained", "_grants", "_grants_retained", "_frame", "_end_hooks", "_undo", "_tree_rows",
                 "_lean_undo", "_lean_grants", "_lean_thread", "_undo_at", "_grants_at", "_held_from", "__weakref__")

    #: True on a running member of a group run as frames (``_group.GuardedFrame``, README "Groups on threads"):
    #: its materialization takes the group's guard (``Locking.materialize`` asks).
    _guarded = False
    #: True on a savepoint of the lean run (``_lean.Savepoint``, README "The lean run"), whose frame fields are encoded
    #: in its root's logs until ``_decode`` writes them out.
    _encoded = False

    def __init__(self, manager: "TransactionManager", parent: "Transaction | None",
                 name: str | None = None, read_base: "ReadBase | None" = None, inline: bool = False,
                 lazy: bool = False, number: int | None = None):
        self.manager = manager
        self.parent = parent
        if number is None:      # (a group reserves its members' numbers when it is made: ``_group``)
            number = next(manager._ids)
        # The rows a node below the root wrote or relied on, one object per tree (``_view.TreeRows``); the
        # tree's read base (see _view.ReadBase), only the root has one; when the tree began (the transaction
        # log's began_at), only a top-level transaction needs it.
        if parent is not None:
            self.root: Transaction = parent.root
            self.depth: int = parent.depth + 1
            self.id: str = f"{parent.id}.{number}"    # _ids.child_id
            self.began_at = None
            self._tree_rows: TreeRows = parent._tree_rows
            self._read_base = None
        else:
            self.root = self
            self.depth = 0
            self.id = _ids.top_level_id(number)
            self.began_at = datetime.datetime.now(datetime.timezone.utc)
            self._tree_rows = TreeRows()
            self._read_base = read_base or manager.read_base
        self.name = name
        #: Free-form JSON annotations of this transaction; a top-level transaction's are written into
        #: its transaction-log row (``activedb_transaction_log.info``).
        self.info: dict[str, Any] = {}
        self.subtransactions_committed = 0
        self._mutex = _new_mutex()
        # Invariant: _state only moves ACTIVE -> COMMITTING -> COMMITTED, or to ABORTED from a non-final state.
        self._state = _ACTIVE
        # Invariant: exactly the children that have not ended (a child removes itself once it committed
        # or aborted: a long tree — a micro-batch of events — keeps no finished nodes alive).
        # (``_children``, ``_tasks``, ``_scans`` and ``_participants`` start as shared empty read-only values
        # and get their own container on first use: a tree may hold thousands of nodes until it commits, and
        # every container is work for the garbage collector.)
        self._children: dict[str, Transaction] = _EMPTY
        self._tasks: dict[str, Task] = _EMPTY
        self._writes: dict[tuple[str, Key], Entry] = {}
        # Committed images this node relied on (None: no row), validated at the flush (see _view).
        self._db_reads: dict[tuple[str, Key], dict[str, object] | None] = {}
        self._scans: list[tuple[str, Any, dict[Key, dict[str, object]]]] = _NONE
        self._participants: list[CommitParticipant] = _NONE
        self._slots: dict[type, Any] | None = None
        self._doomed: BaseException | None = None
        # The thread that runs this node's operations (set again by a spawned child's worker).
        self._thread = _get_ident()
        # True once an operation of this node took a lock since its holds were last made retained
        # (written by the node's thread only).
        self._holds = False
        # True while this inline child has no lock-manager transaction of its own: its locks are taken in
        # its parent's name (README, "Lazy inline subtransactions"); ``materialize`` ends it.
        self._lazy = lazy
        # This node's live lazy child, if any (while it runs, what this node holds is the child's).
        self._lazy_child: Transaction | None = None
        # What this node holds and retains, per table name (intention modes included) and per ``(table, key)``
        # row, as far as its own successful requests and its committed lazy children's tell (README, "Requests
        # answered from the records"); and, on a lazy node, its lock grants, retained in its parent's name
        # (``LockManager.try_retain``).  Written by the node's thread only.
        # Invariant: a lower bound — every mode in ``_modes_held`` is covered by what the node holds in the
        # lock manager, every mode in ``_modes_retained`` by what it retains there.
        self._modes_held: dict[str | tuple[str, Key], Mode] | None = None
        self._modes_retained: dict[str | tuple[str, Key], Mode] | None = None
        self._grants: list[Grant] | None = None
        # How many of the first ``_grants`` this lazy node *retains* (the rest it holds): a frame's grants
        # become retained when it opens a frame of its own, as a node's holds do before it creates a child, and
        # a committed child frame's grants are appended as retained (README, "Frames in frames").
        self._grants_retained = 0
        # True while this lazy inline child is a *frame* (README, "Frames"; made by ``_new_frame``): not
        # registered among its parent's children (the parent's ``_lazy_child`` is the reference), ended by
        # ``_end_frame``; it writes into its parent's write set (its own stays empty), ``_undo`` the marks
        # (``_writes.write_in_parent``).  Materializing makes it an ordinary node.
        self._frame = False
        # True once an extension that skips frames asked to hear this frame's end (``want_end_hooks``): its
        # ``before_commit`` and ``after_end`` are called for it as for a node (README, "Frames").
        self._end_hooks = False
        self._undo: dict[tuple[str, Key], tuple[Entry | None, Entry]] | None = None
        # A root's lean run (README, "The lean run"; ``_lean.py``): its undo log ``(row, entry before, entry)``, its
        # grants log (``LockManager.try_retain``'s list), the thread that runs it (0: none yet).  A node below the
        # root has none: ``_NO_LOG``, never written (only a root's logs are).
        self._lean_undo: list[tuple[tuple[str, Key], Entry | None, Entry]] = [] if parent is None else _NO_LOG
        self._lean_grants: list[Grant] = [] if parent is None else _NO_LOG
        self._lean_thread = 0
        # A savepoint's places in those logs (``_lean.Savepoint``); unused by a node.
        self._undo_at = self._grants_at = self._held_from = 0
        if not lazy:
            manager.locking.begin(self, awaited=inline)
        recorder = manager.recorder
        if recorder:
            recorder.record("begin", self.id, parent=parent.id if parent is not None else None, root=self.root.id)

    def _new_frame(self, name: str | None, number: int | None = None, slots: dict[type, object] | None = None
                   ) -> "Transaction":
        """A frame child of this node (README, "Frames"): a lazy inline child, each field as ``__init__`` would
        set it, made without the constructor's call and branches (every rule firing makes one); ``slots``: its
        typed slots from the start (``run_inline``'s ``kind``)."""
        manager = self.manager
        frame = _new_node(type(self))
        frame.manager = manager
        frame.parent = self
        frame.root = self.root
        frame.depth = self.depth + 1
        frame.id = f"{self.id}.{next(manager._ids) if number is None else number}"    # _ids.child_id
        frame.began_at = None
        frame._tree_rows = self._tree_rows
        frame._read_base = None
        frame.name = name
        frame.info = {}
        frame.subtransactions_committed = 0
        frame._mutex = _new_mutex()
        frame._state = _ACTIVE
        frame._children = frame._tasks = _EMPTY
        frame._writes = _EMPTY
        frame._db_reads = {}
        frame._scans = frame._participants = _NONE
        frame._slots = slots
        frame._doomed = frame._lazy_child = None
        frame._thread = _get_ident()
        frame._holds = frame._end_hooks = False
        frame._lazy = frame._frame = True
        frame._modes_held = frame._modes_retained = frame._grants = frame._undo = None
        frame._grants_retained = frame._undo_at = frame._grants_at = frame._held_from = 0
        frame._lean_undo = frame._lean_grants = _NO_LOG
        frame._lean_thread = 0
        recorder = manager.recorder
        if recorder:
            recorder.record("begin", frame.id, parent=self.id, root=frame.root.id)
        return frame

    # --- state ----------------------------------------------------------------------------

    @property
    def state(self) -> TxnState:
        return self._state

    @property
    def is_top_level(self) -> bool:
        return self.parent is None

    @property
    def children(self) -> list["Transaction"]:
        """The children that have not ended (a running frame included)."""
        with self._mutex:
            children = list(self._children.values())
        frame = self._lazy_child
        if frame is not None and frame._frame:
            children.append(frame)
        return children

    @property
    def ancestors(self) -> tuple["Transaction", ...]:
        """The parent, its parent, … up to the root (empty for a top-level transaction)."""
        found = []
        node = self.parent
        while node is not None:
            found.append(node)
            node = node.parent
        return tuple(found)

    @property
    def log_id(self) -> str:
        """The id of this tree's row in ``activedb_transaction_log``."""
        return _ids.log_id(self.manager.process_tag, self.root.id)

    def _check_active(self, operation: str) -> None:
        if self._doomed is not None:
            raise TransactionAborted(
                f"{operation} in transaction {self.id}: it was aborted "
                f"({str(self._doomed) or type(self._doomed).__name__}); "
                f"start a new transaction"
            ) from self._doomed
        state = self._state
        if state is not _ACTIVE:
            raise TransactionError(
                f"{operation} in transaction {self.id}, which is {state.value}; operations are only allowed "
                f"while it is active — start a new transaction"
            )

    def _doom(self, reason: BaseException) -> None:
        """Mark this node and its active descendants for abort (they raise at their next operation)."""
        if not isinstance(reason, BaseException):   # (their raise … from reason would fail with Python's TypeError)
            raise BadArgument(f"doom(tx, reason={reason!r}) takes the exception the tree's operations raise from, "
                              f"e.g. TimeoutError('deadline passed')")
        pending = [self]
        while pending:
            node = pending.pop()
            if node._doomed is None and node._state in (_ACTIVE, _COMMITTING):
                node._doomed = reason
            pending.extend(node.children)

    # --- extension seams ------------------------------------------------------------------------

    def _enlist(self, participant: CommitParticipant) -> None:
        """``lowlevel.enlist`` (see there)."""
        if not isinstance(participant, CommitParticipant):
            raise TypeError(f"enlist() takes a CommitParticipant, got {participant!r}")
        # Also while COMMITTING (waiting for its children, before it delegates or flushes): a running child
        # may enlist in its root (the outbox does); the commit reads the list only after every child ended.
        if not (self._state is _COMMITTING and self._doomed is None):
            self._check_active("enlist")
        with self._mutex:
            if self._participants is _NONE:
                self._participants = []
            self._participants.append(participant)

    @overload
    def _slot(self, kind: type[SlotType]) -> SlotType: ...
    @overload
    def _slot(self, kind: type[SlotType], *, create: Literal[True]) -> SlotType: ...
    @overload
    def _slot(self, kind: type[SlotType], *, create: bool) -> SlotType | None: ...

    def _slot(self, kind: type[SlotType], *, create: bool = True) -> SlotType | None:
        """This transaction's object of type ``kind`` (one per type, created with ``kind()`` on first use;
        ``create=False``: None if there is none).  A package keeps its per-transaction state here, in a
        type it owns (e.g. the rule manager's ``RuleContext``), instead of attributes on the transaction."""
        slots = self._slots
        if slots is not None:
            value = slots.get(kind)
            if value is not None or not create:
                return value
        elif not create:
            return None
        if self._frame:        # no other thread knows a frame: its slots need no mutex
            value = kind()
            if slots is None:
                self._slots = {kind: value}
            else:
                slots[kind] = value
            return value
        with self._mutex:
            if self._slots is None:
                self._slots = {}
            value = self._slots.get(kind)
            if value is None:
                value = self._slots[kind] = kind()
        return value

    def _set_slot(self, kind: type[SlotType], value: SlotType) -> None:
        """Make ``value`` this transaction's object of type ``kind`` (see :meth:`_slot`), in place of any."""
        if self._frame:          # (no other thread knows a frame)
            if self._slots is None:
                self._slots = {kind: value}
            else:
                self._slots[kind] = value
            return
        with self._mutex:
            if self._slots is None:
                self._slots = {}
            self._slots[kind] = value

    # --- commit and abort -------------------------------------------------------------------

    def commit(self) -> None:
        """Commit: wait for children, then delegate to the parent or flush to PostgreSQL.  A node that
        was doomed meanwhile (an ancestor aborted, a deadlock) aborts instead and raises why."""
        doomed = self._doomed
        if doomed is not None and self._state is _ACTIVE:
            self.abort(doomed)
        if doomed is not None or self._state is not _ACTIVE:
            self._check_active("commit")
        running = _running_inline_child(self)
        if running is not None:
            # (Its thread runs that child's block: waiting for it would never end, and committing around it would
            # hand up, or flush, a tree that child is still changing.)
            raise TransactionError(
                f"commit of {self.id} inside the block of its subtransaction {running.id}, which is still running: "
                f"end that block first (it commits {running.id}), then commit {self.id}")
        if self._tasks:
            caller = _running_below(self)
            if caller is not None:
                # (Its commit would wait for its children, the one this thread runs among them: never.)
                raise TransactionError(
                    f"commit of {self.id} inside its subtransaction {caller.id}, which this thread runs: a "
                    f"subtransaction cannot commit an ancestor; {self.id} commits when its own block or function "
                    f"ends, after its children (abort it instead to undo the tree)")
        manager = self.manager
        try:
            extensions = manager.extensions
            for hook in (extensions.before_commit_in_frames if self._frame and not self._end_hooks
                         else extensions.before_commit):
                hook(self)
        except BaseException as error:
            self.abort(error)
            raise
        self._commit_after_hooks()

    def _commit_after_hooks(self) -> None:
        """``commit`` once the before-commit hooks ran (a savepoint of the lean run that those hooks decoded goes on
        here: ``_lean.end``)."""
        manager = self.manager
        if self._frame:      # still a frame after the hooks (a deferred cycle they ran may have materialized it)
            self._end_frame()
            return
        with self._mutex:
            if self._state is not _ACTIVE:
                raise TransactionError(f"commit of {self.id}, which is {self._state.value}")
            self._state = _COMMITTING
        try:
            # COMMITTING: no operation of this node runs any more, so what its own operations hold
            # becomes retained before it waits for its children (they may need those rows).  (A lazy node
            # holds nothing itself and has no children.  A subtransaction without live children skips
            # it: its commit makes its parent retain what it holds, and meanwhile its holds keep out
            # exactly what retains would, as it has no descendants — lockmgr README §9.)
            if not self._lazy and (self._children or self.parent is None):
                manager.locking.release_holds(self)
            if self._tasks:                # only spawned children have tasks (an inline child has ended)
                self._wait_children()
            # (Every flush passes this check after the state left ACTIVE: ``lowlevel.abandon`` aborts the lock-manager
            # transaction of a root it doomed while that root was still ACTIVE, relying on it.)
            if self._doomed is not None:
                raise TransactionAborted(f"transaction {self.id} was aborted ({self._doomed})") from self._doomed
            if self.parent is not None:
                _delegate_to_parent(self)
                # Rule 2.  An ancestor's abort that reached the lock manager after the delegation fails it:
                # the node then ends ABORTED with its ancestor, never left COMMITTING.
                manager.locking.commit(self)
            else:
                _flush.flush(self)
        except BaseException as error:
            self.abort(error)
            raise
        if self.parent is None:
            manager.locking.commit(self)   # Rule 3: releases all (PostgreSQL has committed: no abort now)
        with self._mutex:
            self._state = _COMMITTED
        parent = self.parent
        if parent is None:
            for participant in self._participants:
                try:
                    participant.committed(self)
                except Exception:
                    logger.exception("commit participant %r raised after %s committed", participant, self.id)
        if manager.recorder:
            manager.recorder.record("commit", self.id, parent=parent.id if parent else None, root=self.root.id)
        for hook in manager.extensions.after_end:
            hook(self, True)
        if manager.observers.on_commit:
            manager.observers.call("on_commit", self)
        if parent is not None:
            forget(parent, self)
        else:
            # The tree has ended.  A root refers to itself (``root``), so what it still refers to would
            # wait for the cyclic collector: its write set and images (a row each) go now, by reference
            # counting, and so do its participants (a batch run at commit and what it holds) and the tree's
            # ``TreeRows``; nothing reads them after the end (an abort drops the write set and participants too).
            self._writes = {}
            self._db_reads = {}
            self._scans = _NONE
            self._participants = _NONE
            self._tree_rows = TreeRows()

    def abort(self, reason: BaseException | str | None = None) -> None:
        """Abort this node and its active descendants: write sets discarded, locks released.  Called by a
        descendant that runs in one of its spawned children (``child.parent.abort()``), it dooms the tree and returns;
        the abort ends (participants, hooks, observers) once those children have ended."""
        error = reason if isinstance(reason, BaseException) else TransactionAborted(str(reason or "aborted"))
        if self._lazy and self._lazy_child is not None and self._state is _ACTIVE:
            # A frame aborted inside its live child's block (its object used there): the child's writes and grants
            # lie on top of its own, so the chain becomes nodes first, as for any use of the parent's object in its
            # child's block (README, "Lazy inline subtransactions"); else the child's end would restore them to what
            # they were after this frame's.
            try:
                self.manager.locking.materialize(self._lazy_child)
            except TransactionAborted:
                pass        # an ancestor's abort reached the lock manager first: its write set and locks went with it
        # Doom the subtree before its writes are discarded: a descendant reading meanwhile then raises
        # instead of returning the row without them (``_view.read_row`` checks after reading).  (An ended
        # node is not doomed, nor are its children: it has none.)
        self._doom(error)
        with self._mutex:
            if self._state in (_COMMITTED, _ABORTED):
                if self._state is _COMMITTED:
                    raise TransactionError(f"abort of {self.id}, which is already committed: what it wrote stays; "
                                           f"undo it in a transaction of its own")
                return
            self._state = _ABORTED
            self._writes = {}
            participants, self._participants = self._participants, _NONE
        if self._undo:
            take_back_writes(self, keep=False)      # a frame's writes leave its parent's write set
        manager = self.manager
        manager.locking.abort(self)
        if self._tasks and _running_below(self) is not None:
            # Called by a descendant that one of its tasks runs (``child.parent.abort()``): waiting for its children
            # would wait for that task, on this very thread.  The tree is doomed and out of the lock manager; the
            # rest of the abort runs when its last task's child ends (``forget``), and this call returns.
            self._set_slot(AbortAfterChildren, AbortAfterChildren(lambda: self._end_abort(reason, error, participants)))
            return
        self._wait_children()
        self._end_abort(reason, error, participants)

    def _end_abort(self, reason: BaseException | str | None, error: BaseException,
                   participants: list[CommitParticipant]) -> None:
        """The end of ``abort`` once the node's children ended: participants, history, hooks, observers, ``forget``."""
        manager = self.manager
        for participant in participants:
            try:
                participant.aborted(self, error)
            except Exception:
                logger.exception("commit participant %r raised while %s aborted", participant, self.id)
        if manager.recorder:
            manager.recorder.record("abort", self.id, parent=self.parent.id if self.parent else None,
                                    root=self.root.id, detail=repr(reason) if reason is not None else None)
        manager.extensions.call("after_end", self, False)
        manager.observers.call("on_abort", self, error)
        if self.parent is not None:
            forget(self.parent, self)

    def _end_frame(self) -> None:
        """The rest of ``commit`` for a frame (README, "Frames"): it has no children, holds nothing of its own
        (its locks are its parent's retains, its writes in its parent's write set) and is known to nobody but its
        parent and its thread, so it moves to COMMITTED without the intermediate step, delegates what else it has
        and drops its undo marks (Rule 2); no ``forget``: it was never registered."""
        if self._state is not _ACTIVE:
            raise TransactionError(f"commit of {self.id}, which is {self._state.value}")
        parent: Transaction = self.parent  # type: ignore[assignment]  # (a frame has its parent)
        undo = self._undo
        try:
            if self._doomed is not None:
                raise TransactionAborted(f"transaction {self.id} was aborted ({self._doomed})") from self._doomed
            marks = None
            if undo and parent._frame:
                # A frame's frame (README, "Frames in frames"): its writes lie in the write set below its parent
                # frame, which takes them over (Rule 2) — per row, the entry before the earlier of the two first
                # writes, and the two own entries composed (computed before anything is handed up).
                marks = parent._undo
                merged = [(row, (previous, own) if marks is None or row not in marks
                           else (marks[row][0], marks[row][1].then(own, row[0])))
                          for row, (previous, own) in undo.items()]
            if self._db_reads or self._scans or self._participants:
                _delegate_to_parent(self)
            else:       # nothing to hand up but its count: its writes are in its parent's write set already
                if (parent._state is not _ACTIVE and parent._state is not _COMMITTING) or parent._doomed is not None:
                    raise TransactionAborted(f"the parent {parent.id} of {self.id} was aborted")
                parent.subtransactions_committed += 1 + self.subtransactions_committed
        except BaseException as error:
            self.abort(error)
            raise
        self._undo = None     # (a frame's frame: its marks are its parent frame's now; otherwise they go)
        if undo and parent._frame:
            if marks is None:
                parent._undo = undo
            else:
                marks.update(merged)
        manager = self.manager
        manager.locking.commit(self)
        self._state = _COMMITTED
        if manager.recorder:
            manager.recorder.record("commit", self.id, parent=self.parent.id,  # type: ignore[union-attr]
                                    root=self.root.id)
        extensions = manager.extensions
        for hook in extensions.after_end if self._end_hooks else extensions.after_end_in_frames:
            hook(self, True)
        if manager.observers.on_commit:
            manager.observers.call("on_commit", self)

    def __repr__(self) -> str:
        return f"<Transaction {self.id} {self._state.value}>"


def _running_inline_child(node: Transaction) -> "Transaction | None":
    """A live inline child of ``node`` (a frame or lazy child, or a registered child with no task: spawned children
    have one), or None."""
    child = node._lazy_child
    if child is not None and (child._state is _ACTIVE or child._state is _COMMITTING):
        return child
    if not node._children:
        return None
    with node._mutex:
        return next((child for child_id, child in node._children.items() if child_id not in node._tasks
                     and (child._state is _ACTIVE or child._state is _COMMITTING)), None)


def _running_below(node: Transaction) -> "Transaction | None":
    """The innermost transaction the calling thread runs below one of ``node``'s tasks (a spawned child it runs, or
    a descendant of one), or None: ``node`` waiting for its children from here would wait for this thread."""
    running: list[Transaction] = getattr(node.manager._local, "running", None) or []
    tasks = node._tasks
    for transaction in reversed(running):
        below: Transaction | None = transaction
        while below is not None:
            parent = below.parent
            if parent is node:
                if below.id in tasks:
                    return transaction
                break
            below = parent
    return None


def _delegate_to_parent(node: Transaction) -> None:
    """Rule 2 for ``node``'s effects: its write set, relied-on images, scans and participants move to its
    parent (checked and composed first: a failure leaves the parent untouched)."""
    parent: Transaction = node.parent  # type: ignore[assignment]  # (Rule 2: a child's parent)
    with node._mutex:
        writes, reads, scans = node._writes, node._db_reads, node._scans
        participants = node._participants
    with parent._mutex:
        state = parent._state
        if (state is not _ACTIVE and state is not _COMMITTING) or parent._doomed is not None:
            raise TransactionAborted(f"the parent {parent.id} of {node.id} was aborted")
        # Check and compose everything first, then install: a failure leaves the parent untouched.
        parent_reads = parent._db_reads
        # Python walks only the smaller side of each dict (to find the rows both have); the rest is copied
        # by ``dict.update``, so a deep chain, where each level hands up everything below it, pays a row's
        # composition about once, not once per level (README, "Spawned children").
        if reads:
            smaller, larger = (reads, parent_reads) if len(reads) <= len(parent_reads) else (parent_reads, reads)
            for row, image in smaller.items():
                relied = larger.get(row, image)
                if relied is not image and not same_image(relied, image):
                    # Another process committed between two reads of the tree: the parent (or a
                    # sibling that committed into it) relied on one image, this child on another.
                    # Keeping both is not serializable; the child's commit fails and its work is
                    # discarded, the parent keeps its own image (validated again at the flush).
                    raise SerializationConflict(
                        f"commit of {node.id}: row {row[1]!r} of {row[0]!r} changed in PostgreSQL between "
                        f"this subtransaction's read and a read by {parent.id} or a sibling (another process "
                        f"committed in between); nothing of {node.id} is kept — re-run it "
                        f"(tx.retry(fn) does, or the whole transaction: Database.run(fn, retries=N))"
                    )
        if len(writes) == 1:                  # a firing's one row: no intermediate dict
            (row, entry), = writes.items()
            parent_writes = parent._writes
            previous = parent_writes.get(row)
            parent_writes[row] = previous.then(entry, row[0]) if previous is not None else entry
        elif writes:
            parent_writes = parent._writes
            # The rows both wrote: the parent's entry followed by the child's.
            if len(writes) <= len(parent_writes):
                composed = {row: previous.then(entry, row[0]) for row, entry in writes.items()
                            if (previous := parent_writes.get(row)) is not None}
            else:
                composed = {row: previous.then(entry, row[0]) for row, previous in parent_writes.items()
                            if (entry := writes.get(row)) is not None}  # type: ignore[assignment]  # (not None)
            # Same order as composing row by row: the parent's rows where they were, then the child's new ones.
            parent_writes.update(writes)
            if composed:
                parent_writes.update(composed)
        if reads:
            # Where both relied on a row the images are equal (checked above): the child's may replace it.
            parent_reads.update(reads)
        if scans:
            parent._scans = [*parent._scans, *scans]
        if participants:
            parent._participants = [*parent._participants, *participants]
        parent.subtransactions_committed += 1 + node.subtransactions_committed


from activedb.txn import _lean  # noqa: E402  (the lean run's savepoints are a subclass: README, "The lean run")
