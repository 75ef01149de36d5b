"""Benchmarks behind ``activedb bench NAME``: a module ``benchmarks.<name>`` with ``run(quick=False,
progress=None) -> BenchReport`` whose docstring is its ``--help``.  The design note is ``README.md``.
"""

from activedb.progress import Progress
from benchmarks._profile import add_frame_ends, called_from, cumulative, database_wait, phase_seconds, scaled
from benchmarks._setup import MIGRATIONS
from benchmarks._setup import connect as connect_database
from benchmarks.report import BenchReport, Row, Series

#: ``connect_database(**options)``: a benchmark's database (embedded, or ``ACTIVEDB_DATABASE_URL``) with the
#: benchmarks' tables (``MIGRATIONS``, an Alembic directory) at head and the scratch tables empty.
#: ``phase_seconds``, ``scaled``, ``cumulative``, ``called_from``, ``database_wait``, ``add_frame_ends``: where a
#: cProfile'd run's time goes, phase by phase (``_profile.py``), for benchmarks outside this package too.
__all__ = ["MIGRATIONS", "BenchReport", "Row", "Series", "Progress", "connect_database", "called_from", "cumulative",
           "database_wait", "phase_seconds", "scaled", "add_frame_ends"]
