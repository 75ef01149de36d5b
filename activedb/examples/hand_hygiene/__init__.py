"""The hand-hygiene application of seed 000 (HyReminder), used by ``activedb demo``."""

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
