"""A capture consumer's listener connection: it ``LISTEN``\\ s for commit notifications and holds the
session advisory lock that makes one consumer of a name the leader (the lock goes with the session, e.g.
when the process is killed), or, while another leads, the shared lock that shows it standing by.  Both are keyed by
the id of the name's row in ``activedb_capture_consumers``.  Design note: ``README.md`` in this package."""

from __future__ import annotations

import contextlib
import logging
import math
import re
from typing import TYPE_CHECKING

import sqlalchemy as sa

from activedb.capture import _sql
from activedb.capture._position import register
from activedb.errors import DatabaseUnavailable, database_failure
from activedb.store import close_detached

if TYPE_CHECKING:  # pragma: no cover
    import psycopg

    from activedb._handle import DatabaseHandle as Database

logger = logging.getLogger("activedb.capture")

#: The longest ``lock_timeout`` PostgreSQL takes, in milliseconds (an integer setting: about 24.8 days).
_LOCK_TIMEOUT_LIMIT = 2**31 - 1


class Listener:
    """The leadership of consumer ``name`` and its notifications.  Not thread-safe: the consumer calls
    it under its ``_run_mutex``, except :meth:`wait_for_notification` (its loop thread, while no batch
    runs) and :func:`wake` (any thread, its own connection)."""

    def __init__(self, database: "Database", name: str):
        self.database = database
        self.name = name
        self._connection: "psycopg.Connection | None" = None
        #: The backend pid of the session (None while not connected); read by any thread.
        self.backend_pid: int | None = None
        # The id of the name's row, the second key of both locks: read as the session first takes them (None: not
        # yet in this session).  Invariant: the session holds a lock only on the id of the name's row, checked once
        # the lock was taken (a row dropped before that is no longer the name's: its locks are let go).
        self._key: int | None = None
        # Invariant: _leading is True only while this session holds the name's lock (take() got it), _standing_by
        # only while it holds the name's standby lock (shared); never both.  Both False while not connected.
        self._leading = False
        self._standing_by = False

    @property
    def lock(self) -> tuple[int, int] | None:
        """The session advisory lock ``(classid, objid)`` the leader of this name holds (``pg_locks``): ``objid`` is
        the id of the name's row; None until this session first stood by or led."""
        return None if self._key is None else (_sql.CONSUMER_LOCK_CLASS, self._key)

    @property
    def standby_lock(self) -> tuple[int, int] | None:
        """The session advisory lock ``(classid, objid)`` a consumer of this name standing by holds, shared (None
        until this session first stood by or led)."""
        return None if self._key is None else (_sql.STANDBY_LOCK_CLASS, self._key)

    @property
    def connected(self) -> bool:
        return self._connection is not None and not self._connection.closed

    def connect(self) -> None:
        """Open the listener connection (any broken one is dropped first): a session made by the database's engine
        — its URL, ``connect_args`` (TLS settings, say) and ``connect_timeout``, as every other connection — and
        detached from its pool: it holds ``LISTEN`` and the lead's lock for as long as this consumer leads."""
        import psycopg

        self._connection, self._key = None, None
        try:
            pooled = self.database.engine.raw_connection()
        except (psycopg.OperationalError, sa.exc.OperationalError) as error:    # (the pool's is the driver's own)
            failure = database_failure(error, "connecting", self.database.describe())
            raise DatabaseUnavailable(f"capture consumer {self.name!r}: {failure}") from None   # (what it retries)
        connection = pooled.driver_connection       # (psycopg's: the engine's driver; read before the detach)
        pooled.detach()                     # (closed by close(), never returned to the pool)
        assert connection is not None
        try:
            connection.rollback()           # (what the dialect's first queries left open)
            connection.autocommit = True
            connection.execute(f"LISTEN {_sql.CHANNEL}")
        except psycopg.OperationalError as error:
            with contextlib.suppress(Exception):
                connection.close()
            raise DatabaseUnavailable(f"capture consumer {self.name!r} lost its new listener connection to "
                                      f"PostgreSQL ({self.database.describe()}): {str(error).strip()}") from None
        self._connection = connection
        self.backend_pid = connection.info.backend_pid

    def close(self) -> None:
        """End the session: the leadership lock (or the standby lock) is released before this returns, and a leader
        notifies the channel, so that a consumer of any name standing by tries to take over at once (not after its
        ``idle_wait``)."""
        connection, self._connection, self._key = self._connection, None, None
        leading, self._leading, self._standing_by, self.backend_pid = self._leading, False, False, None
        if connection is None:
            return
        if leading:
            with contextlib.suppress(Exception):        # (a broken session: the server releases it as it goes)
                connection.execute("SELECT pg_advisory_unlock_all()")
                connection.execute("SELECT pg_notify(%s, 'released')", (_sql.CHANNEL,))
        close_detached(connection)      # (the locks released now, not when the server sees the session go)

    def still_held(self) -> bool:
        """Drop notifications already received (the next batch reads what they announced) and find out
        whether the session, and with it the lock, is still there (if not, the connection is closed)."""
        import psycopg

        try:
            if self._connection is not None:
                for _ in self._connection.notifies(timeout=0):
                    pass
            return True
        except psycopg.OperationalError as error:
            logger.warning("capture consumer %r lost its listener connection and with it the lead (%s)",
                           self.name, str(error).strip())
            self.close()
            return False

    def take(self, wait: float = 0.0) -> bool:
        """Take the name's lock if it is free (or once it is, within ``wait`` seconds: a lock wait in
        PostgreSQL bounded by ``lock_timeout``; beyond its limit, or infinite, without a bound), standing by until
        then.  The name's row is made sure of as the session first takes its locks (``register``: listed, and its
        changes kept from pruning, while it stands by), and again if it was dropped before they were taken.
        Precondition: :attr:`connected`."""
        import psycopg

        connection = self._connection
        assert connection is not None       # (the precondition)
        if self._leading:
            return True
        try:
            while True:
                if self._key is None:
                    self._key = register(self.database, self.name)
                standby_lock, lock = (_sql.STANDBY_LOCK_CLASS, self._key), (_sql.CONSUMER_LOCK_CLASS, self._key)
                if not self._standing_by:       # (shown standing by while it waits, also in the lock wait below)
                    connection.execute("SELECT pg_advisory_lock_shared(%s, %s)", standby_lock)
                    self._standing_by = True
                taken = self._take_lock(connection, lock, wait)
                row = connection.execute(_sql.STILL_REGISTERED, (self._key, self.name)).fetchone()
                if row is not None and row[0]:
                    break
                # Dropped (db.capture.drop_consumer, which took both locks for its transaction) before this session
                # had them: the id is no longer the name's.  Let go of its locks and make sure of the name again.
                if taken:
                    connection.execute("SELECT pg_advisory_unlock(%s, %s)", lock)
                connection.execute("SELECT pg_advisory_unlock_shared(%s, %s)", standby_lock)
                self._standing_by, self._key = False, None
            if taken:
                self._leading = True
                connection.execute("SELECT pg_advisory_unlock_shared(%s, %s)", standby_lock)
                self._standing_by = False
            return taken
        except psycopg.OperationalError as error:
            self.close()
            raise DatabaseUnavailable(f"capture consumer {self.name!r} lost its connection: {error}") from None

    @staticmethod
    def _take_lock(connection: "psycopg.Connection", lock: tuple[int, int], wait: float) -> bool:
        """Take the session advisory lock ``lock`` if it is free, or once it is within ``wait`` seconds (see
        :meth:`take`)."""
        import psycopg

        if wait <= 0:
            row = connection.execute("SELECT pg_try_advisory_lock(%s, %s)", lock).fetchone()
            return bool(row is not None and row[0])
        # Whole milliseconds, at least one: 0 is "no timeout" to PostgreSQL — what a wait beyond its limit (or for
        # ever) becomes.
        milliseconds = math.ceil(wait * 1000) if wait * 1000 <= _LOCK_TIMEOUT_LIMIT else 0
        connection.execute(f"SET lock_timeout = {milliseconds}")
        try:
            connection.execute("SELECT pg_advisory_lock(%s, %s)", lock)
            return True
        except psycopg.errors.LockNotAvailable:
            return False
        finally:
            connection.execute("RESET lock_timeout")

    def wait_for_notification(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a commit notification; False if the connection was lost
        (the caller closes it, under its ``_run_mutex``).  Precondition: :attr:`connected`."""
        import psycopg

        connection = self._connection
        assert connection is not None       # (the precondition)
        try:
            for _ in connection.notifies(timeout=timeout, stop_after=1):
                pass
            return True
        except psycopg.OperationalError as error:
            logger.warning("capture consumer %r: listener connection lost (%s); reconnecting", self.name, error)
            return False


def wake(database: "Database", name: str, why: str) -> None:
    """Interrupt the wait for notifications of the consumers of ``database`` (``stop``, ``poke``)."""
    try:
        with database.engine.begin() as connection:
            connection.execute(sa.text("SELECT pg_notify(:channel, :payload)"),
                               {"channel": _sql.CHANNEL, "payload": why})
    except sa.exc.DBAPIError as error:
        logger.warning("capture consumer %r: could not notify (%s)", name, error)


# How activedb's sessions name themselves unless the application names them (``EngineOptions``: libpq's
# ``fallback_application_name``, ``activedb <process id>``).
_SESSION_NAME = re.compile(r"activedb (\d+)")


def process_of(session_name: str | None) -> int | None:
    """The process id in an ``application_name`` activedb gave its session, or None (a name the application chose)."""
    match = _SESSION_NAME.fullmatch(session_name or "")
    return int(match.group(1)) if match else None
