"""Driving Alembic from activedb: the layer's own revisions and an application's.

activedb's own tables live in ``migrations/`` (version table
``activedb_alembic_version``).  An application keeps its tables in its own
Alembic environment; :func:`upgrade_app` runs it on the same database, passing
the open connection in ``config.attributes["connection"]`` so the app's
``env.py`` can use it (see ``activedb/examples/hand_hygiene/migrations/env.py``
for a ready-made one).
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine

from activedb import _migrations as migrations
from activedb.errors import MigrationError


def _config(script_location: Path, connection=None, url: str | None = None) -> Config:
    config = Config(str(script_location / "alembic.ini")) if (script_location / "alembic.ini").exists() else Config()
    config.set_main_option("script_location", str(script_location))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["connection"] = connection
    config.attributes["configure_logging"] = False
    return config


def upgrade(engine: Engine, revision: str = "head", *, script_location: Path | None = None) -> None:
    _run(engine, "upgrade", revision, script_location)


def downgrade(engine: Engine, revision: str, *, script_location: Path | None = None) -> None:
    _run(engine, "downgrade", revision, script_location)


def _run(engine: Engine, action: str, revision: str, script_location: Path | None) -> None:
    location = script_location or migrations.SCRIPT_LOCATION
    try:
        with engine.begin() as connection:
            getattr(command, action)(_config(location, connection), revision)
    except MigrationError:
        raise
    except Exception as error:  # alembic raises CommandError and driver errors alike
        raise MigrationError(f"{action} to {revision!r} failed: {_first_line(error)}") from error


def offline_sql(url: str, action: str, revision: str) -> str:
    """The SQL an upgrade/downgrade would run, without touching the database."""
    buffer = io.StringIO()
    config = _config(migrations.SCRIPT_LOCATION, url=url)
    config.output_buffer = buffer
    with redirect_stdout(buffer):
        getattr(command, action)(config, revision, sql=True)
    return buffer.getvalue()


def current(engine: Engine, *, version_table: str = migrations.VERSION_TABLE) -> str | None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": version_table})
        heads = context.get_current_heads()
    return heads[0] if heads else None


def head(script_location: Path | None = None) -> str:
    script = ScriptDirectory.from_config(_config(script_location or migrations.SCRIPT_LOCATION))
    return script.get_current_head()


def upgrade_app(engine: Engine, script_location: str | Path, revision: str = "head") -> None:
    """Run an application's own Alembic environment (its env.py decides the version table)."""
    _run(engine, "upgrade", revision, Path(script_location))


def downgrade_app(engine: Engine, script_location: str | Path, revision: str) -> None:
    _run(engine, "downgrade", revision, Path(script_location))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
