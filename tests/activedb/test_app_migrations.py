"""An application's Alembic directory as a newcomer meets it, against the real embedded PostgreSQL: ``activedb app
init`` in any directory."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from activedb import _migrate
from activedb.cli import main
from tests._tables import table_names


def invoke(url, *arguments):
    return CliRunner().invoke(main, ["--url", url, *arguments], catch_exceptions=False)


@pytest.fixture(scope="module")
def url(database_url):
    result = invoke(database_url, "db", "upgrade")
    assert result.exit_code == 0, result.output
    return database_url


@pytest.mark.parametrize("length", [28, 40, 62, 120])
def test_app_init_in_a_directory_of_a_long_name_writes_ids_and_a_version_table_postgresql_keeps(url, tmp_path, length):
    """`activedb app init` names the revision ``NAME_0001`` and the version table ``NAME_alembic_version`` after the
    directory: a name of 28 characters or more made a revision id longer than Alembic's ``VARCHAR(32)`` version
    column (the upgrade failed: value too long), one of about 48 a table name PostgreSQL cut at 63 bytes (the
    version table not found again by its name).  A long name is cut and given a short hash of the whole, so two long
    names alike at the start still differ; the directory upgrades, and a second revision numbers after the first."""
    directory = "project_" + "x" * (length - len("project_"))
    location = tmp_path / directory
    result = invoke(url, "app", "init", str(location))
    assert result.exit_code == 0, result.output
    revision = re.search(r'^revision = "(\w+)"$', (location / "versions" / "0001_first_tables.py").read_text(), re.M)
    assert revision is not None and len(revision[1]) <= 32 - 1, revision       # (room for a branch's letter)
    table = re.search(r'version_table="(\w+)"', (location / "env.py").read_text())
    assert table is not None and len(table[1]) <= 63, table
    upgraded = invoke(url, "app", "upgrade", str(location))
    assert upgraded.exit_code == 0 and f"now at {revision[1]}" in upgraded.output, upgraded.output
    assert table[1] in table_names(url)
    written, _ = _migrate.new_app_revision(location, "second")
    assert re.search(rf'^revision = ["\']{revision[1][:-4]}0002["\']$', written.read_text(), re.M), written.read_text()
    assert invoke(url, "app", "upgrade", str(location)).exit_code == 0
    other = tmp_path / (directory[:-1] + "y")
    assert invoke(url, "app", "init", str(other)).exit_code == 0
    assert re.search(r'version_table="(\w+)"', (other / "env.py").read_text())[1] != table[1]
