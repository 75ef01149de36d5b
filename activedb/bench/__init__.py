"""Benchmarks behind ``activedb bench NAME``.

Each benchmark is a module ``activedb.bench.<name>`` (or one another package contributes, e.g.
``spark_bridge.bench_ingest``) exposing ``run(quick: bool = False, progress: Progress | None = None) ->
BenchReport``; its module docstring is the help of ``activedb bench NAME --help``.  The CLI shows the
progress (a bar on a terminal, one line per step otherwise, on stderr), then a table that fits the
terminal; ``--json-only`` prints the JSON document instead, ``--json FILE`` writes it, ``--plot FILE``
draws the figures (``activedb.bench.plot``).  Benchmarks are never run by the test suite's assertions
on timings; a smoke test only checks that each benchmark runs in ``quick`` mode and reports its fields.
"""

from activedb.bench.progress import Progress
from activedb.bench.report import BenchReport, Row, Series, measure_rate

__all__ = ["BenchReport", "Row", "Series", "Progress", "measure_rate"]
