"""Errors of the ``coupling`` package.

Every error raised on purpose by this package is a :class:`CouplingError`; most also derive from the
builtin a caller would naturally catch (``ValueError`` for bad input, ``TimeoutError`` for a wait that
ran out, ``RuntimeError`` for a call made in the wrong state). Messages say what to do next.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence


class CouplingError(Exception):
    """Base class of every error raised by the ``coupling`` package."""


class UnknownCoupling(CouplingError, ValueError):
    """A coupling-mode name that is not one of the six modes."""

    def __init__(self, given: object, valid: Sequence[str]) -> None:
        self.given = given
        self.valid = tuple(valid)
        super().__init__(f"unknown coupling mode {given!r}; use one of: {', '.join(self.valid)} "
                         "(case-insensitive; '-' or ' ' may stand for '_')")


class InvalidActionCoupling(CouplingError, ValueError):
    """A condition-action (C-A) coupling other than immediate or sequential causally dependent."""

    def __init__(self, given: object, valid: Iterable[str]) -> None:
        self.given = given
        self.valid = tuple(sorted(valid))
        super().__init__(f"{given!s} is not a valid condition-action coupling; use one of: {', '.join(self.valid)} "
                         "(Concurrent Rule Execution §3.3.2: other modes make no sense between a condition and its "
                         "action)")


class InvalidArgument(CouplingError, ValueError):
    """A value the package cannot take: an unknown dependency kind, a transaction depending on itself, a deferred
    queue's cycle bound below 1, a gate's timeout that is no number, an outcome, a condition's result or a switch
    (``strict``) that is not True or False."""


class InvalidPriority(CouplingError, ValueError):
    """A rule priority that is neither a real number nor ``None``."""


class MalformedHistory(CouplingError, ValueError):
    """A recorded history that is not a history at all (e.g. a transaction that commits twice).

    This is a bug in whatever recorded the history, not a dependency violation: violations are
    *returned* by :func:`coupling.check_dependencies`, malformed input is *raised*.
    """


class DeferredQueueClosed(CouplingError, RuntimeError):
    """A deferred firing added after its transaction already ran (or discarded) its deferred cycles."""


class DeferredCycleLimitExceeded(CouplingError):
    """Deferred firings were still pending after the configured number of cycles."""

    def __init__(self, max_cycles: int, pending: Sequence[object], queue_name: str | None = None) -> None:
        self.max_cycles = max_cycles
        self.pending = tuple(pending)
        shown = ", ".join(repr(firing) for firing in self.pending[:5])
        more = f" and {len(self.pending) - 5} more" if len(self.pending) > 5 else ""
        where = f" of {queue_name}" if queue_name else ""
        super().__init__(f"deferred queue{where}: {len(self.pending)} firing(s) still pending after {max_cycles} "
                         f"cycle(s) (cycles 0..{max_cycles - 1}): {shown}{more}. Deferred rules are probably "
                         "re-firing each other; fix the rules or raise max_cycles.")


class GateError(CouplingError):
    """Base class of errors raised by :class:`coupling.DependencyGate`."""


class UnsupportedByGate(GateError, ValueError):
    """A dependency the gate does not enforce (the nested transaction tree enforces it)."""


class GateProtocolError(GateError, RuntimeError):
    """A gate call made in the wrong order (e.g. a transaction reported to end twice)."""


class DependencyTimeout(GateError, TimeoutError):
    """A ``wait_may_begin``/``wait_may_commit`` ran out of time while its triggers were still running.

    The gate's state is unchanged: the caller may wait again, or abort the dependent (and report it
    with ``trigger_ended(dependent, committed=False)``).
    """

    def __init__(self, dependent: Hashable, waiting_for: Iterable[Hashable], what: str, timeout: float) -> None:
        self.dependent = dependent
        self.waiting_for = tuple(waiting_for)
        super().__init__(f"{dependent!r} waited {timeout:g} s for permission to {what}; still waiting for "
                         f"{', '.join(repr(trigger) for trigger in self.waiting_for)} to end. Wait again, or abort "
                         f"{dependent!r} and report it with trigger_ended({dependent!r}, committed=False).")
