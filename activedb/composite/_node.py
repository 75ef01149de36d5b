"""One composition node (the paper's CompositionNode, §V): a query's per-component partially ordered
lists for one partition; ``evaluate()`` is the paper's ``while (evaluate());`` then ``cleanUp()``
(design note ``activedb/composite/README.md``).  Not thread-safe by itself: used under ``CompositionEngine._mutex``.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Callable, Iterable

from activedb.composite._model import CompositeEvent, Partition, Resolution, Uncertainty, UncertaintyKind
from activedb.composite._polist import Decision, POList, Item, before, newest_before, oldest, oldest_following
from activedb.streams import CompiledQuery
from activedb.streams import algebra as ast
from activedb.streams.errors import EvaluationError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.composite._evaluation import Evaluation


def _without(items: list[Item], taken: list[Item]) -> list[Item]:
    """``items`` less the ones already chosen for earlier components (a type may fill several)."""
    if not taken:
        return items
    numbers = {item.number for item in taken}
    return [item for item in items if item.number not in numbers]


class Step(enum.Enum):
    """What one evaluation step did."""

    COMPOSED = "composed"        # a composite event (or a drop decided by the application): go on
    BLOCKED = "blocked"          # a candidate set is not stable: wait for sync-points to move
    IDLE = "idle"                # nothing to compose (a list is empty)


class Node:
    """The lists of one (query, partition).  ``lists[i]`` holds the events that may play the i-th
    component (after its event-only filters); an event of a type named by several components is in
    each of their lists, and leaves all of them when consumed."""

    __slots__ = ("query", "partition", "lists", "decisions", "blocked_on", "pending_resolutions", "types",
                 "names", "conjunction", "recent")

    def __init__(self, query: CompiledQuery, partition: Partition):
        self.query = query
        self.partition = partition
        self.types = tuple(query.types[index] for index in query.positives)
        components = query.definition.pattern.components()
        self.names = tuple(components[index].name for index in query.positives)
        self.lists: list[POList] = [POList() for _ in self.types]
        # (component rank, kind, candidate numbers, anchor number) -> ("use", item) | ("drop", items)
        self.decisions: dict[tuple[object, ...], Decision] = {}
        self.blocked_on: frozenset[str] = frozenset()
        self.pending_resolutions: list[Resolution] = []
        self.conjunction = isinstance(query.definition.pattern, ast.Conj)
        self.recent = query.definition.consumption is ast.Consumption.RECENT

    def size(self) -> int:
        return sum(len(items) for items in self.lists)

    def items(self) -> list[Item]:
        seen: dict[int, Item] = {}
        for items in self.lists:
            for item in items:
                seen.setdefault(item.number, item)
        return list(seen.values())

    def remove(self, doomed: list[Item]) -> None:
        numbers = {item.number for item in doomed}
        for index, items in enumerate(self.lists):
            if any(item.number in numbers for item in items):
                self.lists[index] = POList(item for item in items if item.number not in numbers)

    # --- evaluation ----------------------------------------------------------------------------------

    def evaluate(self, context: "Evaluation") -> None:
        """Compose until blocked or idle; then clean up."""
        self.blocked_on = frozenset()
        while True:
            if self.recent:
                step = self._recent_and(context) if self.conjunction else self._recent_seq(context)
            else:
                step = self._chronicle(context)
            if step is not Step.COMPOSED:
                break
        self._cleanup(context)

    def _stable(self, context: "Evaluation", rank: int, candidates: list[Item]) -> bool:
        if not candidates:
            return False
        blocking = context.members.blocking([item.ts for item in candidates], self.types[rank])
        if blocking:
            self.blocked_on = self.blocked_on | blocking
            return False
        context.members.rely(self.types[rank], min(item.ts.interval.upper for item in candidates))
        return True

    def _decide(self, context: "Evaluation", rank: int, kind: UncertaintyKind, candidates: list[Item],
                chosen: list[Item], anchor: Item | None) -> Decision:
        """Resolve an uncertainty: ("use", item) or ("drop", items).  Raises UncertainOrder if the
        application gives no choice (in an ingestion's batch: drops the candidates, refused, recording no
        decision).  A decision is asked once per distinct situation."""
        candidates = sorted(candidates, key=Item.sort_key)
        key = (rank, kind, tuple(item.number for item in candidates), anchor.number if anchor else None,
               tuple(item.number for item in chosen))
        cached = self.decisions.get(key)
        if cached is not None:
            return cached
        uncertainty = Uncertainty(self.query.name, self.partition, self.names[rank], kind,
                                  tuple(item.event for item in candidates), tuple(item.event for item in chosen),
                                  anchor.event if anchor is not None else None)
        decision = context.resolve(uncertainty, candidates)
        if decision is None:    # refused in an ingestion's batch: the candidates leave, no decision to record
            return ("drop", candidates)
        self.decisions[key] = decision
        if decision[0] == "drop":
            self.pending_resolutions.append(Resolution(uncertainty, None, tuple(item.event for item in decision[1])))
        else:
            self.pending_resolutions.append(Resolution(uncertainty, decision[1].event))
        return decision

    def _choose(self, context: "Evaluation", rank: int, candidates: list[Item], chosen: list[Item],
                anchor: Item | None, in_order: Callable[[Item], bool]) -> "tuple[Item | None, Step | None]":
        """One item of component ``rank`` from ``candidates`` (not empty): the application decides among
        several (``MULTIPLE``), and on one whose order against ``anchor`` is uncertain (``UNORDERED``:
        ``in_order(pick)`` is false).  ``(pick, None)``, or ``(None, step)`` when the decision dropped
        items instead of picking."""
        if len(candidates) > 1:
            decision = self._decide(context, rank, UncertaintyKind.MULTIPLE, candidates, chosen, anchor)
            if decision[0] == "drop":
                return None, self._apply_drop(context, decision[1])
            pick = decision[1]
        else:
            pick = candidates[0]
        if anchor is not None and not in_order(pick):
            decision = self._decide(context, rank, UncertaintyKind.UNORDERED, [pick], chosen, anchor)
            if decision[0] == "drop":
                return None, self._apply_drop(context, decision[1])
        return pick, None

    def _apply_drop(self, context: "Evaluation", items: list[Item]) -> Step:
        self.remove(items)
        context.dropped(self, items)
        return Step.COMPOSED

    # chronicle: AND and SEQ (the paper's algorithms, with gaps (a)–(c) closed) ---------------------

    def _chronicle(self, context: "Evaluation") -> Step:
        if any(not items for items in self.lists):
            return Step.IDLE
        chosen: list[Item] = []
        for rank, items in enumerate(self.lists):
            available = _without(items, chosen)
            if rank == 0 or self.conjunction:
                candidates = oldest(available)
                anchor = None
            else:
                anchor = chosen[-1]
                candidates = oldest_following(available, anchor)
            if not self._stable(context, rank, candidates):
                return Step.BLOCKED if candidates or self.blocked_on else Step.IDLE
            # Gap (c) inside: a single candidate whose order relative to its predecessor is uncertain.
            pick, dropped = self._choose(context, rank, candidates, chosen, anchor,
                                         lambda pick: before(anchor.ts, pick.ts))  # type: ignore[union-attr]
            if dropped is not None:
                return dropped
            chosen.append(pick)  # type: ignore[arg-type]  # (chosen when nothing was dropped)
        if context.compose(self, chosen):    # first: a RETURN that raises leaves the pair in the lists
            self.remove(chosen)
        return Step.COMPOSED

    # recent: derived (see the README) ----------------------------------------------------------------

    def _recent_seq(self, context: "Evaluation") -> Step:
        """Recent ``SEQ``, as the design note's "Recent consumption, derived" says."""
        last = len(self.lists) - 1
        for terminator in sorted(self.lists[last], key=Item.sort_key):
            if not self._settled_before(context, terminator, range(last)):
                continue
            chosen = [terminator]
            complete = True
            for rank in range(last - 1, -1, -1):
                pick, dropped = self._newest_before(context, rank, chosen, chosen[0])
                if dropped is not None:
                    return dropped
                if pick is None:
                    complete = False
                    break
                chosen.insert(0, pick)
            if complete and not context.compose(self, chosen):     # first: a RETURN that raises leaves the
                return Step.COMPOSED             # terminator in its list; refused, one constituent left the lists
            self.lists[last] = POList(item for item in self.lists[last] if item is not terminator)
            if not complete:
                context.unmatched(self, terminator)
            return Step.COMPOSED
        return Step.BLOCKED if self.blocked_on else Step.IDLE

    def _settled_before(self, context: "Evaluation", item: Item, ranks: Iterable[int]) -> bool:
        """Whether no event of the components ``ranks`` can still come before ``item`` (their producers'
        sync-points are past it); if so the decision relies on that, else the node notes what blocks it."""
        ranks = list(ranks)
        blocking: frozenset[str] = frozenset()
        for rank in ranks:
            blocking = blocking | context.members.blocking([item.ts], self.types[rank])
        if blocking:
            self.blocked_on = self.blocked_on | blocking
            return False
        for rank in ranks:
            context.members.rely(self.types[rank], item.ts.interval.upper)
        return True

    def _newest_before(self, context: "Evaluation", rank: int, taken: list[Item],
                       anchor: Item) -> "tuple[Item | None, Step | None]":
        """The newest item of component ``rank`` before ``anchor`` and not in ``taken``, as ``_choose`` picks
        it: ``(pick, None)``, ``(None, step)`` when a decision dropped items, ``(None, None)`` when none."""
        candidates = newest_before(_without(self.lists[rank], taken), anchor)
        if not candidates:
            return None, None
        return self._choose(context, rank, candidates, taken, anchor, lambda pick: before(pick.ts, anchor.ts))

    def _recent_and(self, context: "Evaluation") -> Step:
        """Recent ``AND``, as the design note's "Recent consumption, derived" says."""
        count = len(self.lists)
        pending = sorted({item.number: item for items in self.lists for item in items
                          if not item.processed}.values(), key=Item.sort_key)
        for event in pending:
            ranks = [rank for rank in range(count) if any(item is event for item in self.lists[rank])]
            if not self._settled_before(context, event, [rank for rank in range(count) if rank not in ranks]):
                continue
            compositions: list[list[Item]] = []
            for own in ranks:
                chosen: list[Item | None] = [None] * count
                chosen[own] = event
                complete = True
                for rank in range(count):
                    if rank == own:
                        continue
                    taken = [item for item in chosen if item is not None]
                    pick, dropped = self._newest_before(context, rank, taken, event)
                    if dropped is not None:
                        return dropped
                    if pick is None:
                        complete = False
                        break
                    chosen[rank] = pick
                if complete:
                    compositions.append([item for item in chosen if item is not None])
            # Every RETURN computed first (one that raises, like an uncertainty raised above, leaves the event
            # unprocessed, to be decided again, and nothing emitted); only now does the event count as processed.
            resolutions = tuple(self.pending_resolutions)
            composites: list[CompositeEvent] = []
            for composition in compositions:
                try:
                    composites.append(context.build(self, composition, () if composites else resolutions))
                except EvaluationError as error:
                    context.refuse(self, composition, error)     # raises, or one constituent left the lists
                    return Step.COMPOSED
            event.processed = True
            for composite in composites:
                context.emit(self, composite)
            if not compositions:
                context.unmatched(self, event)
            return Step.COMPOSED
        return Step.BLOCKED if self.blocked_on else Step.IDLE

    # clean-up ----------------------------------------------------------------------------------------

    def _cleanup(self, context: "Evaluation") -> None:
        """Drop events that can never be composed any more (the paper's unspecified cleanUp(); what is
        dropped: the design note, after "The three gaps in the printed pseudocode")."""
        if not self.recent:
            if self.conjunction:
                return
            for rank in range(1, len(self.lists)):
                previous = self.lists[rank - 1]
                useless = [item for item in self.lists[rank]
                           if all(other is not item and before(item.ts, other.ts) for other in previous)
                           and not context.members.blocking([item.ts], self.types[rank - 1])]
                if useless:
                    for item in useless:
                        context.members.rely(self.types[rank - 1], item.ts.interval.upper)
                    self.remove(useless)
                    context.discarded(self, useless)
            return
        count = len(self.lists)
        for rank in range(count):
            lookers = [rank + 1] if not self.conjunction else [other for other in range(count) if other != rank]
            lookers = [looker for looker in lookers if looker < count]
            if not lookers:
                continue
            items = self.lists[rank]
            if len(items) < 2:
                continue
            ruled_out = []
            for item in items:
                if self.conjunction and not item.processed:
                    continue
                for newer in items:
                    if newer is not item and before(item.ts, newer.ts) and self._rules_out(context, newer, lookers):
                        ruled_out.append(item)
                        break
            if ruled_out:
                self.remove(ruled_out)
                context.discarded(self, ruled_out)

    def _rules_out(self, context: "Evaluation", newer: Item, lookers: list[int]) -> bool:
        for looker in lookers:
            for item in self.lists[looker]:
                if self.conjunction and item.processed:
                    continue
                if item is newer or not before(newer.ts, item.ts):
                    return False
            if context.members.blocking([newer.ts], self.types[looker]):
                return False
        for looker in lookers:
            context.members.rely(self.types[looker], newer.ts.interval.upper)
        return True
