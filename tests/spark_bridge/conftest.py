"""Fixtures of the Spark bridge tests (the ``spark`` session fixture is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def make_database_url(pg_server, request):
    """``make(suffix)`` -> the URL of a fresh, empty PostgreSQL database (dropped at the
    end of the module), for tests that compare two runs in separate databases."""
    import re

    from tests.conftest import _admin

    module = re.sub(r"[^a-z0-9_]", "_", request.module.__name__.lower())[-40:]
    created: list[str] = []

    def make(suffix: str) -> str:
        name = f"t_{module}_{suffix}"[:63]
        with _admin(pg_server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return pg_server.url(name)

    yield make
    with _admin(pg_server) as admin:
        for name in created:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
