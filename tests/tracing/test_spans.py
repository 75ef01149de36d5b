"""OpenTelemetry spans of an ingested batch (``activedb/tracing/README.md``): with the SDK's in-memory exporter
configured by the application, one batch gives the batch's span, a span per rule firing and the commit's span,
in one tree, each labelled with the batch's ledger id; without an SDK, nothing is made and no observer is added."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from activedb.tracing import BatchTracing, tracer
from spark_bridge import IngestSink
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import new_app_database


def test_one_batch_makes_a_tree_of_spans_labelled_with_its_ledger_id(make_database_url):
    result = subprocess.run([sys.executable, "-m", "tests.tracing.span_driver", make_database_url("traced")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    spans = json.loads(result.stdout)
    [batch] = [span for span in spans if span["name"] == "activedb.ingest.batch"]
    assert batch["parent"] is None and batch["kind"] == "CONSUMER" and batch["status"] == "UNSET"
    assert batch["attributes"] == {
        "activedb.ingest.source": "traced", "activedb.ingest.ledger_id": "traced@run-1", "activedb.ingest.batch_id": 7,
        "messaging.batch.message_count": 3, "activedb.ingest.outcome": "committed", "activedb.ingest.events": 1,
        "activedb.ingest.dead_letters": 2, "activedb.ingest.attempts": 1}
    assert {span["trace"] for span in spans} == {batch["trace"]}
    for span in spans:
        assert (span["attributes"]["activedb.ingest.ledger_id"], span["attributes"]["activedb.ingest.batch_id"]) == (
            "traced@run-1", 7), span
        assert batch["start"] <= span["start"] <= span["end"] <= batch["end"], span

    [commit] = [span for span in spans if span["name"] == "activedb.ingest.commit"]
    assert commit["parent"] == batch["id"] and commit["status"] == "UNSET"
    # A firing's parent is the innermost firing among its transaction's ancestors, also one whose span has ended: the
    # deferred milestone, fired by apply_add on k1, runs in an extra cycle before apply_add's transaction commits,
    # after apply_add's span ended (OpenTelemetry lets a span's parent end first).
    by_id = {span["id"]: span for span in spans}

    def parent_of(span):
        parent = by_id[span["parent"]]
        return (parent["name"], parent["attributes"].get("activedb.event.key"))

    firings = sorted((span["name"], span["attributes"]["activedb.event.key"], span["attributes"]["activedb.rule.outcome"],
                      span["status"], parent_of(span))
                     for span in spans if span["name"].startswith("activedb.rule "))
    assert firings == [("activedb.rule apply_add", "k1", "executed", "UNSET", ("activedb.ingest.batch", None)),
                       ("activedb.rule apply_add", "k2", "failed", "ERROR", ("activedb.ingest.batch", None)),
                       ("activedb.rule milestone", "k1", "executed", "UNSET", ("activedb.rule apply_add", "k1"))]
    assert len(spans) == 5


def test_without_an_sdk_nothing_is_made_and_no_observer_is_added(make_database_url):
    assert tracer() is None
    database = new_app_database(make_database_url, "untraced")
    try:
        observers = list(database.transactions.observers)
        assert BatchTracing(database, "untraced").start("untraced@1", 0, 1) is None
        sink = IngestSink(database, app_counters.MAPPING, query_name="untraced")
        sink.process([{"type": "add", "key": "k1", "ts": 1.0, "amount": 1, "seq": 1}], 0, query_id="untraced@1")
        assert list(database.transactions.observers) == observers
        assert "opentelemetry.sdk.trace" not in sys.modules
    finally:
        database.close()


# A firing of a spawned child can end after its batch: a batch whose body failed aborts its tree, which dooms the
# running child without waiting for it (activedb/txn/README.md). Fake transactions: the observer's bookkeeping only.
_LATE_FIRING = """
import json
from types import SimpleNamespace


class Node:                 # (a transaction as the observer reads it; hashable by identity)
    def __init__(self, id, parent):
        self.id, self.parent, self.root = id, parent, self if parent is None else parent.root
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from activedb.tracing._spans import BatchTrace, _FiringSpans
from activedb.txn import FiringOutcome

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
observer = _FiringSpans()
trace = BatchTrace(provider.get_tracer("test"), observer, "late", "late@run-1", 3, 1, 0)
root = Node("T1", None)
child = Node("T1.1", root)
firing = SimpleNamespace(rule=SimpleNamespace(name="slow"), event=SimpleNamespace(kind="inserted", source="t", key=1),
                         coupling="immediate")
trace.transaction(root)
observer.on_firing_start(child, firing)
trace.end(None, RuntimeError("the batch's body failed"))
observer.on_firing_end(child, firing, FiringOutcome.CANCELLED)
print(json.dumps({span.name: span.attributes.get("activedb.rule.outcome") for span in exporter.get_finished_spans()}))
"""


def test_a_firing_that_ends_after_its_batch_is_exported():
    result = subprocess.run([sys.executable, "-c", _LATE_FIRING], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == {"activedb.ingest.batch": None, "activedb.rule slow": "cancelled"}
