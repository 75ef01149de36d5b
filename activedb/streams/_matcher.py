"""Running one pattern query over one partition's events: :class:`Matcher` (per query),
:class:`PartitionState` (an immutable value per partition, kept until the event's
s-transaction and the batch commit) and :class:`Step`, one event's evaluation in two phases: :meth:`Matcher.prepare`
(pure, in the declared order) and :meth:`Step.complete` (inside the s-transaction: store reads, outputs).  The
selection semantics: the design note's choice 1 (``activedb/streams/README.md``).

Thread-safety: a ``Matcher`` is immutable; states are values.  Steps are used by one thread.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Hashable, Iterable, NamedTuple, Sequence

from activedb.events import Instant, seconds
from activedb.streams import algebra as ast
from activedb.streams._compile import CompiledQuery
from activedb.streams._expressions import Ctx, Fn
from activedb.streams._events import END_OF_STREAM, Output, Punctuation, StreamEvent, make_output

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams._view import StoreView


class PartitionState(NamedTuple):
    """``buffers[i]``: events that may play component ``i`` (skip-till-any-match) or, for
    negative components, the negative events (both selections); ``runs``: the bound
    events of each open run (skip-till-next-match), oldest run first."""

    buffers: tuple[tuple[StreamEvent, ...], ...]
    runs: tuple[tuple[StreamEvent, ...], ...] = ()

    def size(self) -> int:
        return sum(len(buffer) for buffer in self.buffers) + sum(len(run) for run in self.runs)


# PartitionState((buffers, runs)) without the named tuple's __new__ in Python (one per event and query).
_state = functools.partial(tuple.__new__, PartitionState)
_new_step = object.__new__


def _all(predicates: Iterable[Fn], ctx: Ctx) -> bool:
    for predicate in predicates:
        if predicate(ctx) is not True:
            return False
    return True


def _keep_within(buffers: list[tuple[StreamEvent, ...]], runs: tuple[tuple[StreamEvent, ...], ...], ts: Instant,
                 within: float) -> tuple[tuple[StreamEvent, ...], ...]:
    """Drop from ``buffers`` (in place) the events more than ``within`` seconds before ``ts``, and return ``runs``
    without those whose first event is (the same object if none is).  WITHIN includes its bound: an event exactly
    ``within`` before ``ts`` is kept.  Precondition: each buffer, and the runs by their first event, are in release
    order (so in timestamp order).  :func:`outside` is the same comparison."""
    if ts.__class__ is float or ts.__class__ is int:      # (a difference of numbers is in seconds)
        for index, buffer in enumerate(buffers):
            if buffer and ts - buffer[0].ts > within:
                buffers[index] = tuple(kept for kept in buffer if ts - kept.ts <= within)
        if runs and ts - runs[0][0].ts > within:
            runs = tuple(run for run in runs if ts - run[0].ts <= within)
    else:
        for index, buffer in enumerate(buffers):
            if buffer and seconds(ts - buffer[0].ts) > within:
                buffers[index] = tuple(kept for kept in buffer if seconds(ts - kept.ts) <= within)
        if runs and seconds(ts - runs[0][0].ts) > within:
            runs = tuple(run for run in runs if seconds(ts - run[0].ts) <= within)
    return runs


def outside(later: Punctuation, earlier: Instant, within: float) -> bool:
    """Is an event at ``earlier`` more than ``within`` seconds before ``later`` — outside the window of any event at
    or after ``later`` (:func:`_keep_within`'s comparison; END_OF_STREAM: always)?"""
    if later is END_OF_STREAM:
        return True
    if later.__class__ is float or later.__class__ is int:
        return bool(later - earlier > within)  # type: ignore[operator]
    return seconds(later - earlier) > within  # type: ignore[operator]


def earliest(state: PartitionState) -> Instant:
    """The timestamp of ``state``'s earliest event.  Precondition: ``state`` holds an event."""
    times: list[Instant] = [buffer[0].ts for buffer in state.buffers if buffer] + [run[0].ts for run in state.runs[:1]]
    return min(times)  # (the times of one engine are of one kind: they compare)


class Matcher:
    """The runtime of one compiled query."""

    def __init__(self, query: CompiledQuery):
        self.query = query
        self.width = len(query.types)
        self.by_type: dict[str, tuple[int, ...]] = {}
        for index, event_type in enumerate(query.types):
            self.by_type[event_type] = self.by_type.get(event_type, ()) + (index,)
        self.negative_by_index = {negative.index: negative for negative in query.negatives}
        self.empty = PartitionState(tuple(() for _ in query.types))
        self.any_match = query.selection is ast.Selection.SKIP_TILL_ANY_MATCH
        # Per component: the event-only filters an event playing it must pass (a negative's own, or the local ones).
        self.filters = {index: tuple(self.negative_by_index[index].local if index in self.negative_by_index
                                     else query.local.get(index, ()))
                        for index in range(self.width)}
        partition = query.partition
        if len(partition) == 1:
            attribute = partition[0]
            self.partition_key = lambda event: (event.attributes.get(attribute),)  # type: ignore[method-assign]

    def may_change(self, event_type: str) -> bool:
        """Can an event of ``event_type`` change a partition's state beyond pruning by the window?
        (The design note's "Matching order": what a concurrent scheduler runs in order.)"""
        if not self.any_match:
            return True
        accepting = self.query.accepting
        return any(index != accepting for index in self.by_type.get(event_type, ()))

    def expire(self, state: PartitionState, punctuation: Punctuation) -> PartitionState | None:
        """``state`` once ``punctuation`` is released: without the events and runs no later event can be matched
        with — those more than the query's ``WITHIN`` before ``punctuation`` (every later event has a timestamp at
        or after it), or all of them at ``END_OF_STREAM`` (no later event comes); None if nothing is left.  It is
        what :meth:`prepare` drops first for any later event, so pruning early changes no output.  A query without
        ``WITHIN`` keeps ``state`` whole before the end."""
        if punctuation is END_OF_STREAM:
            return None
        within = self.query.within
        if within is None:
            return state
        buffers = list(state.buffers)
        runs = _keep_within(buffers, state.runs, punctuation, within)
        if not any(buffers) and not runs:
            return None
        unchanged = runs is state.runs and all(kept is buffer for kept, buffer in zip(buffers, state.buffers))
        return state if unchanged else _state((tuple(buffers), runs))

    def partition_key(self, event: StreamEvent) -> tuple[Hashable, ...]:
        attributes = event.attributes
        return tuple(attributes.get(attribute) for attribute in self.query.partition)

    # --- phase 1 -------------------------------------------------------------------------

    def prepare(self, state: PartitionState | None, event: StreamEvent) -> "Step":
        """Precondition: ``event`` has a position and comes after every event ``state`` saw."""
        query = self.query
        state = state or self.empty
        indices = self.by_type[event.type]
        within = query.within
        buffers = list(state.buffers)
        runs = state.runs
        if within is not None:
            runs = _keep_within(buffers, runs, event.ts, within)
        ctx = None
        matches: dict[int, bool] = {}
        for index in indices:
            filters = self.filters[index]
            if not filters:
                matches[index] = True
                continue
            if ctx is None:
                ctx = Ctx([None] * self.width)
            ctx.events[index] = event
            matches[index] = _all(filters, ctx)
            ctx.events[index] = None
        if ctx is None and not self.any_match:
            ctx = Ctx([None] * self.width)          # (skip-till-next-match extends runs with it)
        accepting = query.accepting
        step = _new_step(Step)         # (Step(...) without __init__'s call: its slots set here, by mode)
        step.matcher, step.event, step.accepting = self, event, matches.get(accepting, False)
        if self.any_match:
            step.search = tuple(buffers)
            for index in indices:
                if index != accepting and matches[index]:
                    buffers[index] = buffers[index] + (event,)
            step.state = _state((tuple(buffers), ()))
            return step
        # Skip-till-next-match: advance the runs (pure), leave the accepting candidates to complete().
        positives = query.positives
        entries: list[tuple[tuple[StreamEvent, ...] | None, tuple[StreamEvent, ...] | None]] = []
        for run in runs:
            component = positives[len(run)]
            if matches.get(component) and self._extends(run, event, ctx, buffers):  # type: ignore[arg-type]
                extended = run + (event,)
                entries.append((run, extended) if component == accepting else (extended, None))
            else:
                entries.append((run, None))
        first = positives[0]
        if matches.get(first):
            entries.append((None, (event,)) if first == accepting else ((event,), None))
        for index in indices:
            if index in self.negative_by_index and matches[index]:
                buffers[index] = buffers[index] + (event,)
        step.buffers = tuple(buffers)
        step.entries = entries
        step.state = _state((step.buffers, tuple(kept for kept, candidate in entries
                                                  if candidate is None and kept is not None)))
        return step

    def _extends(self, run: tuple[StreamEvent, ...], event: StreamEvent, ctx: Ctx,
                 buffers: list[tuple[StreamEvent, ...]]) -> bool:
        """May ``run`` bind ``event`` as its next positive component (no store access)?"""
        query = self.query
        positives = query.positives
        rank = len(run)
        events = ctx.events
        for position, bound in enumerate(run):
            events[positives[position]] = bound
        events[positives[rank]] = event
        try:
            if not _all(query.joint_forward.get(rank, ()), ctx):
                return False
            return not self._killed(rank - 1, ctx, buffers)
        finally:
            for index in range(self.width):
                events[index] = None

    def _killed(self, left_rank: int, ctx: Ctx, buffers: Sequence[tuple[StreamEvent, ...]]) -> bool:
        """Is there a negative event between the positives of ranks ``left_rank`` and
        ``left_rank + 1`` (both bound in ``ctx``) that satisfies its predicates?"""
        positives = self.query.positives
        low = ctx.events[positives[left_rank]].position
        high = ctx.events[positives[left_rank + 1]].position
        for negative in self.query.negatives:
            if negative.left != left_rank:
                continue
            for candidate in buffers[negative.index]:
                if low < candidate.position < high:
                    ctx.events[negative.index] = candidate
                    try:
                        if _all(negative.predicates, ctx):
                            return True
                    finally:
                        ctx.events[negative.index] = None
        return False


class Step:
    """One event's evaluation by one query: :meth:`Matcher.prepare` made it, :meth:`complete` ends it."""

    # Set by Matcher.prepare: matcher, event, accepting, state; ``search`` (the buffers to search, skip-till-any-
    # match) or ``entries`` and ``buffers`` (skip-till-next-match).
    __slots__ = ("matcher", "event", "accepting", "state", "search", "entries", "buffers")
    matcher: Matcher
    event: StreamEvent
    accepting: bool
    state: PartitionState
    search: tuple[tuple[StreamEvent, ...], ...]
    entries: list[tuple[tuple[StreamEvent, ...] | None, tuple[StreamEvent, ...] | None]]
    buffers: tuple[tuple[StreamEvent, ...], ...]

    # --- phase 2 -------------------------------------------------------------------------

    def complete(self, reader: StoreView) -> tuple[list[Output], PartitionState]:
        """The outputs and the partition's new state; reads through ``reader``."""
        if self.matcher.any_match:
            if not self.accepting:
                return [], self.state
            output = self._search(reader)
            return ([output] if output is not None else []), self.state
        return self._complete_runs(reader)

    def _accepting_store(self, ctx: Ctx) -> bool:
        query = self.matcher.query
        if not query.accepting_store:
            return True
        ctx.events[query.accepting] = self.event
        try:
            return _all(query.accepting_store, ctx)
        finally:
            ctx.events[query.accepting] = None

    def _search(self, reader: StoreView) -> Output | None:
        matcher = self.matcher
        query = matcher.query
        ctx = Ctx([None] * matcher.width, reader)
        ctx.events[query.accepting] = self.event
        for predicate in query.accepting_store:      # (the accepting event's store predicates: _accepting_store)
            if predicate(ctx) is not True:
                return None
        # (a released event has its position)
        if not self._bind(ctx, len(query.positives) - 2, self.event.position):  # type: ignore[arg-type]
            return None
        return self._output([ctx.events[index] for index in query.positives], ctx)

    def _bind(self, ctx: Ctx, rank: int, upper: int) -> bool:
        """Bind the positives of ranks ``rank`` down to 0 in ``ctx``, each to the latest candidate before
        position ``upper`` (the one bound next to it) that passes its predicates; True if all are bound and the
        whole match holds.  (A method, not a closure: a recursive closure is a reference cycle per call.)"""
        matcher = self.matcher
        query = matcher.query
        buffers = self.search
        if rank < 0:
            for left in range(len(query.positives) - 1):
                if matcher._killed(left, ctx, buffers):
                    return False
            return _all(query.joint_store, ctx)
        component = query.positives[rank]
        predicates = query.joint_backward.get(rank, ())
        events = ctx.events
        for candidate in reversed(buffers[component]):
            if candidate.position >= upper:  # type: ignore[operator]
                continue
            events[component] = candidate
            if _all(predicates, ctx) and self._bind(ctx, rank - 1, candidate.position):  # type: ignore[arg-type]
                return True
        events[component] = None
        return False

    def _complete_runs(self, reader: StoreView) -> tuple[list[Output], PartitionState]:
        matcher = self.matcher
        query = matcher.query
        outputs: list[Output] = []
        kept_runs: list[tuple[StreamEvent, ...]] = []
        ctx = Ctx([None] * matcher.width, reader)
        # Like skip-till-any-match: the accepting event's own store predicates are read once
        # for every accepting event, whether or not a run is waiting for it.
        accepting_ok = self._accepting_store(ctx) if self.accepting else False
        for kept, candidate in self.entries:
            if candidate is None:
                kept_runs.append(kept)  # type: ignore[arg-type]
                continue
            completed = False
            if accepting_ok:
                for position, bound in zip(query.positives, candidate):
                    ctx.events[position] = bound
                completed = _all(query.joint_store, ctx)
                if completed:
                    outputs.append(self._output(list(candidate), ctx))
                for index in range(matcher.width):
                    ctx.events[index] = None
            if not completed and kept is not None:
                kept_runs.append(kept)
        return outputs, _state((self.buffers, tuple(kept_runs)))

    def _output(self, constituents: list[StreamEvent], ctx: Ctx) -> Output:
        query = self.matcher.query
        for index, bound in zip(query.positives, constituents):
            ctx.events[index] = bound
        attributes = {name: function(ctx) for name, function in query.returns}
        return make_output(query.name, max(event.ts for event in constituents), attributes, tuple(constituents),
                           time.perf_counter(), self.event.position)  # type: ignore[arg-type]

