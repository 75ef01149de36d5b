"""The hand-hygiene application (HyReminder, from the paper Active CEP §1; see docs/papers.md), used by
``activedb demo``.

* :mod:`.app` — the rules (``register(db)``), the statuses and the design note;
* :mod:`.events` — a deterministic badge-event generator and the direct (non-Spark) feeder;
* :mod:`.demo` — ``run_demo``, what ``activedb demo`` runs;
* :mod:`.errors` — why a badge event is rejected;
* ``migrations/`` — the application's tables (Alembic, version table ``hand_hygiene_alembic_version``).
"""

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
