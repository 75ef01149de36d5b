"""What to lock, and how a node's own operations hold locks (the ``lmgr.c`` layer over ``lockmgr``).

* **Resources.** A row is ``("row", table, key)`` under ``("table", table)``: IR/IW on the table, then
  READ/WRITE on the row.  ``Locking.set_granularity(table, TABLE)`` locks the whole table instead; a scan
  takes a table READ lock.
* **Holds become retains before a node waits** (creates a child, waits for children, commits:
  :meth:`Locking.release_holds`, ``LockManager.retain``), and commit edges are declared only while a
  parent waits: ``README.md``, "Locks: holds become retains, and waiting".
* **Lazy inline subtransactions** (granted as the parent's retains, ``LockManager.try_retain``, listed
  on the child as ``_grants``; ``materialize`` hands them down) and **intention locks answered from
  retains**: ``README.md``, "Lazy inline subtransactions" (the invariant, the steps, the fallbacks).
* **Errors.** Lock-manager errors are translated here: ``DeadlockDetected`` and ``LockWaitTimeout`` (activedb's
  errors, which the lock manager raises for it: ``lockmgr.ErrorClasses``) doom
  the node (it and its subtree must abort) and propagate; any other error of an aborted node (also one
  begun just after its ancestor's abort reached the lock manager: ``begin``, ``commit``, a lazy node's
  requests) becomes :class:`activedb.errors.TransactionAborted`.  (``TransactionManager`` translates the
  same way where it registers waits.)

Thread-safety: ``_mutex`` protects ``_granularity``.  Only the thread running a node acquires locks for
it or makes its holds retained (``Transaction._thread``).
"""

from __future__ import annotations

import dataclasses
import threading
import types
from typing import TYPE_CHECKING, Any

import lockmgr
from lockmgr import Mode, covers, join

from activedb.errors import DeadlockDetected, LockWaitTimeout, TransactionAborted
from activedb.store import Granularity
from activedb.txn._writes import take_back_writes

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Key, TableInfo
    from activedb.txn._tree import Transaction
    from lockmgr import Grant


_INTENTION = {Mode.READ: Mode.IR, Mode.UPDATE: Mode.IW, Mode.WRITE: Mode.IW}
#: ``lockmgr.covers`` as a table (a lookup instead of a call: a lock request tests it once or twice).
_COVERS = {stronger: {weaker: covers(stronger, weaker) for weaker in Mode} for stronger in Mode}
_JOIN = {first: {second: join(first, second) for second in Mode} for first in Mode}     # ``lockmgr.join``, likewise


# What a node's own successful requests tell of its locks (``Transaction._modes_held`` and
# ``_modes_retained``), per *subject*: a table's name (a str) for its table-level mode, intention modes
# included, or a row's ``(table, key)`` tuple.  A record is a lower bound: every mode in it is covered by
# what the node holds (``_modes_held``: since its holds were last made retained) or retains in the lock
# manager; a subject missing from it only means the ordinary request (README, "Lazy inline subtransactions",
# and "Requests answered from the records").


def _note_held(node: "Transaction", subject: "str | tuple[str, Key]", mode: Mode) -> None:
    """``node`` was granted ``mode`` on ``subject`` (a table's name or a row's ``(table, key)``), joined with
    what it held there."""
    held = node._modes_held
    if held is None:
        node._modes_held = {subject: mode}
    else:
        previous = held.get(subject)
        held[subject] = mode if previous is None else _JOIN[previous][mode]


def _note_tuple(node: "Transaction", name: str, mode: Mode) -> None:
    """``node`` was granted a row of ``name`` in ``mode``: it holds the intention lock for it, unless its
    table-level mode covered the row (then nothing was asked at table level)."""
    held = node._modes_held
    previous = held.get(name) if held is not None else None
    if previous is not None and _COVERS[previous][mode]:
        return
    _note_held(node, name, _INTENTION[mode])


def _note_retained(node: "Transaction", held: "dict[str | tuple[str, Key], Mode]") -> None:
    """``node`` now retains ``held`` (per subject, joined with what it retained)."""
    retained = node._modes_retained
    if retained is None:
        node._modes_retained = dict(held)
        return
    for name, mode in held.items():
        previous = retained.get(name)
        retained[name] = mode if previous is None else _JOIN[previous][mode]


_TABLE = Granularity.TABLE       # (Enum members as constants: cheaper on the hot path)
_INTENTIONS = (Mode.IR, Mode.IW)


class Locking:
    """Locks of every transaction of one manager, on one :class:`lockmgr.LockManager`."""

    def __init__(self, lock_manager: lockmgr.LockManager, lock_timeout: float | None):
        self.lock_manager = lock_manager
        self.lock_timeout = lock_timeout
        self._mutex = threading.Lock()        # protects _granularity (replaced whole on change)
        self._granularity: dict[str, Granularity] = {}

    def set_granularity(self, table: str, granularity: Granularity) -> None:
        granularity = Granularity.parse(granularity, "set_granularity(granularity=...)")
        with self._mutex:
            self._granularity = {**self._granularity, table: granularity}

    def granularity(self, table: str) -> Granularity:
        return self._granularity.get(table, Granularity.TUPLE)

    # --- the node's life in the lock manager ------------------------------------------------------

    def begin(self, node: "Transaction", *, awaited: bool = False) -> None:
        """Register ``node``; ``awaited``: its parent waits for it all its life (an inline child).  A lazy
        node (``node._lazy``) is not registered until it materializes (see ``materialize``)."""
        if node._lazy:
            return
        parent = node.parent
        try:
            self.lock_manager.begin(node.id, parent=parent.id if parent is not None else None, awaited=awaited)
        except lockmgr.TransactionNotActive as error:
            # An ancestor's abort reached the lock manager between the parent's last check and this begin
            # (``doom`` comes first, so the parent is doomed): refuse the child with activedb's error.
            _raise_aborted(parent, error)  # type: ignore[arg-type]  # (only a child is refused)

    def materialize(self, node: "Transaction") -> None:
        """Give the lazy ``node`` its own lock-manager transaction (an awaited child of its parent) and
        hand it the locks it took in its grantee's name: afterwards the lock table is exactly what it would
        be had ``node`` been registered from the start (see README, "Lazy inline subtransactions").  A frame
        in a frame materializes with the whole chain of lazy nodes it belongs to (README, "Frames in
        frames"): each registered below its parent, outermost first, each given its grants newest first.
        A running member of a group run as frames does it under its group's guard (README, "Groups on
        threads")."""
        if node._encoded:
            # A savepoint of the lean run (an encoded node is a Savepoint): its frame first (README, "The lean run").
            node._decode()  # type: ignore[attr-defined]
        if node._guarded:
            node._materialize_guarded()  # type: ignore[attr-defined]  # (a guarded node is a GuardedFrame)
            return
        self.materialize_now(node)

    def materialize_now(self, node: "Transaction") -> None:
        """:meth:`materialize` itself, for a caller that made sure nobody else changes ``node`` meanwhile (its
        own thread, or a group's guard)."""
        top = node
        # (A lazy node has a parent, and so has every lazy ancestor and every member of the chain.)
        while top.parent._lazy:  # type: ignore[union-attr]
            top = top.parent  # type: ignore[assignment]
        chain = [top]
        while chain[-1]._lazy_child is not None:
            chain.append(chain[-1]._lazy_child)
        grantee: Transaction = top.parent  # type: ignore[assignment]
        locks = self.lock_manager
        for member in reversed(chain):       # writes: the innermost first (they lie on top in the write set)
            if member._frame:
                # A frame becomes an ordinary node: registered among its parent's children from now on.
                parent: Transaction = member.parent  # type: ignore[assignment]
                with parent._mutex:
                    parent._children = {**parent._children, member.id: member}
                take_back_writes(member, keep=True)     # its writes become its own write set
                member._frame = False
        try:
            for member in chain:
                locks.begin(member.id, parent=member.parent.id, awaited=True)  # type: ignore[union-attr]
            for member in reversed(chain):   # the newest grants first: each hand-down restores what was before
                grants, kept = member._grants, member._grants_retained
                if grants:
                    if kept < len(grants):
                        locks.hand_down_retains(grantee.id, member.id, grants[kept:])
                    if kept:
                        locks.hand_down_retains(grantee.id, member.id, grants[:kept], retained=True)
                    _forget_grants(grantee, grants)
        except lockmgr.TransactionNotActive as error:
            _raise_aborted(node, error)
        for member in chain:
            # It holds what it was granted since it last opened a frame (its table-level grants are noted on
            # it already), and retains the rest.
            grants, kept = member._grants, member._grants_retained
            member._holds = bool(grants) and kept < len(grants)  # type: ignore[arg-type]  # (set just above)
            member._grants = None
            member._grants_retained = 0
            member._lazy = False
            member._lazy_child = None
        grantee._lazy_child = None

    def commit(self, node: "Transaction") -> None:
        """Rule 2 (a subtransaction: the parent retains what it held and retained) or Rule 3 (top-level:
        release everything).  Precondition: every child ended (a subtransaction without children may still
        hold: its parent retains that too).  A lazy node's locks are already its parent's holds: they become
        the parent's retains (Rule 2 exactly)."""
        if node._lazy:
            # Its grants are its grantee's retains already (Rule 2 exactly); what it locked the parent now
            # retains (the records: "Requests answered from the records").  A frame's frame: its grants join
            # its parent's, as retained (README, "Frames in frames").
            parent: Transaction = node.parent  # type: ignore[assignment]  # (a lazy node has a parent)
            parent._lazy_child = None
            grants, node._grants = node._grants, None
            if grants and parent._lazy:
                if parent._grants is None:
                    parent._grants = grants
                else:
                    parent._grants.extend(grants)
                parent._grants_retained = len(parent._grants)
            held = node._modes_held
            if held:
                _note_retained(parent, held)
            retained = node._modes_retained
            if retained:
                _note_retained(parent, retained)
            return
        try:
            self.lock_manager.commit(node.id)
        except lockmgr.TransactionNotActive as error:
            _raise_aborted(node, error)

    def abort(self, node: "Transaction") -> None:
        """Rule 4 for the node and its active descendants (a lazy node: what it took in its parent's name,
        which is exactly what the parent holds)."""
        try:
            if node._lazy:
                node.parent._lazy_child = None  # type: ignore[union-attr]
                grants, node._grants = node._grants, None
                if grants:
                    grantee = _grantee(node)
                    self.lock_manager.undo_retains(grantee.id, grants)
                    _forget_grants(grantee, grants)
                return
            self.lock_manager.abort(node.id)
        except lockmgr.LockError:
            pass   # already gone with an aborted ancestor

    # --- the node's own operations ------------------------------------------------------------

    def acquire(self, node: "Transaction", info: "TableInfo", key: "Key | None", mode: Mode) -> None:
        """Lock ``key`` of ``info`` (``None``: the whole table) in ``mode`` for ``node``'s own operation."""
        locks = self.lock_manager
        name = info.name
        if node._lazy_child is not None:
            # The node itself locks while its lazy child runs (its own object used inside the child's
            # block): its holds must be its own again, so the child takes its locks with it first (a frame's
            # frame: with its parent, which is then no longer lazy either).
            self.materialize(node._lazy_child)
        if node._lazy:
            try:
                if self._grant_lazily(node, name, key, mode):
                    return
            except lockmgr.LockError as error:
                _raise_aborted(node, error)
            node._materialize()
        table_level = key is None or self._granularity.get(name) is _TABLE
        held = node._modes_held
        if held is not None:
            # Answered from its record: it holds a covering mode since its holds were last retained, so the
            # lock manager would grant the request at once and change nothing ("Requests answered from the
            # records").
            current = held.get(name)
            if current is not None and _COVERS[current][mode]:
                return
            if not table_level:
                current = held.get((name, key))  # type: ignore[arg-type]  # (row level: a key)
                if current is not None and _COVERS[current][mode]:
                    return
        timeout = self.lock_timeout
        tid = node.id
        node._holds = True
        try:
            if table_level:
                locks.acquire(tid, ("table", name), mode, timeout=timeout)
                _note_held(node, name, mode)
            else:
                locks.acquire_tuple(tid, ("table", name), key, mode, timeout, resource=("row", name, key))
                _note_tuple(node, name, mode)
                _note_held(node, (name, key), mode)  # type: ignore[arg-type]  # (row level: a key)
        except (DeadlockDetected, LockWaitTimeout) as error:
            node._doom(error)
            raise
        except lockmgr.TransactionNotActive as error:
            # An ancestor's abort reached the lock manager while this request waited, maybe before the doom walk
            # reached this node (a child spawned meanwhile): activedb's error if the node or an ancestor is doomed.
            _raise_aborted(node, error)

    def acquire_rows(self, node: "Transaction", info: "TableInfo", keys: "list[Key]", mode: Mode) -> None:
        """``acquire`` of each of ``keys`` (rows of ``info``) in order, for ``node``'s own bulk read (``prefetch``,
        ``read_many``): one call of the lock manager for the rows a node that is not lazy has not recorded yet
        (``LockManager.acquire_tuples``).  A lazy node, a node with a lazy child and a table locked as a whole
        take ``acquire``'s path once per row."""
        name = info.name
        if node._lazy_child is not None or node._lazy or self._granularity.get(name) is _TABLE:
            for key in keys:
                self.acquire(node, info, key, mode)
            return
        held = node._modes_held
        if held is not None:
            current = held.get(name)
            if current is not None and _COVERS[current][mode]:
                return
            keys = [key for key in keys if (current := held.get((name, key))) is None
                    or not _COVERS[current][mode]]
        if not keys:
            return
        node._holds = True
        try:
            self.lock_manager.acquire_tuples(node.id, ("table", name), keys, mode, self.lock_timeout,
                                             [("row", name, key) for key in keys])
        except (DeadlockDetected, LockWaitTimeout) as error:
            node._doom(error)
            raise
        except lockmgr.TransactionNotActive as error:
            _raise_aborted(node, error)
        _note_tuple(node, name, mode)
        for key in keys:
            _note_held(node, (name, key), mode)

    def _grant_lazily(self, node: "Transaction", name: str, key: "Key | None", mode: Mode) -> bool:
        """Lazy ``node``'s request, granted now as its parent's retain (``LockManager.try_retain``, recorded
        in ``node._grants``) exactly when ``node``'s own request would be granted at once (README, "Lazy
        inline subtransactions"); False: it would wait (nothing was granted for this request but maybe the
        intention lock, which stays a grant)."""
        locks, parent = self.lock_manager, node.parent
        grantee = _grantee(node)           # (its parent, or for a frame's frame the nearest node not lazy)
        parent_id = grantee.id
        grants = node._grants
        if grants is None:
            grants = node._grants = []
        if key is None or self._granularity.get(name) is _TABLE:
            if not locks.try_retain(parent_id, ("table", name), mode, grants):
                return False
            _note_held(node, name, mode)
            return True
        held = node._modes_held
        row = (name, key)
        if held is not None:
            table_mode = held.get(name)
            if table_mode is not None and _COVERS[table_mode][mode]:
                return True          # its table lock covers the row (nothing is locked at row level)
            # (Its own row grants are in its grantee's record, below: a lazy node notes tables only.)
        else:
            table_mode = None
        retained = parent._modes_retained  # type: ignore[union-attr]
        # (A frame's frame asks its grantee's record too: what the grantee retains covers it as well.)
        outer = grantee._modes_retained if grantee is not parent else None
        intention = _INTENTION[mode]
        if table_mode is None or not _COVERS[table_mode][intention]:
            # Answered by the parent's retains (the module docstring) unless the node locked the table itself.
            own_table = table_mode is None or table_mode in _INTENTIONS
            kept = retained.get(name) if retained is not None and own_table else None
            if (kept is None or not _COVERS[kept][intention]) and outer is not None and own_table:
                kept = outer.get(name)
            if kept is not None and _COVERS[kept][intention]:
                # (Not noted in ``_modes_held``: the parent retains it already; the next row asks again.)
                grants.append((("table", name), intention, lockmgr.UNCHANGED))
            elif locks.try_retain(parent_id, ("table", name), intention, grants):
                _note_held(node, name, intention)
            else:
                return False
        # The row, likewise answered by the parent's retains when they cover it ("Requests answered from the
        # records"): listed as a grant that changed nothing, as ``try_retain`` lists one.
        resource = ("row", name, key)
        kept = retained.get(row) if retained is not None else None
        if kept is not None and _COVERS[kept][mode]:
            grants.append((resource, mode, lockmgr.UNCHANGED))
            return True
        if outer is not None:
            outer_kept = outer.get(row)
            if outer_kept is not None and _COVERS[outer_kept][mode]:
                grants.append((resource, mode, lockmgr.UNCHANGED))
                return True
        if not locks.try_retain(parent_id, resource, mode, grants):
            return False
        # Recorded at once as the grantee's, which it now is (undone with the grant: ``_forget_grants``): the
        # next firing on the row is answered, and a frame's end has no record of its own to hand up.
        if grantee is parent:
            record, previous = retained, kept
        else:
            record = outer
            previous = outer.get(row) if outer is not None else None
        if record is None:
            grantee._modes_retained = {row: mode}
        else:
            record[row] = mode if previous is None else _JOIN[previous][mode]
        return True

    @staticmethod
    def retain_grants(node: "Transaction") -> None:
        """The frame ``node`` opens a frame of its own: what it was granted counts as retained from now on, as
        a node's holds become retained before it creates a child (README, "Frames in frames")."""
        grants = node._grants
        node._grants_retained = len(grants) if grants else 0
        held, node._modes_held = node._modes_held, None
        if held:
            _note_retained(node, held)

    def release_holds(self, node: "Transaction") -> None:
        """What ``node``'s own operations hold becomes *retained*, in place (``LockManager.retain``): its
        descendants may have those rows (Rule 1), other trees still may not.  Called by the thread running
        the node before it creates a child, waits for its children, or commits."""
        if node._lazy_child is not None:
            self.materialize(node._lazy_child)    # what the node holds is its lazy child's: hand it down
        if node._holds and not node._lazy:
            node._holds = False
            try:
                self.lock_manager.retain(node.id)
            except lockmgr.TransactionNotActive:
                # An ancestor's abort reached the lock manager first (``doom`` comes before it, so the node
                # is doomed): its locks are gone with the ancestor's, there is nothing left to retain.
                if node._doomed is None:
                    raise
                return
            held, node._modes_held = node._modes_held, None
            if held:
                _note_retained(node, held)

    def stop_retaining(self, node: "Transaction", rows: "list[tuple[str, Key]]") -> None:
        """``node`` (a top-level transaction at its flush) retains nothing on ``rows`` from now on, in the lock
        manager and in its record (``RowLocks.hand_over``: PostgreSQL's row locks guard them)."""
        self.lock_manager.undo_retains(node.id, [(("row", name, key), Mode.UPDATE, None) for name, key in rows])
        for record in (node._modes_held, node._modes_retained):
            if record is not None:
                for row in rows:
                    record.pop(row, None)

    @staticmethod
    def logical_snapshot(snapshot: lockmgr.LockTableSnapshot, lazy: "list[Transaction]") -> lockmgr.LockTableSnapshot:
        """``snapshot`` with each node of ``lazy`` (live lazy nodes) in place: it is a transaction, its parent's
        commit edge to it is a wait (as to a materialized inline child), it holds what it was granted (``_grants``; the first ``_grants_retained`` of them it retains), and its grantee
        retains what it retained before those grants.  A chain of frames in frames is drawn innermost first,
        so that each grantee entry goes back to what it was before the oldest grant."""
        if not lazy:
            return snapshot
        transactions = dict(snapshot.transactions)
        resources = dict(snapshot.resources)
        waits = {waiter: dict(edges) for waiter, edges in snapshot.waits.items()}
        for node in sorted(lazy, key=lambda member: -member.depth):
            grantee_id = _grantee(node).id
            template = transactions.get(grantee_id)
            if template is None:
                continue                       # the grantee's abort reached the lock manager
            transactions[node.id] = dataclasses.replace(
                template, tid=node.id, parent=node.parent.id)  # type: ignore[union-attr]  # (lazy: a parent)
            # An inline child: its parent waits for it all its life, the commit edge it has once materialized
            # (``awaited=True``), as the lock manager's snapshot lists it.
            waits.setdefault(node.parent.id, {}).setdefault(node.id, ("commit", None))  # type: ignore[union-attr]
            grants, kept = list(node._grants or ()), node._grants_retained
            for part, as_retained in ((grants[kept:], False), (grants[:kept], True)):
                wanted, before = lockmgr.fold_grants(part)
                for resource, mode in wanted.items():
                    holders = resources.get(resource)
                    if holders is None:
                        continue
                    held = dict(holders.held)
                    retained = dict(holders.retained)
                    if as_retained:
                        previous = retained.get(node.id)
                        retained[node.id] = mode if previous is None else _JOIN[previous][mode]
                    else:
                        held[node.id] = mode
                    if resource in before:
                        if before[resource] is None:
                            retained.pop(grantee_id, None)
                        else:
                            retained[grantee_id] = before[resource]  # type: ignore[assignment]  # (not None)
                    resources[resource] = dataclasses.replace(holders, held=types.MappingProxyType(held),
                                                              retained=types.MappingProxyType(retained))
                if not as_retained:
                    for edges in waits.values():       # "waits for the holder of r": the lazy node holds r
                        edge = edges.get(grantee_id)
                        if edge is not None and before.get(edge[1], False) is None:
                            edges.pop(grantee_id)
                            edges[node.id] = ("held", edge[1])
        return dataclasses.replace(snapshot, transactions=types.MappingProxyType(transactions),
                                   resources=types.MappingProxyType(resources),
                                   waits=types.MappingProxyType({waiter: types.MappingProxyType(edges)
                                                                 for waiter, edges in waits.items()}))

    def holders(self, table: str, key: object = None) -> lockmgr.Holders:
        """Who holds, retains and waits for a row (or, with ``key=None``, the table) — for tests and tools."""
        return self.lock_manager.holders(("table", table) if key is None else ("row", table, key))


def _forget_grants(grantee: "Transaction", grants: "list[Grant]") -> None:
    """``grantee``'s entries went back to what they were before ``grants`` (a lazy node's abort, or its
    materialization): so do the rows of its record that those grants recorded (``_grant_lazily``)."""
    record = grantee._modes_retained
    if record is None:
        return
    # (A grant's resource is a ("table", name) or ("row", name, key) tuple; a previous mode not UNCHANGED
    # is a Mode or None.)
    for resource, _, previous in reversed(grants):
        if previous is lockmgr.UNCHANGED or resource[0] != "row":  # type: ignore[index]
            continue
        if previous is None:
            record.pop(resource[1:], None)  # type: ignore[index]
        else:
            record[resource[1:]] = previous  # type: ignore[index, assignment]


def _grantee(node: "Transaction") -> "Transaction":
    """The node in whose name the lazy ``node``'s locks are granted: its nearest ancestor that is not lazy."""
    # (A lazy node has a parent, and so has every lazy ancestor: the walk ends on a node.)
    grantee: Transaction = node.parent  # type: ignore[assignment]
    while grantee._lazy:
        grantee = grantee.parent  # type: ignore[assignment]
    return grantee


def _raise_aborted(node: "Transaction", error: BaseException) -> None:
    """Raise activedb's error for a lock-manager refusal of a doomed ``node`` (its ancestor's abort reached
    the lock manager first), or the lock manager's own if ``node`` is not doomed (a bug: let it show)."""
    tid, doomed = node.id, None
    while node is not None and doomed is None:    # a node begun after the doom walk: its ancestor's
        doomed, node = node._doomed, node.parent  # type: ignore[assignment]  # (None ends the walk)
    if doomed is None:
        raise error
    raise TransactionAborted(f"transaction {tid} was aborted ({doomed}); start a new transaction") from error
