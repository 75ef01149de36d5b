"""Alembic environment of the benchmark tables."""
from activedb.alembic_env import run_env

run_env(version_table="bench_alembic_version")
