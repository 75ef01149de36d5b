"""Prometheus metrics of a running activedb process (design note: ``activedb/metrics/README.md``).

    exporter = MetricsExporter(db)
    exporter.watch_ingestion(sink)          # optional: what the process runs
    url = exporter.start("9464")            # http://127.0.0.1:9464/metrics
    ...
    exporter.close()

Off unless started: ``activedb run --metrics-port PORT`` and ``activedb capture consume --metrics-port
PORT`` start it.  ``prometheus_client`` is imported on first use of the exporter's names, not by the
command line's option (so ``activedb --help`` does not pay for it).
"""

from __future__ import annotations

import importlib
from typing import Any

from activedb.metrics._cli import metrics_port_option, start_metrics
from activedb.metrics.errors import MetricsError

_LAZY = {
    "ActivedbCollector": "activedb.metrics._collector",
    "ConsumerSource": "activedb.metrics._collector",
    "IngestionSource": "activedb.metrics._collector",
    "reason_label": "activedb.metrics._collector",
    "MetricsExporter": "activedb.metrics._exporter",
    "parse_listen": "activedb.metrics._exporter",
    "BUCKETS": "activedb.metrics._latency",
    "BatchLatency": "activedb.metrics._latency",
}

__all__ = ["MetricsError", "metrics_port_option", "start_metrics", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'activedb.metrics' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
