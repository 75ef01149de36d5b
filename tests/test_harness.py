"""The suite's own harness (``tests/conftest.py``): what it decides from the environment a test process starts in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _DRIVER_OPTIONS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("inherited, own", [(_DRIVER_OPTIONS, False), ("-Xmx2g", True), ("", True), (None, False)])
def test_only_a_spark_submit_opts_of_the_users_own_keeps_the_class_data_archive_out(inherited, own):
    """pytest-xdist's workers inherit the environment of the process that started them, which loaded the conftest
    and set ``SPARK_SUBMIT_OPTS`` to the suite's value: taken for a value of the user's, it kept every worker of the
    suite's runs (``-n auto``) from adding the Spark drivers' class-data archive."""
    environment = {key: value for key, value in os.environ.items() if key != "SPARK_SUBMIT_OPTS"}
    if inherited is not None:
        environment["SPARK_SUBMIT_OPTS"] = inherited
    done = subprocess.run([sys.executable, "-c", "import tests.conftest as c; print(c._OWN_SUBMIT_OPTS)"],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (0, f"{own}\n"), done.stderr[-3000:]


def test_make_database_url_with_migrations_is_what_connect_and_upgrade_app_would_leave(make_database_url):
    """``make_database_url(suffix, migrations=...)`` copies the session's template instead of migrating: the copy has
    the tables and version rows ``activedb.connect`` and ``upgrade_app`` leave on an empty database, each copy is a
    database of its own (a row written to one is in no later copy), and without ``migrations`` it stays empty."""
    import sqlalchemy as sa

    import activedb
    from tests.conftest import APP_MIGRATIONS

    def schema(url: str) -> tuple[set[str], list[tuple]]:
        engine = sa.create_engine(url)
        try:
            names = set(sa.inspect(engine).get_table_names())
            with engine.connect() as connection:
                versions = sorted(tuple(row) for name in sorted(names) if "version" in name
                                  for row in connection.execute(sa.text(f'SELECT * FROM "{name}"')))
            return names, versions
        finally:
            engine.dispose()

    migrated = make_database_url("harness_migrated")
    reference = activedb.connect(migrated)
    try:
        reference.upgrade_app(APP_MIGRATIONS)
    finally:
        reference.close()
    copied = make_database_url("harness_copied", migrations=(APP_MIGRATIONS,))
    assert schema(copied) == schema(migrated)
    assert "counters" in schema(copied)[0] and schema(copied)[1], schema(copied)
    engine = sa.create_engine(copied)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("INSERT INTO counters (key, total) VALUES ('harness', 1)"))
    finally:
        engine.dispose()
    engine = sa.create_engine(make_database_url("harness_copied_again", migrations=(APP_MIGRATIONS,)))
    try:
        with engine.connect() as connection:
            assert connection.execute(sa.text("SELECT count(*) FROM counters")).scalar_one() == 0
    finally:
        engine.dispose()
    assert schema(make_database_url("harness_empty")) == (set(), [])
