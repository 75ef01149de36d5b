"""Benchmarks behind ``activedb bench NAME``.

Each benchmark is a module ``activedb.bench.<name>`` exposing
``run(quick: bool = False) -> BenchReport``.  The CLI prints the report as one
JSON document on stdout followed by a readable table (``rich``).  Benchmarks
are never run by the test suite's assertions on timings; a smoke test only
checks that each benchmark runs in ``quick`` mode and reports its fields.
"""

from activedb.bench.report import BenchReport, Row, measure_rate

__all__ = ["BenchReport", "Row", "measure_rate"]
