"""OpenTelemetry spans of ingested batches: :class:`BatchTracing` (what an ingestion holds), :class:`BatchTrace` (one
batch's spans) and :class:`_FiringSpans` (the :class:`~activedb.txn.Observer` that makes a span of each rule
firing inside a traced batch).  Design note: ``README.md`` in this package.

Only ``opentelemetry-api`` is used, and only once the application imported it: :func:`tracer` looks for
``opentelemetry.trace`` in ``sys.modules`` and asks it for the global tracer provider; with none configured (the
API's proxy or no-op provider) there is no tracer, no span, no observer — a batch costs one call of
:meth:`BatchTracing.start`.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Protocol

from activedb import lowlevel
from activedb.txn import CommitParticipant, FiringOutcome, FiringView, Observer

if TYPE_CHECKING:  # pragma: no cover
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, Tracer, TracerProvider

    from activedb._handle import DatabaseHandle
    from activedb.txn import Transaction

__all__ = ["BatchTrace", "BatchTracing", "INSTRUMENTATION", "Outcome", "tracer"]

#: The instrumentation scope of every span activedb makes (``TracerProvider.get_tracer(INSTRUMENTATION)``).
INSTRUMENTATION = "activedb"

#: ``(provider, tracer)`` of the last provider asked: one tracer per configured provider, not one per batch.  A
#: cache, replaced whole (one reference store: no mutex needed).
_cached: tuple[TracerProvider, Tracer] | None = None


def tracer() -> Tracer | None:
    """activedb's tracer of the global tracer provider the application configured, or None: the API is not
    imported, or no SDK's provider is set (the API's proxy or no-op provider)."""
    global _cached
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    from importlib import metadata

    try:
        version = metadata.version("activedb")
    except metadata.PackageNotFoundError:      # (run from a source tree that was not installed)
        version = None
    made: Tracer = provider.get_tracer(INSTRUMENTATION, version)
    _cached = (provider, made)
    return made


class BatchTracing:
    """The tracing of one ingestion's batches into ``db``.  :meth:`start` begins a batch's spans when an SDK is
    configured; the first traced batch adds the observer of rule firings to ``db`` (kept until :meth:`close`).

    Thread-safety: ``_mutex`` protects ``_observer`` and ``_open`` (the roots of the batches being traced); spans
    are thread-safe themselves."""

    def __init__(self, db: DatabaseHandle, source: str) -> None:
        self.db = db
        self.source = source
        self._mutex = threading.Lock()
        self._observer: _FiringSpans | None = None

    def start(self, ledger_id: str, batch_id: int, rows: int, began_seconds_ago: float = 0.0) -> BatchTrace | None:
        """The spans of batch ``batch_id`` of the run ``ledger_id`` (``rows`` rows), begun ``began_seconds_ago``
        (the connector's part: Spark's ``toArrow``); None (and nothing done) without a configured SDK."""
        made = tracer()
        if made is None:
            return None
        with self._mutex:
            observer = self._observer
            if observer is None:
                observer = self._observer = _FiringSpans()
                self.db.observe(observer)
        return BatchTrace(made, observer, self.source, ledger_id, batch_id, rows,
                          time.time_ns() - int(began_seconds_ago * 1e9))

    def close(self) -> None:
        """Remove the observer of rule firings (if a batch was traced)."""
        with self._mutex:
            observer, self._observer = self._observer, None
        if observer is not None:
            self.db.transactions.observers.remove(observer)


class Outcome(Protocol):
    """What a batch came to, as :meth:`BatchTrace.end` reads it (``activedb.ingest.BatchOutcome`` is one)."""

    @property
    def committed(self) -> bool:        # False: the ledger had the batch, nothing was applied
        ...

    @property
    def events(self) -> int: ...

    @property
    def dead_letters(self) -> int: ...

    @property
    def attempts(self) -> int: ...


class BatchTrace:
    """The spans of one batch: ``activedb.ingest.batch`` (kind CONSUMER) from :meth:`BatchTracing.start` to
    :meth:`end`, a child ``activedb.ingest.commit`` for each top-level commit it tried (:meth:`commit_started`,
    :meth:`commit_ended`), and a span per rule firing in the batch's transaction tree (:class:`_FiringSpans`).
    Every span carries the batch's ledger id and number.  Used by the batch's thread; firings may end on others."""

    def __init__(self, made: Tracer, observer: _FiringSpans, source: str, ledger_id: str, batch_id: int,
                 rows: int, start_time: int) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = made
        self._observer = observer
        self.identity: dict[str, str | int] = {"activedb.ingest.ledger_id": ledger_id,
                                               "activedb.ingest.batch_id": batch_id}
        self.span = made.start_span("activedb.ingest.batch", kind=trace.SpanKind.CONSUMER, start_time=start_time,
                                    attributes={"activedb.ingest.source": source, **self.identity,
                                                "messaging.batch.message_count": rows})
        self.context = trace.set_span_in_context(self.span)
        self.commit_span: Span | None = None
        self.commit_context: Context | None = None
        self._root: Transaction | None = None
        #: Open firing spans of this batch's tree by their transaction (a nested firing's parent is found here).
        self.firings: dict[Transaction, Span] = {}
        #: The span contexts of this attempt's ended firings, by their transaction's id (no reference to it kept): a
        #: deferred rule fired by an immediate one runs before that one's transaction commits, after its span ended,
        #: and is its child all the same (OpenTelemetry lets a parent end first).  Dropped with the attempt.
        self.ended: dict[str, SpanContext] = {}

    def transaction(self, root: Transaction) -> None:
        """The batch's (next) top-level transaction: the firings in its tree become spans of this batch."""
        self._observer.forget(self._root)
        self._root = root
        self.ended = {}
        self._observer.follow(root, self)

    def commit_started(self, transaction: Transaction) -> None:
        """The batch's top-level ``transaction`` is about to commit (its body ran): the commit's span begins, and
        a commit participant of ``transaction`` ends it when PostgreSQL committed or the commit failed."""
        self.commit_span = self.tracer.start_span("activedb.ingest.commit", context=self.context,
                                                  attributes=self.identity)
        self.commit_context = self._trace.set_span_in_context(self.commit_span)
        lowlevel.enlist(transaction, _CommitSpan(self))

    def commit_ended(self, error: BaseException | None = None) -> None:
        span, self.commit_span, self.commit_context = self.commit_span, None, None
        if span is not None:
            _fail(span, error)
            span.end()

    def end(self, outcome: Outcome | None, error: BaseException | None = None) -> None:
        """The batch ended with ``outcome``, or failed with ``error``."""
        self.commit_ended(error)
        self._observer.forget(self._root)
        self._root = None
        self.ended = {}
        if outcome is not None:
            self.span.set_attributes({
                "activedb.ingest.outcome": "committed" if outcome.committed else "skipped",
                "activedb.ingest.events": outcome.events, "activedb.ingest.dead_letters": outcome.dead_letters,
                "activedb.ingest.attempts": outcome.attempts})
        else:
            self.span.set_attribute("activedb.ingest.outcome", "failed")
        _fail(self.span, error)
        self.span.end()

    def parent_of(self, transaction: Transaction) -> Context:
        """The context a firing in ``transaction`` starts its span in: the innermost firing among the transaction
        and its ancestors (also one whose span has ended), else the commit being tried, else the batch.  Caller holds
        the observer's ``_mutex``."""
        firings, ended = self.firings, self.ended
        node: Transaction | None = transaction
        while node is not None:
            span = firings.get(node)
            if span is not None:
                return self._trace.set_span_in_context(span)
            if ended:
                context = ended.get(node.id)
                if context is not None:
                    return self._trace.set_span_in_context(self._trace.NonRecordingSpan(context))
            node = node.parent
        return self.commit_context or self.context


class _CommitSpan(CommitParticipant):
    """Ends the commit's span of a batch when its top-level transaction committed or aborted."""

    def __init__(self, trace: BatchTrace) -> None:
        self.trace = trace

    def committed(self, transaction: Transaction) -> None:
        self.trace.commit_ended()

    def aborted(self, transaction: Transaction, error: BaseException | None) -> None:
        self.trace.commit_ended(error)


def _fail(span: Span, error: BaseException | None) -> None:
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))


class _FiringSpans(Observer):
    """A span per rule firing in the tree of a traced batch (``activedb.rule <name>``); firings of other
    transactions are passed over.  Thread-safety: ``_mutex`` protects ``_batches``, ``_running`` and each batch's
    ``firings`` and ``ended`` (a firing starts and ends on its own thread, beside others of the same tree)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._batches: dict[Transaction, BatchTrace] = {}
        #: The batch of each firing whose span is open, by its transaction: a firing ends its span even when it
        #: ends after its batch's trace (a spawned child an aborting tree doomed without waiting for it) or after
        #: the batch's next attempt began.
        self._running: dict[Transaction, BatchTrace] = {}

    def follow(self, root: Transaction, batch: BatchTrace) -> None:
        with self._mutex:
            self._batches[root] = batch

    def forget(self, root: Transaction | None) -> None:
        if root is not None:
            with self._mutex:
                self._batches.pop(root, None)

    def on_firing_start(self, transaction: Transaction, firing: FiringView) -> None:
        with self._mutex:
            batch = self._batches.get(transaction.root)
            if batch is None:
                return
            parent = batch.parent_of(transaction)
        rule, event = firing.rule, firing.event
        span = batch.tracer.start_span(f"activedb.rule {rule.name}", context=parent, attributes={
            **batch.identity, "activedb.rule.name": rule.name, "activedb.rule.coupling": str(firing.coupling),
            "activedb.event.kind": str(event.kind), "activedb.event.source": str(event.source),
            "activedb.event.key": str(event.key), "activedb.transaction.id": transaction.id})
        with self._mutex:
            batch.firings[transaction] = span
            self._running[transaction] = batch

    def on_firing_end(self, transaction: Transaction, firing: FiringView, outcome: FiringOutcome) -> None:
        with self._mutex:
            batch = self._running.pop(transaction, None)
            span = None if batch is None else batch.firings.pop(transaction, None)
            if batch is not None and span is not None:
                batch.ended[transaction.id] = span.get_span_context()
        if span is None:
            return
        span.set_attribute("activedb.rule.outcome", str(outcome))
        if outcome is FiringOutcome.FAILED:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, f"rule {firing.rule.name!r} raised"))
        span.end()
