"""The hand-hygiene application (HyReminder, from the paper Active CEP §1; see docs/papers.md), used by
``activedb demo``.

* :mod:`.queries` — the application as the paper's pattern queries (Q1/R1 verbatim, Q2's pattern, the
  app's own edges, each labelled), ``make_engine(db)``, the coupling-mode rules on what the queries'
  rules write (``register_rules(db)``) and the micro-batch feed; what ``activedb demo`` runs;
* :mod:`.app` — the same application as ECA rules with per-worker pattern state (``register(db)``), used by
  ``activedb run activedb.examples.hand_hygiene.app``, ``activedb bench ingest`` and the Spark feed of the
  demo until that feed takes a stream engine;
* :mod:`.events` — a deterministic badge-event generator and the direct (non-Spark) feeder;
* :mod:`.demo` — ``run_demo``, what ``activedb demo`` runs;
* :mod:`.errors` — why a badge event is rejected;
* ``migrations/`` — the application's tables (Alembic, version table ``hand_hygiene_alembic_version``).
"""

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
