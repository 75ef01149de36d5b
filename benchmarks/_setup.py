"""Connecting a benchmark to its database (embedded by default, or ACTIVEDB_DATABASE_URL)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

import activedb

MIGRATIONS = Path(__file__).parent / "migrations"


def connect(**options) -> activedb.Database:
    database = activedb.connect(**options)
    database.upgrade_app(MIGRATIONS)
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE bench_objects, bench_rows, bench_counters"))
    return database
