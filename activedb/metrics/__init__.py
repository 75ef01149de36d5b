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

from activedb import lazy
from activedb.metrics._cli import metrics_port_option, start_metrics
from activedb.metrics.errors import MetricsError

_LAZY = {
    "activedb.metrics._collector": ["ActivedbCollector", "ConsumerSource", "IngestionSource", "reason_label"],
    "activedb.metrics._exporter": ["MetricsExporter", "parse_listen"],
    "activedb.metrics._latency": ["BUCKETS", "BatchLatency"],
}

__all__ = ["MetricsError", "metrics_port_option", "start_metrics",
           *sorted(name for names in _LAZY.values() for name in names)]

# imported on first use: prometheus_client is loaded by the exporter's names, not by the command line's option
__getattr__, __dir__ = lazy.exports(__name__, _LAZY)
