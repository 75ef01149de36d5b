"""One transaction as an *actor*: its body runs on the transaction's own thread and executes the steps the
test sends, so a test orders steps across transactions by what it sends, never by sleeping.

``inbox`` takes steps (functions of the transaction), :data:`COMMIT` (the body returns, so the
transaction commits) or :data:`ABORT` (the body raises :class:`AbortRequested`); ``outbox`` gives one
``("ok", value)`` or ``("error", exception)`` per step (and first ``("started", tx.id)`` when ``announce``).
Thread-safe through its queues.  ``tests/activedb/test_tree_model.py`` and
``tests/scenarios/test_isolation_anomalies.py`` build on it.
"""

from __future__ import annotations

import queue
from typing import Any

COMMIT = object()
ABORT = object()


class AbortRequested(Exception):
    """Raised in a transaction's body when the test tells it to abort."""


class Actor:
    def __init__(self, name: str, *, idle_timeout: float, announce: bool = False,
                 survivable: tuple[type[BaseException], ...] = ()):
        self.name = name
        self.idle_timeout = idle_timeout     # an actor nobody talks to for this long aborts (leak guard)
        self.announce = announce
        self.survivable = survivable         # errors of a step that leave the transaction usable
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.tx = None

    def serve(self, tx) -> None:
        """The transaction's body: returns on COMMIT, raises on ABORT or on a step's error that is not
        ``survivable``."""
        self.tx = tx
        if self.announce:
            self.outbox.put(("started", tx.id))
        while True:
            message = self.inbox.get(timeout=self.idle_timeout)
            if message is COMMIT:
                return None
            if message is ABORT:
                raise AbortRequested(f"the test aborts {self.name}")
            try:
                value = message(tx)
            except self.survivable as error:
                self.outbox.put(("error", error))
                continue
            except BaseException as error:
                self.outbox.put(("error", error))
                raise
            self.outbox.put(("ok", value))

    def take(self, timeout: float) -> Any:
        """The next step's value; its error is raised here."""
        kind, value = self.outbox.get(timeout=timeout)
        if kind == "error":
            raise value
        return value
