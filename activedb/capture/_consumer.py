"""The capture consumer: captured changes become events for the rules on ``db.captured(...)``, exactly
once and in PostgreSQL's commit order.  One batch is one top-level activedb transaction
``capture:<consumer>``; its steps, crashes and several consumers: the package's ``README.md`` ("Exactly
once, in commit order").

Thread-safety: a consumer runs batches one at a time (``_run_mutex``); ``start()`` runs them on its own
thread, and ``run_once()`` is then refused.  ``_mutex`` protects the counters, the state and the fetch
numbers (``_progress`` is its condition).  Neither is held while calling the hook ``on_step``; SQL and
rules run under ``_run_mutex`` only.  Order: ``_run_mutex`` before ``_mutex``.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypedDict

import sqlalchemy as sa

from activedb.capture import _leader, _sql
from activedb.capture._fetch import ChangeReader, Entry
from activedb.capture._firing import TRANSIENT, CaptureHandler, CapturedEvent, RetryBatch, source_of
from activedb.capture._position import KINDS, CapturedChange, Position, PositionWriter, Step, prune, read_position
from activedb.capture._status import leader_pids
from activedb.capture.errors import CaptureConflict, CaptureError, CaptureNotInstalled, ConsumerStopped
from activedb.errors import (DatabaseUnavailable, TransactionAborted, WaitTimeout, check_seconds,
                             check_whole_number)
from activedb.events import age_seconds
from activedb.ingest import Deadlines, Ingestion, LedgerId, ReservedSource, unfit_source_name
from activedb.ingest.errors import describe
from activedb.rules import FiringOutcome
from activedb.store import is_connection_failure

if TYPE_CHECKING:  # pragma: no cover
    from activedb.ingest import IngestDatabase as Database

__all__ = ["CaptureConsumer", "CapturedChange", "ConsumerOptions", "ConsumerState", "ConsumerStatistics", "Position", "Step"]

logger = logging.getLogger("activedb.capture")


def check_consumer_name(name: object) -> None:
    """Raise CaptureError unless ``name`` can name a consumer: a non-empty string without '@' whose source,
    ``capture:<name>``, the ingestion ledger can hold (``activedb.ingest.unfit_source_name``)."""
    if not isinstance(name, str) or not name or "@" in name:
        # ('@' would make the ledger's capture:<name> read as SOURCE@RUN: activedb.ingest.LedgerId)
        raise CaptureError(f"a consumer name is a non-empty string without '@' (its batches are filed in the "
                           f"ingestion ledger as capture:<name>), got {name!r}")
    unfit = unfit_source_name(source_of(name))
    if unfit is not None:
        raise CaptureError(f"consumer name {name[:40]!r}{'…' if len(name) > 40 else ''}: its source in the ingestion "
                           f"ledger, capture:<name>, {unfit}")


class ConsumerState(enum.Enum):
    """``NEW`` → (``STANDBY`` ⇄ ``LEADING``) → ``STOPPED``.  ``STANDBY``: another consumer of the same
    name leads (or the listener connection is down); ``LEADING``: this one holds the name's lock."""

    NEW = "new"
    STANDBY = "standby"
    LEADING = "leading"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ConsumerStatistics:
    """A consumer's counters since it was created.  ``lag_seconds``: age of the oldest change of its last
    batch when it was read (None before the first batch)."""

    name: str
    state: ConsumerState
    position: Position
    batches: int
    changes: int
    firings: int
    failed: int
    retried_batches: int
    conflicts: int
    pruned_commits: int
    lag_seconds: float | None
    fetch_seconds: float          # reading changes and their typed rows
    rules_seconds: float          # running the rules (the batch's transaction body)
    commit_seconds: float         # the batch's flush: effects, position, COMMIT


class ConsumerOptions(TypedDict, total=False):
    """:class:`CaptureConsumer`'s keywords (``db.capture.consumer(name, **options)``); each is described there."""

    batch_size: int
    retention: float | dt.timedelta
    prune_interval: float
    idle_wait: float
    behind_seconds: float
    max_retries: int
    deadlines: Deadlines | None
    on_step: Callable[[Step, int], None] | None


class CaptureConsumer:
    """Consumes the captured changes of one database under a name (``db.capture.consumer(name)``).

    * ``batch_size``: changes per batch (one activedb transaction each);
    * ``retention``: how long consumed changes are kept before pruning (seconds or a ``timedelta``;
      default 0: pruned once every consumer has handled them); ``prune_interval``: seconds between
      pruning rounds;
    * ``idle_wait``: seconds a caught-up consumer waits for a notification before looking again (a
      standby also tries to take over then);
    * ``behind_seconds``: a batch whose oldest change is older than this logs a warning that the
      consumer is behind (at most once a minute);
    * ``max_retries``: a batch that meets serialization conflicts or deadlocks runs again this often
      before ``run_once`` gives up for now (the position stays; the next call tries again);
    * ``deadlines``: how long a batch, and a rule firing in it, may run (``activedb.ingest.Deadlines``, as
      ``activedb run`` takes them; None: no limit).  Past a rule's deadline the change it runs on becomes a dead
      letter at once; the batch is rolled back and raises ``BatchDeadlineExceeded``, and this consumer takes no
      more batches (the rule's thread cannot be stopped): end the process and start it again — a consumer of the
      name then runs the batch again without that change (``activedb capture consume`` restarts itself);
    * ``on_step(step, detail)``: called at each :class:`Step` (exceptions propagate: it is a monitoring
      and test hook).

    Thread-safety: see the module docstring.
    """

    def __init__(self, database: "Database", name: str = "default", *, batch_size: int = 500,
                 retention: float | dt.timedelta = 0.0, prune_interval: float = 5.0, idle_wait: float = 5.0,
                 behind_seconds: float = 60.0, max_retries: int = 5, deadlines: Deadlines | None = None,
                 on_step: Callable[[Step, int], None] | None = None):
        check_consumer_name(name)
        for option, value, least in (("batch_size", batch_size, 1), ("max_retries", max_retries, 0)):
            check_whole_number("db.capture.consumer", option, value, least, error=CaptureError)
        for option, duration in (("prune_interval", prune_interval), ("behind_seconds", behind_seconds)):
            check_seconds("db.capture.consumer", option, duration, none=None, error=CaptureError)
        if deadlines is not None and not isinstance(deadlines, Deadlines):
            raise CaptureError(f"db.capture.consumer(deadlines={deadlines!r}) takes an activedb.ingest.Deadlines("
                               f"batch=…, rule=…) in seconds, or None for no limit")
        if (isinstance(idle_wait, bool) or not isinstance(idle_wait, (int, float))
                or not 0 < idle_wait <= threading.TIMEOUT_MAX):   # (it is a thread's pause)
            raise CaptureError(f"db.capture.consumer(idle_wait={idle_wait!r}) takes a number of seconds above 0 and "
                               f"finite (a consumer looks again after it)")
        self._database = database
        self.name = name
        self.batch_size = batch_size
        self.retention_seconds = age_seconds(retention, "a consumer's retention", CaptureError)
        self.prune_interval = prune_interval
        self.idle_wait = idle_wait
        self.behind_seconds = behind_seconds
        self.max_retries = max_retries
        self.on_step = on_step
        # One batch at a time; protects _listener, _reader, _known_position, _handler, _last_prune.
        self._run_mutex = threading.Lock()
        self._mutex = threading.Lock()          # protects the fields below
        self._progress = threading.Condition(self._mutex)
        self._state = ConsumerState.NEW
        self._position = Position()
        self._counters = dict(batches=0, changes=0, firings=0, failed=0, retried_batches=0, conflicts=0,
                              pruned_commits=0, fetch_seconds=0.0, rules_seconds=0.0, commit_seconds=0.0)
        self._lag: float | None = None
        self._fetches_begun = 0                 # fetch numbers, to wait for a fetch that began later
        self._last_empty_fetch = 0              # number of the last fetch that found nothing
        self._last_behind_warning = 0.0
        self._listener = _leader.Listener(database, name)
        self._reader = ChangeReader(database)
        #: The consumer's batches go through the ingestion core, as source ``capture:<name>`` (no run: the same
        #: start position always yields the same batch): the one batch protocol, ledger, dead letters and
        #: statistics of every connector (``ingestion.statistics()``, what metrics watch).
        self._handler = CaptureHandler(name, self._step)
        self.ingestion = Ingestion(database, source=source_of(name), handler=self._handler, deadlines=deadlines,
                                   owner=ReservedSource.CAPTURE)
        self.ledger_id = str(LedgerId(source_of(name)))
        # The position as this consumer last committed it while leading (None: read it from PostgreSQL).
        self._known_position: Position | None = None
        self._last_prune = 0.0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._loop_error: BaseException | None = None

    # --- state ---------------------------------------------------------------------------------

    @property
    def state(self) -> ConsumerState:
        return self._state

    @property
    def position(self) -> Position:
        """The position this consumer last committed (or read)."""
        return self._position

    @property
    def failure(self) -> BaseException | None:
        """The error that ended this consumer's thread — a database error other than a lost connection, a bug, or
        an ``on_step`` hook that raised — or None (not started, running, or stopped on request; a ``start()``
        again clears it).  A process that runs the consumer in the background checks it to stop with the error
        instead of looking alive while nothing is consumed (``activedb capture consume`` does)."""
        with self._mutex:
            return self._loop_error

    @property
    def leadership_lock(self) -> tuple[int, int] | None:
        """The session advisory lock ``(classid, objid)`` the leader of this name holds (``pg_locks``): ``objid`` is the
        id of the name's row, which no other name has; None until this consumer's session first stood by or led."""
        return self._listener.lock

    @property
    def session_pid(self) -> int | None:
        """The PostgreSQL backend pid of this consumer's listener session — the one that holds its name's lead while
        it leads, and is listed standing by (``db.capture.status()``) while another leads — or None while it has none
        (not started, reconnecting, stopped)."""
        return self._listener.backend_pid

    def leader_pid(self) -> int | None:
        """The PostgreSQL backend pid of the session that leads this consumer's name now — this consumer's listener
        session while it leads, another process's while it stands by — or None when no session holds the lead."""
        with self._database.engine.connect() as connection:
            return leader_pids(connection).get(self.name)

    def statistics(self) -> ConsumerStatistics:
        with self._mutex:
            return ConsumerStatistics(name=self.name, state=self._state, position=self._position,
                                      lag_seconds=self._lag, **self._counters)  # type: ignore[arg-type]

    def _count(self, **increments: float) -> None:
        with self._mutex:
            for what, amount in increments.items():
                self._counters[what] += amount

    def _step(self, step: Step, detail: int = 0) -> None:
        hook = self.on_step
        if hook is not None:
            hook(step, detail)

    # --- running ---------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Run one batch if this consumer leads its name; returns the number of changes handled (0: none
        pending, another consumer leads, or the batch must be tried again later)."""
        if self._thread is not None:
            raise CaptureError(f"capture consumer {self.name!r} runs on its own thread (start()); "
                               f"use wait_caught_up() instead of run_once()")
        return self._run_once()[0]

    def run_until_caught_up(self, max_batches: int | None = None, *, lead_timeout: float = 0.0) -> int:
        """Run batches until one finds nothing pending (or ``max_batches`` ran); returns the changes
        handled.  Waits up to ``lead_timeout`` seconds for another consumer of this name to let go of the
        lead (in PostgreSQL: a lock wait), then raises :class:`CaptureError` if it still leads.  A batch another
        process committed meanwhile is followed from the position read again (a second in a row raises its
        :class:`CaptureConflict`); a batch that failed more than ``max_retries`` times raises :class:`CaptureError`
        (its changes remain pending; the batches before it are committed)."""
        if self._thread is not None:
            raise CaptureError(f"capture consumer {self.name!r} runs on its own thread (start()); "
                               f"use wait_caught_up() instead")
        if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(max_batches, int)
                                        or max_batches < 0):
            raise CaptureError(f"max_batches must be a whole number, 0 or more (None: until caught up), "
                               f"got {max_batches!r}")
        if isinstance(lead_timeout, bool) or not isinstance(lead_timeout, (int, float)):
            raise CaptureError(f"lead_timeout must be a number of seconds (inf: for ever), got {lead_timeout!r}")
        total = batches = 0
        if lead_timeout > 0:
            with self._run_mutex:
                self._check_open()
                self._lead(wait=lead_timeout)
        conflicted = False
        while max_batches is None or batches < max_batches:
            handled, unfinished = self._run_once()
            batches += 1
            if isinstance(unfinished, CaptureConflict) and not conflicted:
                conflicted = True               # the position was read again: go on from there
                continue
            if unfinished is not None:
                raise unfinished
            conflicted = False
            if handled == 0:
                if self._state is not ConsumerState.LEADING:
                    raise CaptureError(f"capture consumer {self.name!r} is on standby: another process consumes "
                                       f"under this name; stop it or use another name")
                break
            total += handled
        return total

    def start(self) -> "CaptureConsumer":
        """Run batches on a thread of its own until :meth:`stop`; waits for notifications when caught up."""
        self._check_open()
        if self._thread is not None:
            raise CaptureError(f"capture consumer {self.name!r} is already running: stop() it before starting it again")
        self._stopping.clear()
        with self._mutex:
            self._loop_error = None             # (a thread of an earlier start's: this run has not failed)
        self._thread = threading.Thread(target=self._loop, name=f"activedb-capture-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the thread after the batch in progress (it commits or not, as it would anyway)."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        _leader.wake(self._database, self.name, "stop")
        thread.join(None if timeout is not None and timeout >= threading.TIMEOUT_MAX else timeout)   # (inf: None)
        if thread.is_alive():
            raise CaptureError(f"capture consumer {self.name!r} did not stop within {timeout} s "
                               f"(a rule of the batch in progress may be blocked)")
        self._thread = None

    def close(self) -> None:
        """Stop, release the leadership (the listener connection), close the ingestion (its deadlines' thread) and
        refuse further batches."""
        self.stop()
        with self._run_mutex:
            self._listener.close()
            with self._mutex:
                closed, self._state = self._state is ConsumerState.STOPPED, ConsumerState.STOPPED
                self._progress.notify_all()
        if not closed:
            self.ingestion.close()

    def wait_caught_up(self, timeout: float = 30.0) -> Position:
        """Wait until a fetch that began after this call found nothing pending (every change committed
        before the call is handled); returns the position.  For a consumer running on its thread.  Not caught up
        within ``timeout`` seconds: :class:`~activedb.WaitTimeout`, saying where to look."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout:
            raise CaptureError(f"timeout must be a number of seconds (inf: for ever), got {timeout!r}")
        if self._thread is None and self._state is not ConsumerState.STOPPED:
            raise CaptureError(f"capture consumer {self.name!r} is not running on its thread, so nothing will catch "
                               f"up: start() it first, or call run_until_caught_up() from your own loop")
        deadline = time.monotonic() + timeout
        with self._mutex:
            begun = self._fetches_begun
        _leader.wake(self._database, self.name, "poke")
        with self._progress:
            while self._last_empty_fetch <= begun:
                if self._loop_error is not None:
                    raise CaptureError(f"capture consumer {self.name!r} stopped: {self._loop_error!r}") \
                        from self._loop_error
                if self._state is ConsumerState.STOPPED:
                    raise ConsumerStopped(f"capture consumer {self.name!r} is stopped")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(f"capture consumer {self.name!r} not caught up within {timeout} s "
                                      f"(state {self._state.value}, position {self._position}): give it longer, or "
                                      f"see what holds it back with `activedb capture status` (its backlog, its "
                                      f"leader) and in activedb's log (a rule of its batch blocked or failing)")
                self._progress.wait(min(remaining, threading.TIMEOUT_MAX))     # (no thread wait may be longer)
            return self._position

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    handled, _ = self._run_once()
                except (DatabaseUnavailable, CaptureNotInstalled) as error:
                    logger.error("capture consumer %r: %s", self.name, error)
                    self._stopping.wait(self.idle_wait)      # the server or the schema is not there yet
                    continue
                except sa.exc.DBAPIError as error:
                    if not is_connection_failure(error):
                        raise
                    # A pooled connection PostgreSQL ended (a restart, pg_terminate_backend): the pool drops it.
                    logger.error("capture consumer %r lost its connection to PostgreSQL (%s); trying again",
                                 self.name, str(error.orig or error).strip())
                    self._stopping.wait(self.idle_wait)
                    continue
                if handled == 0 and not self._stopping.is_set():
                    self._wait_for_changes()
        except BaseException as error:   # a bug or a hook that raised: logged, visible to waiters, then re-raised
            logger.error("capture consumer %r stopped: %s", self.name, describe(error))
            with self._mutex:
                self._loop_error = error
                self._progress.notify_all()
            raise

    def _run_once(self) -> tuple[int, CaptureError | None]:
        """``(changes handled, why changes may remain although none were handled)``: see :meth:`_run_batch`."""
        with self._run_mutex:
            self._check_open()
            if not self._lead():
                return 0, None
            handled, unfinished = self._run_batch(self.batch_size)
            self._maybe_prune()
            return handled, unfinished

    def _check_open(self) -> None:
        if self._state is ConsumerState.STOPPED:
            raise ConsumerStopped(f"capture consumer {self.name!r} was closed; create a new one")

    # --- leadership and notifications ------------------------------------------------------------

    def _lead(self, wait: float = 0.0) -> bool:
        """True if this consumer leads its name (taking the lock if it is free, or once it is within
        ``wait`` seconds).  Caller holds ``_run_mutex``."""
        if self._state is ConsumerState.LEADING and self._listener.still_held():
            return True
        if not self._listener.connected:
            with self._mutex:
                self._state = ConsumerState.STANDBY
            # (A new session stands by as the first did: the name may have been dropped while none held its standby
            # lock — the last one lost —, and the listener makes sure of its row again as it takes the locks.)
            self._listener.connect()
        if not self._listener.take(wait):
            with self._mutex:
                self._state = ConsumerState.STANDBY
            return False
        self._known_position = None
        with self._mutex:
            self._state = ConsumerState.LEADING
        logger.info("capture consumer %r leads (position %s)", self.name, self._position)
        self._step(Step.LEADING, 0)
        return True

    def _read_start(self) -> Position | None:
        """The committed position of this consumer's name, read as it leads; None if it no longer leads.  A name whose
        row was deleted by hand under its leader: the locks it holds are those of an id no longer the name's (a
        consumer of the name would lead the new row's at the same time), so it lets them go and leads anew, under the
        name's new row (from the oldest retained change).  Caller holds ``_run_mutex``."""
        position = read_position(self._database, self.name)
        if position is None:
            logger.warning("capture consumer %r: its name's row was deleted while it led (by hand: drop_consumer "
                           "refuses a name that is led); it leads anew, from the oldest retained change", self.name)
            with self._mutex:
                self._state = ConsumerState.STANDBY
            self._listener.close()
            if not self._lead():
                return None
            position = read_position(self._database, self.name)
        return position

    def _wait_for_changes(self) -> None:
        """Wait on the listener connection for a commit notification (or ``idle_wait``).  Loop thread only,
        outside ``_run_mutex`` (no batch runs meanwhile: batches run on this thread)."""
        self._step(Step.IDLE, 0)
        if not self._listener.connected:
            self._stopping.wait(self.idle_wait)
            return
        if not self._listener.wait_for_notification(self.idle_wait):
            with self._run_mutex:
                self._listener.close()
                with self._mutex:
                    self._state = ConsumerState.STANDBY

    # --- one batch -----------------------------------------------------------------------------

    def _run_batch(self, limit: int) -> tuple[int, CaptureError | None]:
        """``(changes handled, None)``; or ``(0, why)`` when changes remain although none were handled: the
        :class:`CaptureConflict` of a batch another process committed, or a :class:`CaptureError` saying the
        batch failed more than ``max_retries`` times.  Caller holds ``_run_mutex``."""
        attempt = 0
        while True:
            attempt += 1
            start = self._known_position
            if start is None:
                start = self._known_position = self._read_start()
                if start is None:
                    return 0, None
            with self._mutex:
                self._fetches_begun += 1
                fetch = self._fetches_begun
            began = time.perf_counter()
            changes = self._reader.fetch(start, limit)
            self._count(fetch_seconds=time.perf_counter() - began)
            if not changes:
                with self._mutex:
                    self._position = start
                    self._last_empty_fetch = fetch
                    self._progress.notify_all()
                return 0, None
            self._note_lag(changes[0][0])
            self._step(Step.FETCHED, len(changes))
            try:
                try:
                    handled = self._apply(start, changes)
                except BaseException:
                    self._known_position = None   # read it again: whatever happened, PostgreSQL knows
                    raise
                self._known_position = changes[-1][0].at
                return handled, None
            except CaptureConflict as error:
                logger.warning("%s", error)
                self._count(conflicts=1)
                return 0, error
            except (RetryBatch, TransactionAborted, *TRANSIENT) as error:
                self._count(retried_batches=1)
                if attempt > self.max_retries:
                    logger.warning("capture consumer %r: batch at %s failed %d times (%r); trying again later",
                                   self.name, start, attempt, error)
                    unfinished = CaptureError(
                        f"capture consumer {self.name!r}: the batch at {start} failed {attempt} times ({error!r}, "
                        f"max_retries={self.max_retries}); its changes remain pending — run the consumer again later")
                    unfinished.__cause__ = error
                    return 0, unfinished
                # Jittered back-off between retries of the batch (not used to order threads).
                time.sleep(random.uniform(0.5, 1.5) * min(0.5, 0.002 * 2 ** attempt))

    def _apply(self, start: Position, changes: list[Entry]) -> int:
        """One batch through the ingestion core: batch number the first change's id (the same start position
        always reads the same first change), rows the changes as their dead letters keep them, events the
        changes' own; the position writer commits with the ledger row.  A change whose reactions PostgreSQL
        refuses is found by the core's trial flushes and kept as a dead letter; the rest commits."""
        end = changes[-1][0].at
        writer = PositionWriter(self._database, self.name, start, end, len(changes), self._step)
        rows = [{"consumer": self.name, "table": change.table, "operation": KINDS[change.operation].value,
                 "xid": change.xid, "commit_position": change.position, "change_id": change.change_id, "rule": None,
                 "key": None if event is None else event.key,
                 # (what changed, for the dead letter: as the event has it, or as captured when it could not be one)
                 "old": change.captured_old if event is None else event.old,
                 "new": change.captured_new if event is None else event.new} for change, event, _ in changes]
        events = [CapturedEvent(position, change, event, problem)
                  for position, (change, event, problem) in enumerate(changes)]
        self._handler.begin(writer)
        outcome = self.ingestion.process(rows, changes[0][0].change_id, query_id=self.ledger_id, events=events,
                                         participants=(writer,), punctuate=False, fresh=True)
        if not outcome.committed:        # the ledger had the batch: another leader committed it (same start)
            raise CaptureConflict(f"capture consumer {self.name!r}: the batch from {start} was committed by another "
                                  f"process consuming under the same name; the consumer reads its position again")
        # Committed: the position and the effects are durable together.
        results = self._handler.results
        rules = self._database.rules
        for result in results:
            if result.outcome is FiringOutcome.EXECUTED:
                rules.count(result.firing.rule, "executed")
        timings = outcome.timings
        self._committed(end, len(changes), firings=len(results), failed=outcome.dead_letters,
                        rules_seconds=timings.validate + timings.engine, commit_seconds=timings.commit + timings.flush)
        return len(changes)

    def _committed(self, end: Position, changes: int, **counts: float) -> None:
        """A batch up to ``end`` committed: count it, wake the waiters, tell ``on_step``."""
        with self._mutex:
            self._position = end
            for what, amount in dict(counts, batches=1, changes=changes).items():
                self._counters[what] += amount
            self._progress.notify_all()
        self._step(Step.COMMITTED, changes)

    def _note_lag(self, change: CapturedChange) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        lag = max(0.0, (now - change.committed_at).total_seconds())
        warn = False
        with self._mutex:
            self._lag = lag
            if lag > self.behind_seconds and time.monotonic() - self._last_behind_warning > 60.0:
                self._last_behind_warning = time.monotonic()
                warn = True
        if warn:
            logger.warning("capture consumer %r is behind: the oldest change it is handling committed %.0f s ago "
                           "(see activedb capture status for the backlog)", self.name, lag)

    # --- pruning ---------------------------------------------------------------------------------

    def _maybe_prune(self) -> None:
        """Caller holds ``_run_mutex``."""
        now = time.monotonic()
        if now - self._last_prune < self.prune_interval:
            return
        self._last_prune = now
        pruned = prune(self._database.engine, self.retention_seconds)
        if pruned:
            self._count(pruned_commits=pruned)
            self._step(Step.PRUNED, pruned)
