"""Alembic environment for activedb's own tables (version table ``activedb_alembic_version``): online and
offline runs as :mod:`activedb.alembic_env` describes.
"""

from activedb._migrations import VERSION_TABLE
from activedb.alembic_env import run_env

run_env(version_table=VERSION_TABLE, transaction_per_migration=True, configure_logging=True)
