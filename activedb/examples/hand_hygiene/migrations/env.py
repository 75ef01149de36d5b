"""Alembic environment of the hand-hygiene example application."""
from activedb.alembic_env import run_env

run_env(version_table="hand_hygiene_alembic_version")
