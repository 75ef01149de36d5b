"""Prometheus metrics of a running activedb process: :class:`MetricsExporter` (``/metrics`` over
HTTP) and the ``--metrics-port`` option of the long-running commands.  ``prometheus_client`` is
imported on first use of the exporter's names, not by the option (so ``activedb --help`` does not
pay for it).  Design note, with a usage example: ``activedb/metrics/README.md``.
"""

from typing import TYPE_CHECKING

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

__getattr__, __dir__ = lazy.exports(__name__, _LAZY)

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from activedb.metrics._collector import (
        ActivedbCollector as ActivedbCollector, ConsumerSource as ConsumerSource, IngestionSource as IngestionSource,
        reason_label as reason_label)
    from activedb.metrics._exporter import MetricsExporter as MetricsExporter, parse_listen as parse_listen
    from activedb.metrics._latency import BUCKETS as BUCKETS, BatchLatency as BatchLatency
