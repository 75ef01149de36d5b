"""Every error ``activedb.composite`` raises on purpose.  Messages say what happened and what to do next."""

from __future__ import annotations

from typing import TYPE_CHECKING

from activedb.errors import ActivedbError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.composite._model import Uncertainty


class CompositeError(ActivedbError):
    """Base class of the composition layer's errors."""


class UncertainOrder(CompositeError):
    """The candidates of a composition cannot be ordered (their accuracy intervals overlap or touch), so
    the engine cannot tell which events to compose — and will not guess.

    ``uncertainty`` (an :class:`~activedb.composite.Uncertainty`) names the query, the component and the
    candidate events.  The engine's state is kept (the events stay in their lists, nothing of the
    uncertain composition is consumed; every input of the call was taken, composites made before it
    are returned by ``engine.take_outputs()``): pass ``on_uncertain=`` to let the application choose, or drop
    events with ``engine.discard(event)``; the next call evaluates again."""

    def __init__(self, uncertainty: Uncertainty, *, refused: bool = False):
        self.uncertainty = uncertainty
        self.others: tuple["UncertainOrder", ...] = ()      # further uncertainties met in the same call
        if refused:     # (an ingestion's batch: the candidates left the engine's lists as dead letters)
            super().__init__(f"{uncertainty.describe()}; the engine does not pick silently, and without an on_uncertain "
                             f"callback an ingestion cannot wait for the application's decision (every delivery of the "
                             f"batch would meet it again), so the candidates left the engine's lists as dead letters — "
                             f"give the CompositionEngine an on_uncertain callback that chooses, then replay them "
                             f"(activedb dead-letters replay) into an engine that has not composed past them")
            return
        super().__init__(f"{uncertainty.describe()}; the engine does not pick silently — give the CompositionEngine an "
                         f"on_uncertain callback that chooses (the choice is recorded with the composite event), or "
                         f"drop candidates with engine.discard(event)")


class ProducerTimeout(CompositeError):
    """An input node waited longer than its timeout for a silent producer (no event, no heartbeat) whose
    sync-point blocks a composition (the paper's InputNode timeout)."""

    def __init__(self, message: str, producers: tuple[str, ...], silent_for: dict[str, float]):
        super().__init__(message)
        self.producers = producers
        self.silent_for = silent_for


class MembershipError(CompositeError):
    """A producer is unknown, joined twice, left, or joined too late to be composed correctly."""


class LateEvent(CompositeError):
    """An event (or heartbeat) came after compositions were decided that relied on its absence: accepting
    it could invalidate them, so it is refused."""


class EventRejected(CompositeError):
    """An input could not be accepted (no producer, unknown type, bad timestamp)."""
