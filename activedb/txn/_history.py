"""The opt-in history recorder (on in tests): every ``begin``, ``spawn``, ``read``, ``write``, ``commit``,
``abort`` and top-level ``flush`` as a :class:`HistoryOp` with a global sequence number, for
``activedb.testing.check_history``.  A read of committed data records the top-level transaction that
wrote the version it saw (``read_from``): the recorder sees every flush of its process, and a read takes
its lock before it reads, so no conflicting flush of this process can race it.

Listeners (:meth:`HistoryRecorder.listen`) hear every op as it is recorded, in the thread that did it: the
interleaving runner of ``activedb.testing`` pauses threads there.

Thread-safety: ``_mutex`` protects ``ops``, ``_sequence`` and ``_last_writer``; ``_listeners`` is an immutable
tuple replaced whole (read without a mutex).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from activedb.store import own_image

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Key


@dataclass(frozen=True)
class HistoryOp:
    sequence: int
    kind: str                     # begin | spawn | read | write | commit | abort | flush
    transaction: str
    parent: str | None = None
    root: str | None = None
    table: str | None = None
    key: Key | None = None
    value: Any = None             # read: image seen; write: Entry; flush: {(table, key): image}
    read_from: str | None = None  # read of committed data: root that wrote it ("initial" if none seen)
    source: str | None = None     # read: "own", "ancestor:<tid>" or "committed"
    detail: Any = None


@dataclass
class HistoryRecorder:
    ops: list[HistoryOp] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._mutex = threading.Lock()
        self._sequence = itertools.count(1)
        self._last_writer: dict[tuple[str, Key], str] = {}
        self._listeners: tuple[Callable[[HistoryOp], None], ...] = ()

    def listen(self, listener: Callable[[HistoryOp], None]) -> Callable[[], None]:
        """Call ``listener(op)`` for every op recorded from now on, after it is recorded, in the thread that did
        the operation, with no activedb mutex held but the guard of a group run as frames (txn README, "Groups on
        threads": none runs while an ``Observer`` of node events is registered) — so it may block that thread.
        Returns the function that stops it."""
        with self._mutex:
            self._listeners = (*self._listeners, listener)

        def stop() -> None:
            with self._mutex:
                self._listeners = tuple(other for other in self._listeners if other is not listener)
        return stop

    def _tell(self, op: HistoryOp) -> None:
        for listener in self._listeners:
            listener(op)

    def record(self, kind: str, transaction: str, **fields: Any) -> None:
        value = fields.get("value")
        if kind == "read" and type(value) is dict:
            # The image the reader got is the reader's (``tx.read``'s contract): the history keeps a copy of its own,
            # lists and dicts (a JSON column's) included.
            fields["value"] = own_image(value)
        with self._mutex:
            op = HistoryOp(next(self._sequence), kind, transaction, **fields)
            self.ops.append(op)
        if self._listeners:
            self._tell(op)

    def record_committed_read(self, transaction: str, root: str, table: str, key: Key, image: object) -> None:
        with self._mutex:
            writer = self._last_writer.get((table, key), "initial")
            op = HistoryOp(next(self._sequence), "read", transaction, root=root, table=table, key=key,
                           value=image, read_from=writer, source="committed")
            self.ops.append(op)
        if self._listeners:
            self._tell(op)

    def record_flush(self, root: str, images: dict[tuple[str, Key], Any]) -> None:
        """Precondition: called after the PostgreSQL commit, while the tree still holds its locks — in the lock
        manager, which then gives a reader the rows it wrote (a flush in the held transaction hands no row over to
        PostgreSQL while a history is recorded: txn README, "Reads for update")."""
        with self._mutex:
            op = HistoryOp(next(self._sequence), "flush", root, root=root, value=dict(images))
            self.ops.append(op)
            for row in images:
                self._last_writer[row] = root
        if self._listeners:
            self._tell(op)

    def snapshot(self) -> list[HistoryOp]:
        with self._mutex:
            return list(self.ops)

    def clear(self) -> None:
        """Start a new history: what was written before is its initial state (a read of it records
        ``read_from="initial"``, never a transaction of the old history)."""
        with self._mutex:
            self.ops.clear()
            self._last_writer.clear()
