"""Recorded histories (:class:`HistoryEvent`, :class:`DependencyHistory`) and :func:`check_dependencies`,
which evaluates each dependency's ACTA definition on one (``coupling/README.md``, "Histories").

Thread-safety: :class:`HistoryEvent` is immutable; :class:`DependencyHistory` is thread-safe;
:func:`check_dependencies` is a pure function.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from ._dependencies import Dependency, DependencyKind
from .errors import InvalidArgument, MalformedHistory


class HistoryEventKind(enum.StrEnum):
    """What happened to a transaction. Compares equal to its lower-case string value."""

    BEGIN = "begin"
    COMMIT = "commit"
    ABORT = "abort"


@dataclass(frozen=True)
class HistoryEvent:
    """One event of a history: transaction ``tid`` began, committed or aborted at position ``seq``.

    ``kind`` may be given as a string (``"commit"``, case-insensitive). ``seq`` is a sequence number or
    a timestamp; events of one history must have distinct ``seq`` values (precedence is total).
    ``result`` is only meaningful on the commit of a rule's condition transaction: what the condition
    returned (``True``/``False``), checked by a CRD dependency; it must be ``None`` on other kinds.
    """

    tid: Hashable
    kind: HistoryEventKind
    seq: float
    result: bool | None = None

    def __post_init__(self) -> None:
        kind: object = self.kind     # (as given: a string is taken too)
        if not isinstance(kind, HistoryEventKind):
            try:
                object.__setattr__(self, "kind", HistoryEventKind(str(kind).lower()))
            except ValueError:
                raise MalformedHistory(f"unknown history event kind {kind!r}; use one of: "
                                       f"{', '.join(kind.value for kind in HistoryEventKind)}") from None
        if self.result is not None and self.kind is not HistoryEventKind.COMMIT:
            raise MalformedHistory(f"{self.tid!r}: only a commit event may carry a condition result, not "
                                   f"{self.kind.value}")

    def __str__(self) -> str:
        result = "" if self.result is None else f"(result={self.result})"
        return f"{self.kind.value}[{self.tid}]{result}@{self.seq}"


class DependencyHistory:
    """Records events from many threads with a total order given by a shared counter.

    Thread-safe: ``record`` takes ``self._mutex`` (protects the counter and the event list together,
    so list order == sequence order). Record a transaction's end *before* reporting it to a
    :class:`~coupling.DependencyGate` (``trigger_ended``), so that anything the gate then allows is
    recorded after it.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # protects _counter and _events
        self._counter = itertools.count()
        self._events: list[HistoryEvent] = []  # Invariant: sorted by seq, seq values 0, 1, 2, ...

    def record(self, tid: Hashable, kind: HistoryEventKind | str, result: bool | None = None) -> HistoryEvent:
        """Append an event for ``tid`` and return it."""
        with self._mutex:
            # a string kind is converted by HistoryEvent.__post_init__
            event = HistoryEvent(tid, kind, next(self._counter), result)  # type: ignore[arg-type]
            self._events.append(event)
            return event

    def begin(self, tid: Hashable) -> HistoryEvent:
        return self.record(tid, HistoryEventKind.BEGIN)

    def commit(self, tid: Hashable, result: bool | None = None) -> HistoryEvent:
        return self.record(tid, HistoryEventKind.COMMIT, result)

    def abort(self, tid: Hashable) -> HistoryEvent:
        return self.record(tid, HistoryEventKind.ABORT)

    def events(self) -> tuple[HistoryEvent, ...]:
        """A snapshot of the events recorded so far, in order."""
        with self._mutex:
            return tuple(self._events)


@dataclass(frozen=True)
class _Life:
    """The events of one transaction in a well-formed history."""

    begin: HistoryEvent | None = None
    commit: HistoryEvent | None = None
    abort: HistoryEvent | None = None


def _index(history: Iterable[HistoryEvent]) -> dict[Hashable, _Life]:
    """``history`` by transaction, once checked to be well formed (design note, "Histories"); an abort may
    come without a begin (a transaction cancelled before it ran)."""
    events = sorted(history, key=lambda event: event.seq)
    for earlier, later in itertools.pairwise(events):
        if not earlier.seq < later.seq:
            raise MalformedHistory(f"events {earlier} and {later} have the same position; give every event a "
                                   "distinct seq")
    lives: dict[Hashable, dict[str, HistoryEvent]] = {}
    for event in events:
        life = lives.setdefault(event.tid, {})
        if event.kind is HistoryEventKind.BEGIN:
            if "begin" in life:
                raise MalformedHistory(f"{event.tid!r} begins twice ({life['begin']}, {event})")
            if "commit" in life or "abort" in life:
                raise MalformedHistory(f"{event.tid!r} begins ({event}) after it ended")
            life["begin"] = event
        else:
            for ended in ("commit", "abort"):
                if ended in life:
                    raise MalformedHistory(f"{event.tid!r} ends twice ({life[ended]}, {event})")
            if event.kind is HistoryEventKind.COMMIT and "begin" not in life:
                raise MalformedHistory(f"{event.tid!r} commits ({event}) without a begin event")
            life[event.kind.value] = event
    return {tid: _Life(**life) for tid, life in lives.items()}


def _precedes(first: HistoryEvent | None, second: HistoryEvent | None) -> bool:
    """ACTA's ``first -> second``: both occurred and ``first`` came first."""
    return first is not None and second is not None and first.seq < second.seq


def check_dependencies(
    history: Iterable[HistoryEvent], dependencies: Iterable[Dependency], *, strict: bool = False
) -> list[str]:
    """Return the violations of ``dependencies`` in ``history`` (an empty list when all hold), each
    checked by its ACTA definition (:class:`~coupling.DependencyKind`) on the history as given.

    AD and ED hold on a complete history even if ``j`` committed while ``i`` was still running and ``i``
    happened to end the right way. ``strict=True`` also rejects such lucky histories, i.e. requires
    what an enforcing system must do: under AD, ``Commit_j in H => Commit_i -> Commit_j``; under ED,
    ``Commit_j in H => Abort_i -> Commit_j``. (CD, WD, SQD and CRD already constrain the order.)

    Give complete histories: a dependency whose consequence has not happened *yet* is reported.
    Raises :class:`~coupling.errors.MalformedHistory` if the history is not well formed, and
    :class:`~coupling.errors.InvalidArgument` if ``strict`` is not True or False.
    """
    if not isinstance(strict, bool):    # ("no" is truthy: a lenient check asked for would be a strict one)
        raise InvalidArgument(f"check_dependencies(strict={strict!r}) takes True or False (True also rejects a lucky "
                              f"AD or ED history)")
    lives = _index(history)
    nothing = _Life()
    violations: list[str] = []
    for dependency in sorted(dependencies, key=str):
        dependent = lives.get(dependency.dependent, nothing)
        trigger = lives.get(dependency.trigger, nothing)
        kind = dependency.kind
        problem: str | None = None
        if kind is DependencyKind.CD:
            if dependent.commit and trigger.commit and not _precedes(trigger.commit, dependent.commit):
                problem = f"both committed but {dependent.commit} precedes {trigger.commit}"
        elif kind is DependencyKind.AD or kind is DependencyKind.ED:
            # Duals: the trigger's abort (AD) or commit (ED) forces the dependent's abort; strictly, a
            # dependent's commit must follow the trigger's other end.
            if kind is DependencyKind.AD:
                forcing, required, word = trigger.abort, trigger.commit, "commit"
            else:
                forcing, required, word = trigger.commit, trigger.abort, "abort"
            if forcing and not dependent.abort:
                problem = f"{forcing} but {dependency.dependent!r} did not abort"
            elif strict and dependent.commit and not _precedes(required, dependent.commit):
                problem = f"strict: {dependent.commit} is not preceded by the {word} of {dependency.trigger!r}"
        elif kind is DependencyKind.WD:
            if trigger.abort and not _precedes(dependent.commit, trigger.abort) and not dependent.abort:
                problem = f"{trigger.abort} before {dependency.dependent!r} committed, but it did not abort"
        elif kind is DependencyKind.SQD:
            if dependent.begin and not _precedes(trigger.commit, dependent.begin):
                problem = f"{dependent.begin} is not preceded by the commit of {dependency.trigger!r}"
        else:
            assert kind is DependencyKind.CRD, kind
            if dependent.commit:
                if not _precedes(trigger.commit, dependent.commit):
                    problem = f"{dependent.commit} is not preceded by the commit of {dependency.trigger!r}"
                elif trigger.commit is not None and trigger.commit.result is not True:   # (it is: it precedes)
                    problem = (f"{dependent.commit} although condition {dependency.trigger!r} returned "
                               f"{trigger.commit.result!r}, not True")
        if problem is not None:
            violations.append(f"{dependency} violated ({dependency.describe()}): {problem}")
    return violations
