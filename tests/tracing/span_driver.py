"""An application that configures OpenTelemetry's SDK with the in-memory exporter, then ingests one batch of the
counters application (``python -m tests.tracing.span_driver URL``) through ``IngestSink.process`` (the ingestion
core, without Spark): it prints the finished spans as one JSON list (name, ids, parent, kind, status,
attributes)."""

from __future__ import annotations

import datetime as dt
import json
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spark_bridge import IngestSink
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_database, iso


def main(url: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    database = app_database(url)
    try:
        sink = IngestSink(database, app_counters.MAPPING, query_name="traced")
        moment = [iso(BASE_TIME + dt.timedelta(seconds=second)) for second in range(3)]
        rows = [{"type": "add", "key": "k1", "ts": moment[0], "amount": 150, "seq": 1},     # applied; crosses 100
                {"type": "add", "key": "k2", "ts": moment[1], "amount": -5, "seq": 2},      # the rule rejects it
                {"type": "add", "key": None, "ts": moment[2], "amount": 1, "seq": 3}]       # not an event (no key)
        sink.process(rows, 7, query_id="traced@run-1")
        sink.close()
    finally:
        database.close()
    spans = [{"name": span.name, "id": span.context.span_id, "trace": span.context.trace_id,
              "parent": span.parent.span_id if span.parent is not None else None, "kind": span.kind.name,
              "status": span.status.status_code.name, "attributes": dict(span.attributes),
              "start": span.start_time, "end": span.end_time} for span in exporter.get_finished_spans()]
    print(json.dumps(spans))


if __name__ == "__main__":
    main(sys.argv[1])
