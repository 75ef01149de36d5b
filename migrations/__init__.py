"""Alembic environment and revisions for every table activedb owns.

``activedb db upgrade`` / ``downgrade`` / ``current`` drive it; so does
``alembic -c migrations/alembic.ini ...`` with ``ACTIVEDB_DATABASE_URL`` set.
"""

from pathlib import Path

SCRIPT_LOCATION = Path(__file__).resolve().parent
VERSION_TABLE = "activedb_alembic_version"
