"""Alembic environment of the orders example (the change-capture how-to's example)."""
from activedb.alembic_env import run_env

run_env(version_table="orders_example_version")
