"""Benchmarks behind ``activedb bench NAME``.

Each benchmark is a module ``activedb.bench.<name>`` (or one another package contributes, e.g.
``spark_bridge.bench_ingest``) exposing ``run(quick: bool = False, progress: Progress | None = None) ->
BenchReport``; its module docstring is the help of ``activedb bench NAME --help``.  The CLI shows the
progress (a bar on a terminal, one line per step otherwise, on stderr), then a table that fits the
terminal; ``--json-only`` prints the JSON document instead, ``--json FILE`` writes it, ``--plot FILE``
draws the figures (``activedb.bench.plot``).  Benchmarks are never run by the test suite's assertions
on timings; a smoke test only checks that each benchmark runs in ``quick`` mode and reports its fields.
"""

from activedb.bench._setup import MIGRATIONS
from activedb.bench._setup import connect as connect_database
from activedb.progress import Progress
from activedb.bench.report import BenchReport, Row, Series, measure_rate

#: ``connect_database(**options)``: a benchmark's database (embedded, or ``ACTIVEDB_DATABASE_URL``) with the
#: benchmarks' tables (``MIGRATIONS``, an Alembic directory) at head and the scratch tables empty.
__all__ = ["MIGRATIONS", "BenchReport", "Row", "Series", "Progress", "connect_database", "measure_rate"]
