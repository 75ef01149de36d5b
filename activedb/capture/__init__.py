"""Change capture: rules react to committed changes made by any PostgreSQL client (``db.capture(table)``,
rules on ``db.captured(table, kind)``, ``db.capture.start()``).  Design note, with an example:
``README.md`` in this package.

* :class:`CaptureManager` (``db.capture``), :class:`CaptureConsumer`, :class:`ConsumerState`,
  :class:`Step`, :class:`Position`, :class:`ConsumerStatistics`;
* :func:`capture_status` and :class:`CaptureStatus`, :class:`ConsumerBacklog`, :class:`StandbyConsumer`,
  :class:`TableBacklog`, :class:`CapturedTable` — what ``activedb capture status`` shows (another command can show
  it too);
* :func:`is_capture_source` — whether a dead letter's source is a capture consumer's (not replayable);
* :mod:`activedb.capture.migration_ops` — ``enable_capture(op, table)`` / ``disable_capture(op, table)``;
* :mod:`activedb.capture.errors`.
"""

from typing import TYPE_CHECKING

from activedb import lazy
from activedb.capture.errors import (CaptureConflict, CaptureError, CaptureNotEnabledWarning, CaptureNotInstalled,
                                     CapturePendingChanges, ConsumerStopped)

# imported on first use: `import activedb.capture` stays fast (the CLI's start)
_EXPORTS = {
    "activedb.capture._consumer": ["CaptureConsumer", "ConsumerState", "ConsumerStatistics"],
    "activedb.capture._position": ["CapturedChange", "Position", "Step"],
    "activedb.rules": ["FiringOutcome"],        # a batch's firings run through the rule manager
    "activedb.capture._manager": ["CaptureManager"],
    "activedb.capture._status": ["CapturedTable", "CaptureStatus", "ConsumerBacklog", "StandbyConsumer", "TableBacklog",
                                 "capture_status"],
    "activedb.capture._firing": ["is_capture_source"],
}
__all__ = ["CaptureConflict", "CaptureError", "CaptureNotEnabledWarning", "CaptureNotInstalled", "CapturePendingChanges",
           "ConsumerStopped",
           *(name for names in _EXPORTS.values() for name in names)]
__getattr__, __dir__ = lazy.exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from activedb.capture._consumer import (
        CaptureConsumer as CaptureConsumer, ConsumerState as ConsumerState, ConsumerStatistics as ConsumerStatistics)
    from activedb.capture._position import CapturedChange as CapturedChange, Position as Position, Step as Step
    from activedb.rules import FiringOutcome as FiringOutcome
    from activedb.capture._manager import CaptureManager as CaptureManager
    from activedb.capture._status import (
        CaptureStatus as CaptureStatus, CapturedTable as CapturedTable, ConsumerBacklog as ConsumerBacklog,
        StandbyConsumer as StandbyConsumer, TableBacklog as TableBacklog, capture_status as capture_status)
    from activedb.capture._firing import is_capture_source as is_capture_source
