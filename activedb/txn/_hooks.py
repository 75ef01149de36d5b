"""The hook seams of the transaction manager (``README.md``, "Seams"): :class:`TransactionExtension` (active:
its exceptions propagate), :class:`Observer` (passive: one that raises is removed and logged), and
:class:`HookRegistry`.  Each hook method is a no-op whose docstring is the contract.

Thread-safety: hooks are called in the thread where the thing happens, with no activedb mutex held;
``HookRegistry`` publishes immutable tuples (readers need no lock), its ``_mutex`` serialises add/remove.
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import TYPE_CHECKING, Callable, Generic, Iterator, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from coupling import Coupling

    from activedb.events import Event
    from activedb.txn._tree import Transaction

logger = logging.getLogger("activedb.observers")


class TransactionExtension:
    """An active participant in every transaction of a :class:`~activedb.txn.TransactionManager`
    (``db.transactions.extensions.add(extension)``).  Exceptions propagate into the transaction."""

    def wants_old_images(self, table: str) -> bool:
        """True if data events on ``table`` are observed: writes then read the old row and emit events."""
        return False

    def on_begin(self, transaction: "Transaction") -> None:
        """A transaction started (top-level or sub), in its thread, before its body runs."""

    def on_event(self, transaction: "Transaction", event: "Event") -> None:
        """``event`` occurred in ``transaction`` (a write with its locks held, a ``signal``, an ``emit``);
        may raise to fail the operation (e.g. a failed immediate rule)."""

    def before_commit(self, transaction: "Transaction") -> None:
        """``transaction`` is about to commit (its body ended, before it waits for its children); may run
        more work in it (deferred rules) or raise to abort it."""

    def after_end(self, transaction: "Transaction", committed: bool) -> None:
        """``transaction`` committed (a top-level one: after PostgreSQL committed) or aborted.  A top-level one
        aborted because its flush lost the connection and could not read back whether PostgreSQL committed may have
        committed after all: ``lowlevel.outcome_unknown(transaction)`` says so (its log row tells, later)."""

    #: False: ``on_begin``, ``before_commit`` and a commit's ``after_end`` are not called for a *frame* (an
    #: inline subtransaction nobody has registered anything on, txn README "Frames"); an extension that
    #: needs a frame's end hooks asks for them (``lowlevel.want_end_hooks(tx)``: its ``before_commit`` and
    #: ``after_end`` are then called for it; their ``_in_frames`` lists are the others').
    frame_hooks: bool = True


class WaitKind(enum.StrEnum):
    """What a transaction waits for (``TransactionManager.waiting``, ``Observer.on_wait_start``); the kind of the
    wait-for edge the lock manager records.  Compares equal to its string value."""

    CHILDREN = "children"          # a node waits for children (its own: the lock manager's ``commit`` edge)
    COMMIT = "commit"              # the edge of a parent waiting for its own children (lockmgr's commit edge)
    NESTED = "nested"              # a thread running a transaction blocks inside a top-level one it opened
    DEPENDENCY = "dependency"      # a rule part waits in the coupling gate for the transaction it depends on
    STREAM = "stream"              # an s-transaction waits for a stream lock (SEI's table)
    STREAM_S2PL = "stream-s2pl"    # ... in S2PL's stream lock table
    STREAM_LWM = "stream-lwm"      # ... in LWM's stream lock table
    STREAM_ORDER = "stream-order"  # an s-transaction waits for an earlier one's pattern state
    ROW_LOCK = "row-lock"          # a flush waits in PostgreSQL for a row another tree locked for update


class FiringOutcome(enum.StrEnum):
    """What a firing came to: returned by ``RuleManager.fire`` (``activedb.rules`` re-exports it), and told to
    observers (``Observer.on_firing_end``).  Compares equal to its string value."""

    EXECUTED = "executed"                  # the condition held and the action ran
    CONDITION_FALSE = "condition_false"
    FAILED = "failed"                      # the condition or the action raised (``Fired.error`` says what)
    CANCELLED = "cancelled"                # something else ended it: a nested firing's failure or the cascade limit
                                           # its action let through, a deadlock or abort from outside (``Fired.error``)


class RuleView(Protocol):
    """What an observer reads of a firing's rule (``activedb.rules.Rule`` is one): its name (a firing's rule is
    registered, and the registry names every rule it holds)."""

    @property
    def name(self) -> str: ...


class FiringView(Protocol):
    """What an observer is told of a rule firing (``activedb.rules.Firing`` is one): the rule, the event, the
    cascade of rule names that led to it (outermost first) and the coupling it runs with."""

    @property
    def rule(self) -> RuleView: ...
    @property
    def event(self) -> Event: ...
    @property
    def chain(self) -> tuple[str, ...]: ...
    @property
    def coupling(self) -> Coupling: ...


class Observer:
    """A passive listener (``db.observe(observer)``).  An observer that raises is removed and logged."""

    def on_begin(self, transaction: "Transaction") -> None:
        """A transaction began (top-level or sub)."""

    def on_spawn(self, parent: "Transaction", child: "Transaction") -> None:
        """``parent`` created the child ``child`` (spawned on a worker or inline)."""

    def on_commit(self, transaction: "Transaction") -> None:
        """``transaction`` committed (a top-level one: after PostgreSQL committed)."""

    def on_abort(self, transaction: "Transaction", reason: BaseException | None) -> None:
        """``transaction`` aborted, for ``reason``."""

    def on_wait_start(self, transaction: "Transaction", kind: WaitKind, detail: str | None) -> None:
        """``transaction`` starts to wait (``kind``: a :class:`WaitKind`; ``detail``: what it waits for)."""

    def on_wait_end(self, transaction: "Transaction", kind: WaitKind, detail: str | None) -> None:
        """The wait announced by ``on_wait_start`` ended (granted, or failed)."""

    def on_firing_start(self, transaction: "Transaction", firing: FiringView) -> None:
        """The rule firing ``firing`` (an ``activedb.rules.Firing``) starts running in ``transaction``."""

    def on_firing_end(self, transaction: "Transaction", firing: FiringView, outcome: FiringOutcome) -> None:
        """The firing ended: ``outcome`` says how (a ``str`` enum: executed | condition_false | failed |
        cancelled)."""


_Member = TypeVar("_Member")


class HookRegistry(Generic[_Member]):
    """Members of one hook class; ``registry.<hook>`` is the tuple of bound methods that override it,
    ``registry.<hook>_in_frames`` those of members whose ``frame_hooks`` is true.

    ``passive=True`` (observers): a member whose hook raises is removed and the error logged.
    """

    def __init__(self, base: type[_Member], *, passive: bool) -> None:
        self._base = base
        self._passive = passive
        self._names = [name for name in vars(base) if not name.startswith("_") and callable(getattr(base, name))]
        self._mutex = threading.Lock()   # protects _members; published tuples are immutable
        self._members: tuple[_Member, ...] = ()
        self._publish()

    def add(self, member: _Member) -> _Member:
        if not isinstance(member, self._base):
            raise TypeError(f"expected a {self._base.__name__} (subclass it and override its hooks), got {member!r}")
        with self._mutex:
            if member not in self._members:
                self._members = self._members + (member,)
                self._publish()
        return member

    def remove(self, member: _Member) -> None:
        with self._mutex:
            self._members = tuple(other for other in self._members if other is not member)
            self._publish()

    def __iter__(self) -> Iterator[_Member]:
        return iter(self._members)

    if TYPE_CHECKING:
        hears_nodes: bool          # (set by _publish: README, "The lean run")
        hooked_in_frames: bool

        # ``registry.<hook>`` and ``registry.<hook>_in_frames``: the bound hooks, set by _publish.
        def __getattr__(self, name: str) -> tuple[Callable[..., object], ...]: ...

    def _publish(self) -> None:
        """Caller holds ``_mutex`` (or is the constructor).  One tuple per hook, of overriding members."""
        for name in self._names:
            default = getattr(self._base, name)
            bound = tuple(getattr(member, name) for member in self._members
                          if getattr(type(member), name, default) is not default)
            setattr(self, name, bound)
            setattr(self, f"{name}_in_frames", tuple(hook for hook in bound
                                                     if getattr(hook.__self__, "frame_hooks", True)))
        #: Whether a member wants a frame's begin or end hooks (``frame_hooks``): the lean run opens no savepoint then.
        self.hooked_in_frames = any(getattr(self, f"{name}_in_frames", ()) for name in
                                    ("on_begin", "before_commit", "after_end"))
        #: Whether a member hears of nodes — their begins, spawns, commits (observers) —: the lean run opens savepoints
        #: only while none does; observers of aborts, firings and waits do not stop it (README, "The lean run").
        self.hears_nodes = any(getattr(self, name, ()) for name in ("on_begin", "on_spawn", "on_commit"))

    def call(self, name: str, *args: object) -> None:
        """Call hook ``name`` on every member overriding it (passive: isolate failures)."""
        hooks = getattr(self, name)
        if not hooks:
            return
        if not self._passive:
            for hook in hooks:
                hook(*args)
            return
        for hook in hooks:
            try:
                hook(*args)
            except Exception:
                member = hook.__self__
                logger.exception("observer %r raised in %s; it is removed", member, name)
                self.remove(member)

    def any(self, name: str, *args: object) -> bool:
        """True if some member's hook ``name`` returns true (e.g. ``wants_old_images``)."""
        return any(hook(*args) for hook in getattr(self, name))

