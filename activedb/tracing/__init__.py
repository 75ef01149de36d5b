"""activedb.tracing — OpenTelemetry spans of ingested batches, their rule firings and their commits, through
``opentelemetry-api`` only; off (no span, no observer, one call per batch) unless the application configured an
SDK.  The design note is ``README.md`` in this package.

Extender interface (the ingestion core uses it; an application only configures OpenTelemetry's SDK):
:class:`BatchTracing` (one per ingestion: :meth:`~BatchTracing.start` a batch's spans), :class:`BatchTrace`,
:func:`tracer`, :data:`INSTRUMENTATION`.
"""

from activedb.tracing._spans import INSTRUMENTATION, BatchTrace, BatchTracing, tracer

__all__ = ["INSTRUMENTATION", "BatchTrace", "BatchTracing", "tracer"]
