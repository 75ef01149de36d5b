"""The composition nodes of one engine and what they call while they evaluate (the paper's §V.B
``while (evaluate())``, §V.D uncertainty; design note ``activedb/composite/README.md``).  Not
thread-safe by itself: used under ``CompositionEngine._mutex``.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Sequence, TypedDict

from activedb.clock import Clock
from activedb.composite._members import Members
from activedb.composite._model import Choice, CompositeEvent, Partition, Resolution, Uncertainty, describe_event
from activedb.composite._node import Node
from activedb.composite._polist import Decision, Item, POList
from activedb.composite.errors import CompositeError, EventRejected, UncertainOrder
from activedb.events import hull
from activedb.streams import CompiledQuery, Ctx, StreamEvent
from activedb.streams.errors import EvaluationError


class EvaluationSnapshot(TypedDict):
    """What :meth:`Evaluation.snapshot` saves: per node the node and its lists, decisions, blocking types and
    pending resolutions; each item's ``processed`` flag by number; the blocked nodes; the window's composites and
    uncertainties."""

    nodes: dict[tuple[str, Partition], tuple[Node, list[POList], dict[tuple[object, ...], Decision], frozenset[str],
                                             list[Resolution]]]
    processed: dict[int, bool]
    blocked: set[tuple[str, Partition]]
    composites: list[CompositeEvent]
    uncertainties: list[Uncertainty]


class Evaluation:
    """The nodes of one engine (one per query and ``[attr]`` partition), which of them wait for sync-points
    (``blocked``), the outbox, the uncertainties of the current call (``raised``), the recent composites and
    uncertainties kept for the picture and weak membership's check."""

    def __init__(self, members: Members, clock: Clock, counts: collections.Counter[str],
                 on_uncertain: Callable[[Uncertainty], Choice | StreamEvent | None] | None, window: int):
        self.members = members
        self.clock = clock
        self.counts = counts
        self.on_uncertain = on_uncertain
        self.nodes: dict[tuple[str, Partition], Node] = {}
        self.blocked: set[tuple[str, Partition]] = set()
        self.outbox: list[CompositeEvent] = []
        self.raised: list[UncertainOrder] = []              # uncertainties met during the current call
        self.composites: collections.deque[CompositeEvent] = collections.deque(maxlen=window)
        self.uncertainties: collections.deque[Uncertainty] = collections.deque(maxlen=window)
        # An ingestion's batch (``CompositionEngine._process_refusing``): a RETURN that raises refuses the event
        # that completed the composition (``refuse``), and an uncertainty no callback decides refuses its
        # candidates (``resolve``), instead of raising.
        self.refusing = False
        self.refused: list[tuple[StreamEvent, EventRejected | UncertainOrder]] = []  # (while refusing) dead letters
        self.discarding: list[StreamEvent] = []   # (while refusing) refused candidates still to leave every list
        self.returned: list[StreamEvent] = []     # (while refusing) events a RETURN refused (the batch runs again)

    def node(self, query: CompiledQuery, partition: Partition) -> Node:
        """The node of ``query`` for ``partition`` (made on first use)."""
        key = (query.name, partition)
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = Node(query, partition)
        return node

    def evaluate(self, node: Node) -> None:
        key = (node.query.name, node.partition)
        try:
            node.evaluate(self)
        except UncertainOrder as error:
            # Raised at the end of the call (after every input of it was taken); the node keeps its
            # events and raises again whenever it is evaluated, until the application decides.
            if all(str(error) != str(other) for other in self.raised):
                self.raised.append(error)
            self.blocked.add(key)
            return
        if node.blocked_on:
            self.blocked.add(key)
        else:
            self.blocked.discard(key)
        if not node.size() and not node.blocked_on:
            self.nodes.pop(key, None)

    def wake(self, types: Iterable[str], skip: Sequence[Node] = ()) -> None:
        """Evaluate again the blocked nodes of ``types`` (a sync-point moved), but those in ``skip``."""
        types = set(types)
        for key in sorted(self.blocked, key=repr):
            node = self.nodes.get(key)
            if node is None or any(node is skipped for skipped in skip):
                continue
            if types & set(node.types):
                self.evaluate(node)

    def drop(self, doomed: Callable[[Item], bool]) -> None:
        """Take the items ``doomed`` picks out of every list, evaluating the nodes that held them."""
        for node in list(self.nodes.values()):      # (evaluating drops a node it empties)
            items = [item for item in node.items() if doomed(item)]
            if items:
                node.remove(items)
                self.counts["dropped"] += len(items)
                self.evaluate(node)

    def blocked_nodes(self) -> list[tuple[tuple[str, Partition], Node]]:
        """The nodes waiting for sync-points, in a stable order."""
        return [(key, self.nodes[key]) for key in sorted(self.blocked, key=repr) if key in self.nodes]

    def take_outbox(self) -> list[CompositeEvent]:
        outputs, self.outbox = self.outbox, []
        return outputs

    # --- what a node calls while it evaluates ----------------------------------------------------------

    def resolve(self, uncertainty: Uncertainty, candidates: list[Item]) -> Decision | None:
        """The application's decision on ``uncertainty``; raises UncertainOrder if it gives none — but while
        ``refusing`` (an ingestion's batch, which a raise would fail on every delivery, the engine returning to
        the same state each time) the candidates are refused instead: handed back for the dead letters, to
        leave every list (``discarding``), and None is returned (the node drops them without a decision)."""
        self.counts["uncertainties"] += 1
        self.uncertainties.append(uncertainty)
        answer = None if self.on_uncertain is None else self.on_uncertain(uncertainty)
        if answer is None and self.refusing:
            for item in candidates:
                self.refused.append((item.event, UncertainOrder(uncertainty, refused=True)))
                self.discarding.append(item.event)
            return None
        if answer is None:
            raise UncertainOrder(uncertainty)
        if isinstance(answer, StreamEvent):
            answer = Choice.use(answer)
        if not isinstance(answer, Choice):
            raise CompositeError(f"on_uncertain returned {answer!r}; return Choice.use(event), Choice.drop(*events), "
                                 f"one of the candidate events, or None to raise UncertainOrder")
        if answer.use_event is not None:
            for item in candidates:
                if item.event == answer.use_event:
                    self.counts["decisions"] += 1      # (a refused answer is no decision)
                    return ("use", item)
            raise CompositeError(f"on_uncertain chose {describe_event(answer.use_event)}, which is not one of the "
                                 f"candidates ({', '.join(describe_event(item.event) for item in candidates)})")
        dropped = []
        for event in answer.dropped:
            matches = [item for item in candidates if item.event == event]
            if not matches:
                raise CompositeError(f"on_uncertain dropped {describe_event(event)}, which is not a candidate")
            dropped.extend(matches)
        self.counts["decisions"] += 1
        return ("drop", dropped)

    def compose(self, node: Node, chosen: list[Item]) -> bool:
        """Produce the composite event of ``chosen``: True; False if its RETURN raised and the event that
        completed it was refused (``refuse``: the node's lists changed, ``chosen`` is not used up)."""
        try:
            composite = self.build(node, chosen, tuple(node.pending_resolutions))
        except EvaluationError as error:
            self.refuse(node, chosen, error)
            return False
        self.emit(node, composite)
        return True

    def refuse(self, node: Node, chosen: list[Item], error: EvaluationError) -> None:
        """The RETURN of ``node``'s query raised ``error`` on ``chosen``: raise it (saying which query and events, and
        what to do), unless ``refusing`` (an
        ingestion's batch, which a raise would fail on every delivery); then the constituent that arrived last
        (the one that completed the composition) leaves this node's lists, is handed back as refused (a
        dead letter) and recorded in ``returned`` (the engine runs the batch again as if without it, so that it
        leaves every query's lists: ``CompositionEngine._process_refusing``), and the others stay for later
        compositions."""
        if not self.refusing:
            events = ", ".join(describe_event(item.event) for item in chosen)
            raise EvaluationError(
                f"query {node.query.name}: the RETURN of the composition of {events} cannot be computed ({error}); "
                f"nothing was composed and these events stay in the query's lists, so every evaluation of them raises "
                f"this again — drop one with engine.discard(event), or correct the RETURN (a query of another name). "
                f"The call stopped here: in process(tx, …) abort tx (the engine returns to its state before the "
                f"batch); the composites made before it are in engine.take_outputs()") from error
        terminator = max(chosen, key=lambda item: item.number)
        node.remove([terminator])
        node.decisions.clear()
        node.pending_resolutions.clear()
        self.counts["dropped"] += 1
        self.returned.append(terminator.event)
        self.refused.append((terminator.event, EventRejected(
            f"event {describe_event(terminator.event)} completed a composition of query {node.query.name} "
            f"({', '.join(describe_event(item.event) for item in chosen)}) whose RETURN cannot be computed "
            f"({error}); it left every query's lists (the composition's other events stay) — correct the event "
            f"and replay it, or correct the query's RETURN")))

    def build(self, node: Node, chosen: list[Item], resolutions: tuple[Resolution, ...]) -> CompositeEvent:
        """The composite event of ``chosen``, changing nothing (its RETURN may raise)."""
        query = node.query
        events: list[StreamEvent | None] = [None] * len(query.types)
        for rank, item in enumerate(chosen):
            events[query.positives[rank]] = item.event
        ctx = Ctx(events)
        attributes = {name: function(ctx) for name, function in query.returns}
        return CompositeEvent(
            query=query.name, ts=hull([item.ts for item in chosen], producer=query.name), attributes=attributes,
            constituents=tuple(item.event for item in chosen), components=node.names, partition=node.partition,
            resolutions=resolutions,
            consumption=query.definition.consumption.value,  # type: ignore[union-attr]  # (create_query set it)
            operator="AND" if node.conjunction else "SEQ", sts=self.clock.now())

    def emit(self, node: Node, composite: CompositeEvent) -> None:
        """``composite`` (made by :meth:`build`) is produced."""
        node.pending_resolutions.clear()
        node.decisions.clear()
        self.counts["composites"] += 1
        self.outbox.append(composite)
        self.composites.append(composite)

    def dropped(self, node: Node, items: list[Item]) -> None:
        self.counts["dropped"] += len(items)
        node.decisions.clear()

    def discarded(self, node: Node, items: list[Item]) -> None:
        self.counts["discarded"] += len(items)

    def unmatched(self, node: Node, item: Item) -> None:
        self.counts["unmatched"] += 1

    # --- a batch's rollback ----------------------------------------------------------------------------

    def snapshot(self) -> EvaluationSnapshot:
        """Items are shared (immutable but for the ``processed`` flag, which is saved separately)."""
        nodes = {key: (node, [POList(items) for items in node.lists], dict(node.decisions), node.blocked_on,
                       list(node.pending_resolutions)) for key, node in self.nodes.items()}
        processed = {item.number: item.processed for node in self.nodes.values() for item in node.items()}
        return {"nodes": nodes, "processed": processed, "blocked": set(self.blocked),
                "composites": list(self.composites), "uncertainties": list(self.uncertainties)}

    def restore(self, snapshot: EvaluationSnapshot) -> None:
        self.nodes = {}
        items_by_number = {}
        for key, (node, lists, decisions, blocked_on, pending) in snapshot["nodes"].items():
            node.lists, node.decisions, node.blocked_on, node.pending_resolutions = lists, decisions, blocked_on, pending
            self.nodes[key] = node
            for item in node.items():
                items_by_number[item.number] = item
        for number, processed in snapshot["processed"].items():
            if number in items_by_number:
                items_by_number[number].processed = processed
        self.blocked = snapshot["blocked"]
        self.outbox = []
        self.composites.clear()
        self.composites.extend(snapshot["composites"])
        self.uncertainties.clear()
        self.uncertainties.extend(snapshot["uncertainties"])
