"""The hand-hygiene application (HyReminder, from *Active Complex Event Processing over Event Streams*),
used by ``activedb demo``.  Its modules and its design: ``README.md`` in this package.
"""

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
