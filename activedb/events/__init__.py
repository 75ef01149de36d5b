"""Events, their kinds and event specifications.  Design note: ``README.md``."""

from activedb.events._model import (
    DATA_KINDS,
    KINDS,
    TRANSACTION_KINDS,
    Event,
    EventKind,
    EventSpec,
)
from activedb.events._progress import Punctuations

__all__ = ["DATA_KINDS", "KINDS", "TRANSACTION_KINDS", "Event", "EventKind", "EventSpec", "Punctuations"]
