"""Driving Alembic from activedb: its own revisions (version table ``activedb_alembic_version``) and an
application's (:meth:`Schema.upgrade_app`), each upgrade and downgrade (and :meth:`Schema.stamp`) under the
PostgreSQL advisory lock ``MIGRATION_LOCK``.  The overview, ``activedb/README.md``, places it.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import io
import logging
import os
import re
import threading
from contextlib import redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.runtime.migration import MigrationContext
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from activedb import _migrations as migrations
from activedb._migration_lock import LOCK_TIMEOUT_SECONDS as LOCK_TIMEOUT_SECONDS, MIGRATION_LOCK as MIGRATION_LOCK
from activedb._url import describe_url
from activedb.errors import (LOCK_NOT_AVAILABLE, UNDEFINED_TABLE, MigrationError, SchemaNotAtHead, own_table_missing,
                             sqlstate_of)

if TYPE_CHECKING:
    from alembic.runtime.migration import RevisionStep
    from alembic.script import Script
    from sqlalchemy.engine import Connection

    from activedb.store import Catalog, Granularity

logger = logging.getLogger("activedb.migrate")

# Protects Alembic's process-wide ``alembic.context`` (the EnvironmentContext an env.py run installs, and that the
# env.py reads as ``from alembic import context``): one env.py runs at a time in this process — two threads' runs
# (a look at an application's version table beside another's upgrade) ran on each other's context.  Reentrant: a
# run reads its version table (:func:`_recorded_heads`) holding it.  Taken after ``MIGRATION_LOCK``, never held
# while waiting for it (a run waiting its turn behind another process holds nothing of this process's).
# One for the process, not one per database URL: what it protects is process-wide whatever database a run uses —
# ``EnvironmentContext`` and ``Operations`` install themselves as module globals of ``alembic.context`` and
# ``alembic.op`` — so two env.py runs on two databases at once would still read and replace each other's.  Runs of
# one database are serialised by ``MIGRATION_LOCK`` already; this mutex only keeps this process's runs apart.
_ENVIRONMENT_MUTEX = threading.RLock()


class SchemaState(enum.Enum):
    """Where a database's activedb schema stands relative to this installation's revisions."""

    NEW = "new"            # never initialised: no activedb version table
    AT_HEAD = "at head"
    BEHIND = "behind"      # an older revision, or downgraded to base (the version table is empty)
    UNKNOWN = "unknown"    # a revision this installation does not know (a newer activedb wrote it)
    UNRECORDED = "unrecorded"   # activedb's tables without their version table (dropped by hand, left out of a
                                # restore): which revision they are at is not known


class _Attributes(dict[str, object]):
    """A ``Config.attributes`` that records whether the ``env.py`` run with it read the connection activedb passes
    (``attributes["connection"]``, or ``attributes.get("connection")``): one that did not connected by itself.  Used
    by one run on one thread."""

    connection_read = False

    def __getitem__(self, key: str) -> object:
        self.connection_read = self.connection_read or key == "connection"
        return super().__getitem__(key)

    def get(self, key: str, default: object = None) -> object:
        self.connection_read = self.connection_read or key == "connection"
        return super().get(key, default)


def _config(script_location: Path, connection: Connection | None = None, url: str | None = None) -> Config:
    config = Config(str(script_location / "alembic.ini")) if (script_location / "alembic.ini").exists() else Config()
    config.set_main_option("script_location", str(script_location))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes = _Attributes(connection=connection, configure_logging=False)
    return config


def _connection_unused(config: Config, location: Path) -> str:
    """What to add to the error of a run of ``location``'s env.py that did not read the connection activedb passed it
    (``config`` as :func:`_config` made it; "" if it did): what env.py must do."""
    if not isinstance(config.attributes, _Attributes) or config.attributes.connection_read:
        return ""
    return (f". {location / 'env.py'} did not use the connection activedb passes (config.attributes[\"connection\"]): "
            f"it connects by itself, as the env.py `alembic init` writes does (by the sqlalchemy.url of alembic.ini, "
            f"which activedb neither reads nor sets). Write it as `activedb app init` does — `from "
            f"activedb.alembic_env import run_env` then `run_env(version_table=\"NAME_alembic_version\")` — or have "
            f"it run context.configure(connection=config.attributes[\"connection\"], …) when that is given")


def _never_ran(location: Path) -> str:
    """What an env.py that never calls ``context.run_migrations()`` is told."""
    return (f"{location / 'env.py'} never calls context.run_migrations(), where Alembic runs the revisions and reads "
            f"its version table: call it inside `with context.begin_transaction():` after context.configure(…), as "
            f"activedb.alembic_env.run_env does (the env.py `activedb app init` writes calls it)")




#: The tables activedb's first revision creates, and no revision drops: a database that has one of them without the
#: version table had activedb's tables (:attr:`SchemaState.UNRECORDED`).
_FIRST_TABLES = ("activedb_rules", "activedb_transaction_log", "activedb_ingestion_ledger", "activedb_dead_letters")


def not_at_head(state: SchemaState, revision: str | None, where: str, then: str = "") -> SchemaNotAtHead:
    """The refusal of activedb's own tables in ``where`` (a database's description) at ``revision``, ``state``
    BEHIND, UNKNOWN or UNRECORDED: which revision they are at, which this activedb needs, and what to run (``then``:
    what the caller adds to it; not for UNRECORDED, whose remedy is not an upgrade)."""
    if state is SchemaState.UNRECORDED:
        return SchemaNotAtHead(
            f"{where} has activedb's tables ({', '.join(_FIRST_TABLES)}, …) but no {migrations.VERSION_TABLE}, the "
            f"table that records their revision (dropped by hand, or left out of a restore): activedb cannot tell "
            f"which revision they are at, so it neither upgrades nor uses them. Restore {migrations.VERSION_TABLE} "
            f"from the backup; or, knowing the revision they are at (`activedb db history` lists them, "
            f"migrations/README.md says what each adds), record it with `activedb db stamp REVISION` (it runs no "
            f"revision), then run `activedb db upgrade`")
    if state is SchemaState.UNKNOWN:
        return SchemaNotAtHead(f"activedb's tables in {where} are at revision {revision}, which this activedb does not "
                               f"know (a newer activedb wrote it; this one needs {head()}): upgrade activedb")
    return SchemaNotAtHead(f"activedb's tables in {where} are at {revision or 'base (downgraded)'}, this activedb "
                           f"needs {head()}: run `activedb db upgrade`{then}")


def unknown_to_downgrade(revision: str | None) -> SchemaNotAtHead:
    """The refusal of a downgrade of activedb's own tables at ``revision``, one this installation does not know (a
    newer activedb wrote it: no revision file here says how to undo it), and what to run instead."""
    return SchemaNotAtHead(f"activedb's tables are at revision {revision}, which this activedb does not know (a newer "
                           f"activedb wrote it), so no file here says how to undo it: `activedb db downgrade {head()}` "
                           f"of the activedb that wrote it takes them down to this one's head, which this one then "
                           f"downgrades further; nothing was changed")


class _Blockers:
    """Who blocks backend ``pid`` (``pg_blocking_pids``), asked on a thread of its own every ``every`` seconds while
    the block runs, on a connection of its own: when a statement of the run fails at its lock timeout, the run's
    transaction has ended and no one can ask PostgreSQL any more whom it waited for.  ``seen``: the last non-empty
    answer, lines ``pid N (application_name, state)``.  A run that ends before ``every`` asks nothing."""

    _QUERY = sa.text("SELECT pid, application_name, state FROM pg_stat_activity "
                     "WHERE pid = ANY(pg_blocking_pids(:pid)) ORDER BY pid")

    def __init__(self, engine: Engine, pid: int, every: float) -> None:
        self._engine, self._pid, self._every = engine, pid, every
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"activedb migration lock watch {pid}", daemon=True)
        self.seen: list[str] = []

    def __enter__(self) -> _Blockers:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        # (Bounded: a watch stuck in its query — the server hung — must not hold the run's end; a daemon thread.)
        self._thread.join(self._every + 10.0)

    def _watch(self) -> None:
        connection: Connection | None = None
        try:
            while not self._done.wait(self._every):     # (a watch of another backend, not an ordering of threads)
                if connection is None:
                    connection = self._engine.connect()
                rows = connection.execute(self._QUERY, {"pid": self._pid}).all()
                connection.rollback()
                if rows:
                    self.seen = [f"pid {pid} ({name or 'no application_name'}, {state or 'state unknown'})"
                                 for pid, name, state in rows]
        except Exception:           # (only a better message lost: the run's own error says what happened)
            pass
        finally:
            if connection is not None:
                connection.close()


@contextlib.contextmanager
def _failing_as(what: str, location: Path | None = None) -> Iterator[None]:
    """Any error of the block but a MigrationError becomes one: ``what failed: first line`` — of a database error,
    PostgreSQL's message and its hint (a revision's ``RAISE … USING HINT``: what to do), not the driver's wrapping;
    ``location``: an Alembic directory, whose innermost line the error passed (a revision's) is named, ``failed at
    FILE:LINE``; Alembic's ``KeyError`` of a ``down_revision`` that names no revision says which file and what to set
    (:func:`app_location` refuses such a directory before Alembic maps it, where the files tell)."""
    try:
        yield
    except MigrationError:
        raise
    except Exception as error:  # alembic raises CommandError and driver errors alike
        dangling = _dangling_down_revision(error, location)
        if dangling is not None:
            raise MigrationError(f"{what} failed: {dangling}") from error
        orig = error.orig if isinstance(error, sa.exc.DBAPIError) and error.orig is not None else error
        text = str(orig).strip().splitlines()
        hint = getattr(getattr(orig, "diag", None), "message_hint", None)
        raise MigrationError(f"{what} failed{_raised_in(error, location)}: "
                             f"{text[0] if text else type(error).__name__}"
                             + (f" ({hint})" if hint else "")) from error


def _dangling_down_revision(error: BaseException, location: Path | None) -> str | None:
    """What to say of Alembic's bare ``KeyError('name')``, raised as it maps ``location``'s revisions when one's
    ``down_revision`` names a revision no file has (one :func:`_missing_down_revisions` could not tell: a file that
    computes its names): which file, and what to set; None for any other error."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if location is None or not isinstance(error, KeyError) or not error.args or not isinstance(error.args[0], str) \
            or not frames or not frames[-1].filename.endswith(os.path.join("alembic", "script", "revision.py")):
        return None
    return _no_such_down_revision(location, error.args[0])


def _no_such_down_revision(location: Path, missing: str) -> str:
    """Which files under ``location``'s versions/ name ``down_revision`` ``missing``, which no revision there is, and
    what to set."""
    versions = location / "versions"
    naming = [str(path) for path in sorted(versions.glob("*.py"))
              if re.search(rf"down_revision\b.*['\"]{re.escape(missing)}['\"]", path.read_text(errors="replace"))]
    return (f"{' and '.join(naming) or 'a revision under ' + str(versions)} names down_revision {missing!r}, which no "
            f"revision under {versions} is: set it to the revision before it (None for the first), or restore the "
            f"file of {missing!r}")


def _missing_down_revisions(location: Path) -> list[str]:
    """The names a ``down_revision`` under ``location``'s versions/ gives that no revision there is, read from the
    files' literal ``revision`` and ``down_revision`` assignments (:func:`_literal_revisions`).  Asked before Alembic
    maps the revisions: Alembic warns of such a name (a ``UserWarning``) and then raises a bare ``KeyError``, and
    hiding the warning would change the process's warning filters, which no thread can do for itself alone.  Empty
    when the files cannot tell: then Alembic's own mapping is the check (:func:`_dangling_down_revision` names the
    file)."""
    revisions = _literal_revisions(location) or []
    named = {name for _, _, downs in revisions for name in downs}
    return sorted(named - {revision for _, revision, _ in revisions})


def _duplicate_revisions(location: Path) -> str | None:
    """What to say of two or more files under ``location``'s versions/ that give one ``revision`` id (a file copied to
    start the next, its id left as it was), read as :func:`_literal_revisions` reads them: Alembic keeps one of them,
    warning, and the other's revisions then look like a second head; None when no id repeats (or the files cannot
    tell)."""
    files: dict[str, list[Path]] = {}
    for path, revision, _ in _literal_revisions(location) or []:
        files.setdefault(revision, []).append(path)
    repeated = [(revision, paths) for revision, paths in files.items() if len(paths) > 1]
    if not repeated:
        return None
    return "; ".join(f"{' and '.join(map(str, paths))} are {'both' if len(paths) == 2 else 'all'} revision "
                     f"{revision!r}" for revision, paths in repeated) + \
        (": one revision id is one file's. Keep the file that is that revision, and give the later one an id of its "
         "own (its `revision = …`, and the `down_revision` of a file that follows it)")


def _literal_revisions(location: Path) -> list[tuple[Path, str, tuple[str, ...]]] | None:
    """Each revision file under ``location``'s versions/ as ``(file, revision, down_revisions)``, read from its literal
    ``revision`` and ``down_revision`` assignments without running it; None when the files cannot tell — a
    ``revision`` or ``down_revision`` that is computed, a file that does not parse, versions kept elsewhere
    (``version_locations`` or ``recursive_version_locations`` in an ``alembic.ini``)."""
    config = _config(location)
    if config.get_main_option("version_locations") or config.get_main_option("recursive_version_locations"):
        return None
    found: list[tuple[Path, str, tuple[str, ...]]] = []
    for path in sorted((location / "versions").glob("*.py")):
        if path.name.startswith((".#", "__init__")):         # (as Alembic skips them)
            continue
        try:
            tree = ast.parse(path.read_text(errors="replace"), str(path))
        except (SyntaxError, ValueError):
            return None
        values: dict[str, object] = {}
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AnnAssign) and node.value is not None else None
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(target, ast.Name) and target.id in ("revision", "down_revision") and value is not None:
                try:
                    values[target.id] = ast.literal_eval(value)
                except ValueError:
                    return None
        revision, down = values.get("revision"), values.get("down_revision")
        if not isinstance(revision, str):
            return None
        downs = down if isinstance(down, (tuple, list)) else () if down is None else (down,)
        if not all(isinstance(name, str) for name in downs):
            return None
        found.append((path, revision, tuple(downs)))
    return found


def _raised_in(error: BaseException, location: Path | None) -> str:
    """`` at FILE:LINE``: the innermost line of ``error``'s traceback in a revision of ``location`` (its
    ``versions/``), or in its ``env.py`` if the error was raised right there (not by Alembic below the env's
    ``run_env`` call: an unknown or ambiguous revision is no line's fault); else ``""``."""
    if location is None:
        return ""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    versions = str((location / "versions").resolve()) + os.sep
    lines = [frame for frame in frames if os.path.realpath(frame.filename).startswith(versions)]
    if not lines and frames and os.path.realpath(frames[-1].filename) == os.path.realpath(location / "env.py"):
        lines = frames[-1:]
    return f" at {lines[-1].filename}:{lines[-1].lineno}" if lines else ""


def offline_sql(url: str, action: str, revision: str, script_location: Path | None = None) -> str:
    """The SQL an upgrade/downgrade of ``script_location`` (activedb's own by default; an application's, as
    :func:`app_location` checked it) would run, without touching the database (Alembic's offline mode): an upgrade
    without a range (``FROM:TO``) starts from base; a downgrade without one is a :class:`MigrationError`, as Alembic's
    ("downgrade with --sql requires <fromrev>:<torev>") — offline, the revision the database is at is not known."""
    if action == "downgrade" and ":" not in revision:
        where = "db" if script_location is None else "app"
        path = "" if script_location is None else f" {script_location}"
        raise MigrationError(f"downgrade {revision} --sql: offline mode reads no database, so the revision it goes down "
                             f"from is not known: give it, `activedb {where} downgrade{path} FROM:TO --sql` (`activedb "
                             f"{where} current{path}` says the one the database is at); nothing was printed")
    buffer = io.StringIO()
    location = script_location or migrations.SCRIPT_LOCATION
    config = _config(location, url=url)
    config.output_buffer = buffer
    with _failing_as(f"the SQL of {action} {revision} in {location}", script_location), _ENVIRONMENT_MUTEX, \
            redirect_stdout(buffer):
        getattr(command, action)(config, revision, sql=True)
    return buffer.getvalue()


#: A statement of a revision's SQL that creates or drops a table (``offline_sql``'s text).
_TABLE_DDL = re.compile(r'\b(CREATE|DROP) TABLE (?:IF (?:NOT )?EXISTS )?"?(\w+)"?', re.IGNORECASE)


@functools.lru_cache(maxsize=None)
def created_tables(revision: str) -> tuple[str, ...]:
    """activedb's own tables once its revisions up to ``revision`` ran, in the order they were created: read from the
    SQL the revisions run (:func:`offline_sql`, no database), so a new revision's tables are in without a list to
    keep — each table created and not dropped since; the version table left out.  :class:`MigrationError` for a
    revision this activedb does not know."""
    check_revision(revision)
    tables: dict[str, None] = {}
    for statement, table in _TABLE_DDL.findall(offline_sql("postgresql+psycopg://", "upgrade", revision)):
        if statement.upper() == "DROP":
            tables.pop(table, None)
        elif table != migrations.VERSION_TABLE:
            tables[table] = None
    return tuple(tables)


def current(engine: Engine) -> str | None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": migrations.VERSION_TABLE})
        heads = context.get_current_heads()
    return heads[0] if heads else None


def head() -> str:
    script = ScriptDirectory.from_config(_config(migrations.SCRIPT_LOCATION))
    return script.get_current_head()  # type: ignore[return-value]  # (one head: activedb's chain is linear)


def history(script_location: Path | None = None) -> list[tuple[str, str]]:
    """The revisions of ``script_location``'s chain (activedb's own by default), newest first: each one's id and what
    it is (``_gist`` of its file's docstring; empty without one).  :class:`MigrationError` naming the file if one does
    not load."""
    location = script_location or migrations.SCRIPT_LOCATION
    with _failing_as(f"reading the revisions in {location}"):
        script = ScriptDirectory.from_config(_config(location))
        return [(step.revision, _gist(str(step.doc or ""), labelled=location != migrations.SCRIPT_LOCATION))
                for step in script.walk_revisions()]


def _gist(doc: str, labelled: bool = False) -> str:
    """A revision's docstring in a line: its first sentence, the part before its colon if it has one (``Capture's
    trust model: …``) — or, ``labelled`` (an application's, ``bank: who owns an account``), the part after a
    one-word label —, cut at a word to 100 characters with an ellipsis."""
    sentence = " ".join(doc.strip().split("\n\n")[0].split()).split(". ")[0]
    label, colon, rest = sentence.partition(": ")
    gist = (rest if labelled and colon and " " not in label else sentence if labelled else label).rstrip(".")
    if len(gist) <= 100:
        return gist
    return gist[:100].rsplit(" ", 1)[0].rstrip(",;") + " …"


def has_revision(location: Path, revision: str) -> bool:
    """Whether a file under ``location``'s versions/ is ``revision`` (the tables may be at one whose file is gone)."""
    try:
        ScriptDirectory.from_config(_config(location)).get_revision(revision)
    except Exception:
        return False
    return True


def lost_revision(location: Path) -> str:
    """What tables at a revision no file under ``location``'s versions/ has are told (see :func:`has_revision`)."""
    return f"a revision no file under {location / 'versions'} has: restore its file, or give the directory that has it"


def no_revision(path: str | Path) -> str:
    """What an Alembic directory without revisions (its head None) is, and what to do (``app current``, ``app
    upgrade``, ``upgrade_app``)."""
    return f"no revision yet: add one under {Path(path) / 'versions'}"


def check_revision(revision: str, script_location: Path | None = None) -> None:
    """Raise :class:`MigrationError` naming the revisions there are if ``revision`` is none of ``script_location``'s
    (activedb's own by default); a relative one (``-1``, ``head-1``, ``+2``) is left to Alembic."""
    named = isinstance(revision, str) and revision.strip() != ""
    if named and (revision in ("head", "heads", "base") or "-" in revision or "+" in revision or ":" in revision):
        return
    location = script_location or migrations.SCRIPT_LOCATION
    # (a revision file that does not load fails the walk below too: a MigrationError naming the file)
    with _failing_as(f"reading the revisions in {location}"):
        script = ScriptDirectory.from_config(_config(location))
        try:
            if not named:           # (None, a number: no text to look up; '': Alembic's error says nothing)
                raise ValueError(f"{revision!r} is no revision")
            script.get_revisions(revision)
        except Exception as error:        # (alembic's CommandError: unknown, or a prefix of several)
            names = [script.revision for script in script.walk_revisions()][::-1]
            raise MigrationError(f"{error}: give one of base, {', '.join(names)} (head), or a relative one "
                                 f"(-1)") from None


def check_stamp(revision: str, script_location: Path | None = None) -> None:
    """Raise :class:`MigrationError` if ``revision`` is not one a stamp of activedb's tables (or of the application's
    in ``script_location``) takes: a revision there by its name (:func:`check_revision` names them), head or base —
    not a relative one or a range, relative to a revision the tables may not be known to be at."""
    if isinstance(revision, str) and revision not in ("head", "base") and any(mark in revision for mark in "-+:"):
        listed = "db history" if script_location is None else f"app history {script_location}"
        raise MigrationError(f"stamp {revision!r}: give a revision by its name (`activedb {listed}` lists them), "
                             f"head or base, not a relative one or a range; nothing was changed")
    check_revision(revision, script_location)


def _revision(script: ScriptDirectory, revision: str) -> "Script | None":
    """``script.get_revision(revision)``, typed as what it returns: None for an id that names no revision (Alembic
    annotates a Script)."""
    return script.get_revision(revision)


def passed(revision: str, current: str | None) -> str | None:
    """``revision``'s full id (``base`` for base) if a database at ``current`` is already past it — a revision below
    ``current`` in activedb's chain, where an upgrade to it changes nothing (an Alembic no-op); else None, also for
    head, a relative revision and one Alembic does not know (left to it)."""
    if current is None or revision in ("head", "heads") or "-" in revision or "+" in revision or ":" in revision:
        return None
    if revision == "base":
        return "base"
    try:
        script = ScriptDirectory.from_config(_config(migrations.SCRIPT_LOCATION))
        target = _revision(script, revision)
        below = {step.revision for step in script.iterate_revisions(current, "base")}
    except Exception:       # (alembic's errors: unknown, ambiguous; the caller's upgrade reports them)
        return None
    if target is None or target.revision == current or target.revision not in below:
        return None
    return target.revision


def ahead(revision: str, current: str, script_location: Path | None = None) -> str | None:
    """``revision``'s full id if a database at ``current`` has not reached it — ``current`` is below it in
    ``script_location``'s chain (activedb's own by default), so a downgrade to it cannot go there (Alembic: 'not a
    valid downgrade target'; head too); else None, also for base, a relative revision and one Alembic does not know."""
    if revision in ("heads", "base") or "-" in revision or "+" in revision or ":" in revision:
        return None
    try:
        script = ScriptDirectory.from_config(_config(script_location or migrations.SCRIPT_LOCATION))
        target = _revision(script, revision)
        if target is None:
            return None
        below = {step.revision for step in script.iterate_revisions(target.revision, "base")}
    except Exception:       # (alembic's errors: unknown, ambiguous; the caller's downgrade reports them)
        return None
    return target.revision if current != target.revision and current in below else None


def at(revision: str, current: str, script_location: Path | None = None) -> bool:
    """Whether ``revision`` names ``current`` itself in ``script_location``'s chain (activedb's own by default): its
    id, a prefix of it, or head when ``current`` is the head — where a downgrade to it drops nothing (Alembic's
    no-op); False for base, a relative revision and one Alembic does not know (left to the caller's downgrade)."""
    if revision == "base" or "-" in revision or "+" in revision or ":" in revision:
        return False
    try:
        script = ScriptDirectory.from_config(_config(script_location or migrations.SCRIPT_LOCATION))
        target = _revision(script, "head" if revision == "heads" else revision)
    except Exception:
        return False
    return target is not None and target.revision == current


def steps_below(revision: str, current: str, script_location: Path | None = None) -> str | None:
    """The revision a relative ``revision`` ``-N`` names from ``current`` in ``script_location``'s chain (activedb's
    own by default): N revisions below it, ``base`` one past the first; None for any other revision, one the chain
    does not reach, or an error of Alembic's (the caller's downgrade reports it)."""
    if not (revision.startswith("-") and revision[1:].isdigit()):
        return None
    try:
        script = ScriptDirectory.from_config(_config(script_location or migrations.SCRIPT_LOCATION))
        chain = [step.revision for step in script.iterate_revisions(current, "base")] + ["base"]
    except Exception:
        return None
    steps = int(revision[1:])
    return chain[steps] if steps < len(chain) else None


def _relative(revision: str) -> int | None:
    """The signed N of a relative ``revision`` ``+N`` or ``-N``; None for any other revision."""
    return int(revision) if revision[:1] in ("+", "-") and revision[1:].isdigit() else None


def _above(current: str | None, script_location: Path | None) -> list[str] | None:
    """The revisions above ``current`` (None: base) up to the head of ``script_location``'s chain, head first; None
    for a directory of several heads or none, or an error of Alembic's (the caller's run reports it)."""
    try:
        script = ScriptDirectory.from_config(_config(script_location or migrations.SCRIPT_LOCATION))
        heads = script.get_heads()
        if len(heads) != 1:
            return None
        return [step.revision for step in script.iterate_revisions(heads[0], current or "base")
                if step.revision != current]
    except Exception:
        return None


def at_end(revision: str, current: str | None, script_location: Path | None = None) -> str | None:
    """``"head"`` if a relative ``revision`` ``+N`` goes up from ``current``, already the head of ``script_location``'s
    chain (activedb's own by default), ``"base"`` if ``-N`` goes down from base (``current`` None): where Alembic's run
    fails with "Relative revision … didn't produce N migrations", a step that changes nothing, said so by the command;
    None for any other revision or database."""
    steps = _relative(revision)
    if steps is not None and steps < 0 and current is None:
        return "base"
    if steps is not None and steps > 0 and current is not None and _above(current, script_location) == []:
        return "head"
    return None


def past_end(revision: str, current: str | None, listed: str, script_location: Path | None = None) -> MigrationError | None:
    """The refusal of a run to a relative ``revision`` from ``current`` that goes past an end of
    ``script_location``'s chain (activedb's own by default), before anything is asked or run: ``-N`` past base (a
    downgrade: fewer than N revisions below it, :func:`steps_below` None, which the caller asked), ``+N`` past head
    (an upgrade: fewer than N above it; at head itself :func:`at_end` says so); None for any other revision.
    ``listed``: where the revisions are listed (a command, a directory)."""
    steps = _relative(revision)
    if steps is not None and steps < 0 and current is not None and steps_below(revision, current,
                                                                                script_location) is None:
        return MigrationError(f"downgrade {revision} goes past base: {current} has fewer revisions below it ({listed} "
                              f"lists them); give one of those, or base (every table, with its rows); nothing was "
                              f"changed")
    above = _above(current, script_location) if steps is not None and steps > 0 else None
    if steps is None or above is None or steps <= len(above):
        return None
    return MigrationError(f"upgrade {revision} goes past head: {current or 'base'} has {len(above)} revision"
                          f"{'' if len(above) == 1 else 's'} above it ({listed} lists them); give one of those, or "
                          f"head; nothing was changed")


def app_location(script_location: str | Path) -> Path:
    """``script_location`` checked to be an Alembic directory (``env.py`` and ``versions/``) whose revisions' literal
    ids are each one file's (:func:`_duplicate_revisions`) and whose ``down_revision`` names are all revisions there
    (:func:`_missing_down_revisions`)."""
    if not isinstance(script_location, (str, os.PathLike)):
        raise MigrationError(f"an application's Alembic directory is a path (a str or a Path), got "
                             f"{script_location!r}")
    location = Path(script_location)
    if not (location / "env.py").is_file():
        where = location.resolve()
        raise MigrationError(
            f"no Alembic environment at {str(script_location)!r} ({where}{' does not exist' if not location.exists() else ' has no env.py'}); "
            f"an application keeps its tables in its own Alembic directory: create one with "
            f"`activedb app init {script_location}` and add a revision under its versions/")
    repeated = _duplicate_revisions(location)
    if repeated is not None:
        raise MigrationError(f"the revisions under {location / 'versions'} do not chain: {repeated}; nothing was "
                             f"changed")
    missing = _missing_down_revisions(location)
    if missing:
        raise MigrationError(f"the revisions under {location / 'versions'} do not chain: "
                             f"{'; '.join(_no_such_down_revision(location, name) for name in missing)}; nothing was "
                             f"changed")
    return location


class _Granularities(Protocol):
    """Where a table's lock granularity is kept (the transaction manager's ``locking``)."""

    def set_granularity(self, table: str, granularity: Granularity) -> None: ...


class Schema:
    """A database's tables as ``db.schema``: the reflected ones (``catalog``), how each is locked, and the
    Alembic revisions of activedb and of the application.  Every migration run here refreshes the catalog."""

    def __init__(self, engine: Engine, catalog: Catalog, locking: _Granularities) -> None:
        self.engine, self.catalog, self._locking = engine, catalog, locking

    def refresh(self) -> None:
        """Forget reflected tables (after running migrations in the same process some other way, or in another
        process: a column added there is :class:`~activedb.errors.UnknownColumn` here until then)."""
        self.catalog.refresh()

    def set_granularity(self, table: str | sa.Table, granularity: Granularity) -> None:
        """Lock ``table`` (a name or a sqlalchemy ``Table``) per row (``Granularity.TUPLE``, the default) or as a whole
        (``Granularity.TABLE``)."""
        name = self.catalog.table(table).name   # validates the name; a Table by its name, as every lookup is
        self._locking.set_granularity(name, granularity)

    def _run(self, action: str, revision: str, location: Path, lock_timeout: float | None) -> None:
        check_revision(revision, location)
        if lock_timeout is not None and (isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float))
                                         or not lock_timeout > 0):
            raise MigrationError(f"lock_timeout={lock_timeout!r}: give a number of seconds above 0 (an int or a "
                                 f"float), or None to wait for locks as long as it takes (the command line's "
                                 f"--lock-timeout 0); nothing was changed")
        blockers: _Blockers | None = None
        config: Config | None = None
        own = location == migrations.SCRIPT_LOCATION
        try:
            with _failing_as(f"{action} to {revision!r}", location), self.engine.begin() as connection:
                # Held until this transaction ends (Alembic runs inside it: the connection is passed).  The lock
                # timeout only after it: a run waits its turn behind another process's as long as that takes.
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
                with contextlib.ExitStack() as watch:
                    watch.enter_context(_ENVIRONMENT_MUTEX)
                    if lock_timeout is not None:
                        pid = connection.execute(sa.text("SELECT pg_backend_pid(), set_config('lock_timeout', :ms, "
                                                         "true)"), {"ms": f"{max(1, round(lock_timeout * 1000))}ms"}
                                                 ).scalar_one()
                        blockers = watch.enter_context(_Blockers(self.engine, pid, min(0.5, lock_timeout / 4)))
                    config = _config(location, connection)
                    if not own:     # (an env.py that never runs its revisions, or would run them on activedb's table)
                        _recorded_heads(config, ScriptDirectory.from_config(config), location)
                    if action == "stamp":       # (purge: the row there was goes, even one no file here has)
                        command.stamp(config, revision, purge=True)
                    else:
                        getattr(command, action)(config, revision)
                    # (In the run's transaction: a version table not reached rolls back what the env.py did.)
                    unreached = None if own else _unreached(action, revision, config, location)
                    if unreached is not None:
                        raise MigrationError(f"{action} to {revision!r} failed: {unreached}; nothing was changed")
        except MigrationError as error:
            if config is not None and not own and _connection_unused(config, location):
                raise MigrationError(f"{error}{_connection_unused(config, location)}") from error.__cause__
            cause = error.__cause__
            if blockers is not None and cause is not None and sqlstate_of(cause) == LOCK_NOT_AVAILABLE:
                held = "; ".join(blockers.seen) or "another backend (pg_locks and pg_stat_activity say which)"
                error = MigrationError(
                    f"{action} to {revision!r} stopped at its lock timeout: it waited {lock_timeout:g} s for a lock "
                    f"on a table it changes, held by {held}; nothing was changed (the run is one transaction, rolled "
                    f"back). Let that transaction end — commit or roll it back, stop the application while it "
                    f"migrates, or end the backend (SELECT pg_terminate_backend(pid)) — and run it again, or wait "
                    f"longer: --lock-timeout SECONDS (lock_timeout= from a program)")
                error.__cause__ = cause
            # Where the tables are now (the run is one transaction, rolled back: where they were before it).
            try:
                heads = [current(self.engine)] if own else self.app_revision(location)[0]
            except Exception:
                raise error from error.__cause__
            gone = [] if own else [revision for revision in heads if revision and not has_revision(location, revision)]
            restore = f", {lost_revision(location)}" if gone else ""
            missing = own_table_missing(error.__cause__) if own and error.__cause__ is not None else None
            restore += f". {missing}" if missing else ""
            raise MigrationError(f"{error}; {'activedb' if own else 'the application'}'s tables are at "
                                 f"{', '.join(filter(None, heads)) or 'base'} now{restore}") from error.__cause__
        self.refresh()

    def upgrade(self, revision: str = "head", *, lock_timeout: float | None = LOCK_TIMEOUT_SECONDS) -> None:
        """Bring activedb's own schema to ``revision``; :class:`SchemaNotAtHead` if it is at a revision this
        installation does not know.  ``lock_timeout``: seconds a statement waits for a table's lock (held by an
        application's transaction) before the run stops, nothing changed (:class:`MigrationError` naming the
        blocking backends); None: as long as it takes.  To ``head`` when the version table says the schema is there
        already, it returns without taking ``MIGRATION_LOCK``: another process's long migration does not hold up
        ``connect()`` of a database at head (one behind takes its turn, and the run finds the revision the turn
        before it reached)."""
        if revision == "head" and self._at_head():
            self.refresh()
            return
        try:
            self._run("upgrade", revision, migrations.SCRIPT_LOCATION, lock_timeout)
        except MigrationError as error:
            try:        # (only on failure: nothing asked on the way to success)
                state, current_revision = self.state()
            except Exception:
                raise error
            if state is SchemaState.UNRECORDED:
                raise not_at_head(state, None, describe_url(self.engine.url)) from error
            if state is SchemaState.UNKNOWN:
                raise SchemaNotAtHead(
                    f"activedb's tables are at revision {current_revision}, which this installation does not know "
                    f"(a newer activedb wrote it); upgrade activedb (its head is {head()})") from error
            raise

    def _at_head(self, location: Path = migrations.SCRIPT_LOCATION) -> bool:
        """Whether the version table says the tables of ``location`` (activedb's own, or an application's
        directory) are at head — an application's at every head of its directory (none in one without revisions);
        False when it cannot be read (a role not granted it, the server gone, an env.py refused or failing): the run
        under ``MIGRATION_LOCK`` then reads it again and says what is wrong, as before this was asked."""
        try:
            if location == migrations.SCRIPT_LOCATION:
                return self.state()[0] is SchemaState.AT_HEAD
            current_revisions, heads = self.app_heads(location)
        except (sa.exc.DBAPIError, MigrationError):
            return False
        return current_revisions == heads      # (both sorted)

    def downgrade(self, revision: str, *, lock_timeout: float | None = LOCK_TIMEOUT_SECONDS) -> None:
        """Take activedb's own schema down to ``revision`` (``lock_timeout``: as ``upgrade``'s); :class:`SchemaNotAtHead`,
        nothing run, if it is at a revision this installation does not know (:func:`unknown_to_downgrade`) or its
        tables have no version table (UNRECORDED: Alembic would record base for them)."""
        state, current_revision = self.state()
        if state is SchemaState.UNKNOWN:
            raise unknown_to_downgrade(current_revision)
        if state is SchemaState.UNRECORDED:
            raise not_at_head(state, None, describe_url(self.engine.url))
        self._run("downgrade", revision, migrations.SCRIPT_LOCATION, lock_timeout)

    def stamp(self, revision: str, *, lock_timeout: float | None = LOCK_TIMEOUT_SECONDS) -> None:
        """Record ``revision`` (a name, ``head`` or ``base``) as the one activedb's tables are at, running no revision
        (Alembic's ``stamp``; the version row there was, if any, replaced — also a revision this activedb does not
        know): for tables whose version table is gone (:attr:`SchemaState.UNRECORDED`), whose revision the user knows.
        Under ``MIGRATION_LOCK``, as an upgrade; :class:`MigrationError` naming the revisions there are for one that
        is none of them, or for a relative one (``-1``: relative to a revision not known)."""
        check_stamp(revision)
        self._run("stamp", revision, migrations.SCRIPT_LOCATION, lock_timeout)

    def current_revision(self) -> str | None:
        return current(self.engine)

    def state(self) -> tuple[SchemaState, str | None]:
        """``(SchemaState, current revision)`` of activedb's own schema: NEW (never initialised), AT_HEAD,
        BEHIND (an older revision, or downgraded to base), UNKNOWN, or UNRECORDED (activedb's tables without the
        version table; the revision None).  One query of the version table (``connect`` asks it of every database it
        does not upgrade), and one of the first revision's tables when the version table does not exist."""
        with self.engine.connect() as connection:
            try:
                revisions = connection.execute(sa.text(f"SELECT version_num FROM {migrations.VERSION_TABLE}")).all()
            except sa.exc.ProgrammingError as error:
                if sqlstate_of(error) != UNDEFINED_TABLE:
                    raise
                connection.rollback()
                found = connection.execute(sa.text("SELECT bool_or(to_regclass(name) IS NOT NULL) FROM "
                                                   "unnest(CAST(:names AS text[])) AS name"),
                                           {"names": list(_FIRST_TABLES)}).scalar_one()
                return (SchemaState.UNRECORDED if found else SchemaState.NEW), None
        revision = revisions[0][0] if revisions else None      # (one row at most: activedb's chain is linear)
        if revision == head():
            return SchemaState.AT_HEAD, revision
        if revision is None:
            return SchemaState.BEHIND, None
        if not has_revision(migrations.SCRIPT_LOCATION, revision):
            return SchemaState.UNKNOWN, revision
        return SchemaState.BEHIND, revision

    def missing_tables(self) -> list[str]:
        """The tables of activedb's that the revision recorded in the version table has (:func:`created_tables`: every
        table its chain of revisions creates) and that do not exist, in the order they were created: each was dropped
        by hand or left out of a restore — the version table is then not to be trusted.  At a revision this activedb
        does not know, the first revision's tables (no revision drops them); none with no revision recorded.  Two
        queries."""
        revision = self.current_revision()
        if revision is None:
            return []
        try:
            expected: Sequence[str] = created_tables(revision)
        except MigrationError:      # (a newer activedb's revision)
            expected = _FIRST_TABLES
        with self.engine.connect() as connection:
            found = connection.execute(sa.text("SELECT name FROM unnest(CAST(:names AS text[])) AS name "
                                               "WHERE to_regclass(name) IS NULL"), {"names": list(expected)})
            missing = set(found.scalars())
        return [name for name in expected if name in missing]

    def stamp_app(self, script_location: str | Path, revision: str, *,
                  lock_timeout: float | None = LOCK_TIMEOUT_SECONDS) -> None:
        """Record ``revision`` (a name, ``head`` or ``base``) as the one the application's tables are at, running no
        revision (Alembic's ``stamp``; the version rows there were replaced): for tables that exist already — made
        before the application kept its schema in Alembic, by hand, or restored without their version table — once
        a revision says what they are.  Under ``MIGRATION_LOCK`` and ``lock_timeout``, as an upgrade."""
        location = app_location(script_location)
        check_stamp(revision, location)
        self._run("stamp", revision, location, lock_timeout)

    def upgrade_app(self, script_location: str | Path, revision: str = "head", *,
                    lock_timeout: float | None = LOCK_TIMEOUT_SECONDS) -> None:
        """Run the application's own Alembic environment on this database (its env.py decides the version
        table).  To ``head`` in a directory of several heads (branches not merged): :class:`MigrationError` saying
        to merge them or to upgrade to ``"heads"`` (every branch, as Alembic does).  To ``head`` (or ``heads``) in a
        directory without revisions: it returns, as ``alembic upgrade head`` does, and logs at INFO (logger
        ``activedb.migrate``) that there is no revision yet and where to add one.  ``lock_timeout``: as
        ``upgrade``'s.  To ``head`` (``heads``) when the application's version table says its tables are there
        already, it returns without taking ``MIGRATION_LOCK``, as ``upgrade`` does."""
        location = app_location(script_location)
        heads: list[str] | None = None
        if revision in ("head", "heads"):
            with _failing_as(f"reading the revisions in {location}", location):
                heads = sorted(ScriptDirectory.from_config(_config(location)).get_heads())
            if revision == "head" and len(heads) > 1:
                raise MigrationError(f"upgrade to 'head' refused: {several_heads(str(script_location), heads)}; "
                                     f"nothing was changed")
        if heads is not None and self._at_head(location):       # (no turn taken behind another process's migration)
            self.refresh()
        else:
            self._refuse_past_end(revision, location, upward=True)
            self._run("upgrade", revision, location, lock_timeout)
        if heads == []:
            logger.info("upgrade of %s to %r ran nothing: %s", script_location, revision, no_revision(script_location))

    def downgrade_app(self, script_location: str | Path, revision: str, *,
                      lock_timeout: float | None = LOCK_TIMEOUT_SECONDS) -> None:
        """Downgrade the application's own migrations to ``revision`` (``"base"`` drops its tables;
        ``lock_timeout``: as ``upgrade``'s).  A relative ``-N`` past base is :class:`MigrationError` saying where the
        tables are, nothing run (as a relative ``+N`` past head of ``upgrade_app``)."""
        location = app_location(script_location)
        self._refuse_past_end(revision, location, upward=False)
        self._run("downgrade", revision, location, lock_timeout)

    def _refuse_past_end(self, revision: str, location: Path, *, upward: bool) -> None:
        """Raise :class:`MigrationError` if ``revision``, relative (``+N`` ``upward``, ``-N`` not), goes past an end
        of ``location``'s chain from the revision the application's tables are at (:func:`past_end`; from head or
        base itself, saying they are there): Alembic's own error says only that it "didn't produce N migrations".
        Asks the database only for such a revision; a directory of branches is left to Alembic."""
        steps = _relative(revision) if isinstance(revision, str) else None
        if steps is None or (steps > 0) != upward:
            return
        current, _ = self.app_heads(location)
        if len(current) > 1:
            return
        at_revision = current[0] if current else None
        end = at_end(revision, at_revision, location)
        if end is not None:
            raise MigrationError(f"{'upgrade' if upward else 'downgrade'} {revision} goes past {end}: the tables "
                                 f"are at {end}{f' ({at_revision})' if at_revision else ''} already; nothing was "
                                 f"changed")
        refused = past_end(revision, at_revision, f"{location / 'versions'}", location)
        if refused is not None:
            raise refused

    def app_revision(self, script_location: str | Path) -> tuple[list[str], str | None]:
        """``(current revisions, head revision)`` of the application's Alembic directory on this database; the
        version table is the one its ``env.py`` configures, so the environment is run (changing nothing).  A
        directory of several heads (branches not merged) is :class:`MigrationError` saying to merge them
        (``app_heads`` gives them all)."""
        current_revisions, heads = self.app_heads(script_location)
        if len(heads) > 1:
            raise MigrationError(f"reading the revision of {str(script_location)!r} failed: "
                                 f"{several_heads(str(script_location), heads)}")
        return current_revisions, heads[0] if heads else None

    def app_heads(self, script_location: str | Path) -> tuple[list[str], list[str]]:
        """``(current revisions, head revisions)`` of the application's Alembic directory on this database: as
        ``app_revision``, with every head of the directory (sorted; several where two revisions have the same
        ``down_revision``, none without revisions)."""
        location = app_location(script_location)
        config: Config | None = None
        try:
            with _failing_as(f"reading the revision of {str(script_location)!r}"), \
                    self.engine.connect() as connection:
                config = _config(location, connection)
                script = ScriptDirectory.from_config(config)
                return _recorded_heads(config, script, location), sorted(script.get_heads())
        except MigrationError as error:
            unused = _connection_unused(config, location) if config is not None else ""
            if not unused:
                raise
            raise MigrationError(f"{error}{unused}") from error.__cause__


def _recorded_heads(config: Config, script: ScriptDirectory, location: Path) -> list[str]:
    """The revisions (sorted) the version table of ``location``'s env.py records, on the connection of ``config``,
    read by running the env.py (changing nothing); :class:`MigrationError` if it never calls
    ``context.run_migrations()`` — then it never runs a revision either —, or if its version table is activedb's own
    (:func:`_borrowed_version_table`)."""
    from alembic.runtime.environment import EnvironmentContext

    recorded: list[list[str]] = []
    passed = dict.get(config.attributes, "connection")     # (not through _Attributes.get: activedb's read, not env.py's)

    def record(revision: object, context: MigrationContext) -> Sequence[RevisionStep]:
        if isinstance(passed, sa.Connection) and not _same_connection(context.connection, passed):
            raise MigrationError(_own_connection(location))
        if _activedbs_version_table(context):
            raise MigrationError(_borrowed_version_table(location))
        recorded.append(list(context.get_current_heads()))
        return []

    with _ENVIRONMENT_MUTEX, EnvironmentContext(config, script, fn=record, dont_mutate=True):
        script.run_env()
    if not recorded:
        raise MigrationError(_never_ran(location))
    return sorted(recorded[-1])


def _same_connection(configured: sa.Connection | None, passed: sa.Connection) -> bool:
    """Whether the connection an env.py configured Alembic with is (a handle of the same session as) ``passed``."""
    if configured is None:
        return False
    try:
        return configured is passed or configured.connection.dbapi_connection is passed.connection.dbapi_connection
    except sa.exc.SQLAlchemyError:          # (a connection closed or invalidated: no session to compare)
        return False


def _own_connection(location: Path) -> str:
    """What an application's env.py that configures Alembic with a connection it made itself is told."""
    return (f"{location / 'env.py'} configures Alembic with a connection of its own, not the one activedb passes "
            f"(config.attributes[\"connection\"]): its revisions would run outside activedb's transaction — not "
            f"rolled back with it, nor under its migration lock and lock timeout —, on whatever database it connects "
            f"to. Have it run context.configure(connection=config.attributes[\"connection\"], …) when that is given, "
            f"as activedb.alembic_env.run_env does (the env.py `activedb app init` writes); nothing was run")


def _activedbs_version_table(context: MigrationContext) -> bool:
    """Whether the version table an application's env.py configured (``context``'s, online) is activedb's own: of
    its name, and in no schema named (then found as activedb's is, by the search_path) or in the schema activedb's
    is in — the one ``to_regclass`` finds it in, or where it would be made (``current_schema()``) when there is none
    yet.  One of that name in another schema is the application's own; without a connection to tell, it is not."""
    if context.version_table != migrations.VERSION_TABLE:
        return False
    if context.version_table_schema is None or context.connection is None:
        return True
    own_schema = context.connection.execute(
        sa.text("SELECT coalesce((SELECT nspname FROM pg_class JOIN pg_namespace ON pg_namespace.oid = relnamespace "
                "WHERE pg_class.oid = to_regclass(:table)), current_schema())"),
        {"table": migrations.VERSION_TABLE}).scalar_one()
    return bool(context.version_table_schema == own_schema)


def _borrowed_version_table(location: Path) -> str:
    """What an application's env.py that keeps its revisions in activedb's own version table is told."""
    return (f"{location / 'env.py'} keeps its revisions in {migrations.VERSION_TABLE}, activedb's own version table: "
            f"they would replace activedb's record of its own tables' revision (and `activedb db upgrade` would no "
            f"longer know where those are). Give the application a version table of its own, "
            f"run_env(version_table=\"NAME_alembic_version\") as `activedb app init` writes it; nothing was changed")


def _unreached(action: str, revision: str, config: Config, location: Path) -> str | None:
    """What to say of a run of ``action`` to ``revision`` in ``location`` (the application's) whose version table, as
    its env.py reads it on ``config``'s connection right after the run, is not where the run was to take it — its
    env.py ran no revision (:func:`_recorded_heads`), or ran them elsewhere; None when it is there, or when that is
    not known (a relative revision, a downgrade to head)."""
    script = ScriptDirectory.from_config(config)
    try:
        current = _recorded_heads(config, script, location)
    except MigrationError as error:
        return str(error)
    if revision in ("head", "heads") and action != "downgrade":
        expected: set[str] | None = set(script.get_heads())
    elif revision == "base":
        expected = set()
    else:
        expected = None
        if not any(mark in revision for mark in "-+:") and revision not in ("head", "heads"):
            try:        # (the run took the name: an error of Alembic's here would be one of the check's own)
                target = _revision(script, revision)
                below = {step.revision for head in current for step in script.iterate_revisions(head, "base")}
            except Exception:
                return None
            if target is not None and target.revision not in (below if action == "upgrade" else current):
                return _not_reached(location, revision, current)
    if expected is not None and set(current) != expected:
        return _not_reached(location, revision, current)
    return None


def _not_reached(location: Path, revision: str, current: Sequence[str]) -> str:
    return (f"{location / 'env.py'} ran, but its version table is at {', '.join(current) or 'base'}, not at "
            f"{revision}: the revisions ran on another connection or version table than the one it reads. Have it "
            f"run them on the connection activedb passes (config.attributes[\"connection\"]), as "
            f"activedb.alembic_env.run_env does")


def several_heads(path: str, heads: Sequence[str]) -> str:
    """What a directory of two or more heads is, and what to do (``app upgrade``, ``app_revision``)."""
    return (f"{path} has two or more heads ({', '.join(heads)}): revisions with the same down_revision, branches "
            f"not merged. Merge them with a revision whose down_revision is all of them (`activedb app revision "
            f"{path} --merge -m MESSAGE` writes one), then upgrade to head; or upgrade every branch as it is, to "
            f"'heads' (`activedb app upgrade {path} heads`, db.upgrade_app(path, 'heads'))")


APP_ENV = '''"""Alembic environment of {name}: its own version table, run by `activedb app upgrade` or
db.upgrade_app(path) (both pass their connection) or by the plain `alembic` tool."""
from activedb.alembic_env import run_env

run_env(version_table="{version_table}")
'''

APP_REVISION = '''"""{name}: first tables.

Revision ID: {revision}
Revises:
Create Date: {date}
"""
import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One table as an example: replace it with yours.
    op.create_table(
        "{name}_items",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("{name}_items")
'''


#: The longest name :func:`init_app` gives an application: its revision ids ``NAME_0001`` (and a branch's
#: ``NAME_0001b``) fit Alembic's version column, ``VARCHAR(32)``, and its tables ``NAME_alembic_version`` and
#: ``NAME_items`` PostgreSQL's identifiers (63 bytes; a longer one is cut, and no longer found by its name).
APP_NAME_LENGTH = 24

#: The longest revision id Alembic's version column holds (``alembic_version.version_num`` is ``VARCHAR(32)``).
REVISION_ID_LENGTH = 32


def _short_name(name: str) -> str:
    """``name`` (lower-case letters, digits and ``_``) if it has at most :data:`APP_NAME_LENGTH` characters; else
    its start and a short hash of the whole, that long: two long names alike at the start still differ."""
    if len(name) <= APP_NAME_LENGTH:
        return name
    import hashlib

    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:APP_NAME_LENGTH - len(digest) - 1].rstrip('_')}_{digest}"


def init_app(script_location: str | Path, name: str | None = None) -> list[Path]:
    """Create an application's Alembic directory: ``env.py`` (its own version table, ``NAME_alembic_version``),
    ``script.py.mako`` and a first revision in ``versions/`` with an example table.  ``NAME``: ``name``, or the
    directory's (not ``migrations`` or ``alembic``), in lower case, cut to :data:`APP_NAME_LENGTH` characters with
    a short hash of the whole when longer.  Refuses a directory
    that already has an ``env.py``, or any file it would write (nothing of the user's is overwritten).  Returns
    the files written."""
    import datetime

    location = Path(script_location)
    if (location / "env.py").exists():
        raise MigrationError(f"{str(script_location)!r} already has an env.py; nothing was written")
    if name is None:
        parts = [part for part in location.resolve().parts if part not in ("migrations", "alembic")]
        name = parts[-1] if parts else "app"
    name = _short_name(re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_") or "app")
    written = [location / "env.py", location / "script.py.mako", location / "versions" / "0001_first_tables.py"]
    existing = [str(path.relative_to(location)) for path in written[1:] if path.exists()]
    if existing:
        raise MigrationError(f"{str(script_location)!r} already has {' and '.join(existing)} (but no env.py); "
                             f"nothing was written: move them away, or choose another directory")
    try:
        (location / "versions").mkdir(parents=True, exist_ok=True)
        written[0].write_text(APP_ENV.format(name=name, version_table=f"{name}_alembic_version"))
        written[1].write_text((migrations.SCRIPT_LOCATION / "script.py.mako").read_text())
        written[2].write_text(APP_REVISION.format(name=name, revision=f"{name}_0001",
                                                  date=datetime.date.today().isoformat()))
    except OSError as error:
        raise MigrationError(f"cannot create the Alembic directory {script_location} ({error.strerror or error}: "
                             f"{error.filename}); choose another directory") from None
    return written


# A revision id numbered as ``init_app`` numbers them (bank_0002, a branch's bank_0002b, 0002), not Alembic's hex ids.
_NUMBERED = re.compile(r"(?P<prefix>(?:.*_)?)(?P<number>\d+)[a-z]?")
_VERSION_TABLE = re.compile(r"""version_table\s*=\s*["'](?P<name>\w+)_alembic_version["']""")


def new_app_revision(script_location: str | Path, message: str, *, merge: bool = False) -> tuple[Path, list[str]]:
    """Write an empty revision (``upgrade`` and ``downgrade`` to fill in) into the application's Alembic directory,
    from its ``script.py.mako``, as ``alembic revision -m MESSAGE`` does — and return its file and the revisions it
    follows.  Its id continues the numbering of the head's (``bank_0002`` after ``bank_0001`` or ``bank_0001b``, in
    ``0002_SLUG.py``, as :func:`init_app` names the first); after a head not so numbered (Alembic's hex ids) it gets
    Alembic's random id and file name.  The id has at most :data:`REVISION_ID_LENGTH` characters, what Alembic's
    version column holds: after a prefix too long for that, the number follows the prefix's short form (its start
    and a hash, as :func:`init_app` shortens a long name), and a number too long even then gets Alembic's id.  A
    directory of two or more heads is refused unless ``merge``: then the revision follows all of them (``alembic
    merge heads``).  The database is not read: the directory's files say where the chain ends."""
    location = app_location(script_location)
    if not isinstance(message, str) or not message.strip():
        raise MigrationError("a revision needs a message saying what it changes (-m 'add the owner column')")
    try:            # (the template writes it as the file's docstring: one that closes it makes no Python)
        compile(f'"""{message}"""', "<message>", "eval")
    except SyntaxError as error:
        raise MigrationError(f"the message {message!r} cannot be the revision's docstring ({error.msg}): leave out "
                             f"triple quotes and a trailing quote or backslash; nothing was written") from None
    if not (location / "script.py.mako").is_file():
        raise MigrationError(f"{location} has no script.py.mako, the template of a revision: copy one from a directory "
                             f"`activedb app init` made, or write the revision by hand; nothing was written")
    with _failing_as(f"writing a revision in {location}", location):
        config = _config(location)
        script = ScriptDirectory.from_config(config)
        heads = list(script.get_heads())
        if len(heads) > 1 and not merge:
            raise MigrationError(f"{several_heads(str(script_location), heads)}; nothing was written")
        # The highest numbering among the heads (one head, or the heads a merge follows); none: the name in env.py.
        numbered = max((found for head in heads if (found := _NUMBERED.fullmatch(head))),
                       key=lambda found: int(found["number"]), default=None)
        if numbered is not None:
            prefix, digits = numbered["prefix"], numbered["number"]
        else:
            named = _VERSION_TABLE.search((location / "env.py").read_text()) if not heads else None
            prefix, digits = (f"{named['name']}_", "0000") if named else ("", "")
        rev_id = None
        if digits:
            taken = {step.revision for step in script.walk_revisions()}
            number = int(digits) + 1
            if len(f"{prefix}{number:0{len(digits)}d}") > REVISION_ID_LENGTH and prefix.strip("_"):
                # A prefix too long to number on (a head written by hand, a long version table's name): its short
                # form, as init_app shortens a long name — the same for every revision after it.
                prefix = f"{_short_name(prefix.rstrip('_'))}_"
            while f"{prefix}{number:0{len(digits)}d}" in taken:      # (another branch may have taken the number)
                number += 1
            if len(f"{prefix}{number:0{len(digits)}d}") <= REVISION_ID_LENGTH:
                rev_id = f"{prefix}{number:0{len(digits)}d}"
                config.set_main_option("file_template", f"{number:0{len(digits)}d}_%%(slug)s")
            # (else Alembic's random id, 12 characters: a number too long to fit even after a short prefix)
        with redirect_stdout(io.StringIO()):          # (Alembic's "Generating …": the caller says what it wrote)
            written = (command.merge(config, "heads", message=message, rev_id=rev_id) if len(heads) > 1
                       else command.revision(config, message=message, rev_id=rev_id))
    assert written is not None and not isinstance(written, list)       # (one revision, no autogenerate)
    return location / "versions" / Path(written.path).name, heads
