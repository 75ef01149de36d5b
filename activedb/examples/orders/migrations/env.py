"""Alembic environment of the orders example (the README's change-capture example)."""
from activedb.alembic_env import run_env

run_env(version_table="orders_example_version")
