"""Alembic environment of the tables the tests use (an application's own migrations)."""
from activedb.alembic_env import run_env

run_env(version_table="tests_alembic_version")
