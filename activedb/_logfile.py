"""Where the log lines of activedb's threads go: ``$ACTIVEDB_HOME/logs/activedb.log``.

activedb runs threads of its own (the outbox, capture consumers, rule workers) and a connection pool; what
they log while the server restarts or terminates backends — a lost connection retried, a pool's failed
reset — is for an operator, not for the console of a program that handles the failure itself.  With no
logging configured, Python prints such records (tracebacks included) on stderr.  :func:`route_to_home_log`
adds one file handler to the loggers of activedb, of its engine's pool and of psycopg: records go to the
file and still propagate, so an application that configures logging sees them as before; one that does
not gets a quiet console.  The file and its directory are created at the first record (never for a
process that logs nothing).  Thread-safe.
"""

from __future__ import annotations

import io
import logging
import threading
from pathlib import Path

__all__ = ["LOG_NAME", "HomeLogHandler", "home_log", "route_to_home_log"]

LOG_NAME = "activedb.log"
#: The loggers routed besides the pool's: activedb's own and psycopg's ("error ignored terminating
#: <psycopg.Pipeline [BAD]> …" when a backend is terminated under a pipeline).
LOGGERS = ("activedb", "psycopg")
FORMAT = "%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s"

_mutex = threading.Lock()        # protects _handler and the handler lists of the loggers routed
_handler: "HomeLogHandler | None" = None


class HomeLogHandler(logging.FileHandler):
    """Appends to ``path``, creating it (and its directory, private) at the first record.  If the file cannot
    be written, records go to stderr as Python's last-resort handler would print them."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, mode="a", encoding="utf-8", delay=True)
        self.setFormatter(logging.Formatter(FORMAT))

    def _open(self) -> io.TextIOWrapper:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return super()._open()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.stream is None:
                self.stream = self._open()
        except OSError:
            logging.lastResort.handle(record)  # type: ignore[union-attr]  # (set by logging itself)
            return
        super().emit(record)


def route_to_home_log(home: Path, *extra_loggers: str) -> Path:
    """Route activedb's, psycopg's and ``extra_loggers``' records (the engine's pool) also to
    ``home/logs/activedb.log``; returns the file.  The first home of a process is the one used."""
    global _handler
    with _mutex:
        if _handler is None:
            _handler = HomeLogHandler(Path(home) / "logs" / LOG_NAME)
        for name in (*LOGGERS, *extra_loggers):
            logger = logging.getLogger(name)
            if _handler not in logger.handlers:
                logger.addHandler(_handler)
        return Path(_handler.baseFilename)


def home_log() -> Path | None:
    """The file :func:`route_to_home_log` routes to (None before its first call)."""
    with _mutex:
        return None if _handler is None else Path(_handler.baseFilename)
