"""Alembic environment of the capture tests' tables (an application's own migrations)."""
from activedb.alembic_env import run_env

run_env(version_table="capture_tests_alembic_version")
