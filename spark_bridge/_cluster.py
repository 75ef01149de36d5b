"""The scale-out path on a cluster: what the driver checks and ships before a scale-out query's tasks run on
executors that may live on other hosts — which masters are local, the refusal of a database URL the executors
cannot reach, the warning for a password in the URL, a task's connection failure and a failed job's Python cause,
an application file shipped to the executors (the package's ``README.md``, "Running on a cluster").

Nothing here imports pyspark at import time; :func:`shipped_app` runs in a Spark task.  ``_warned_mutex``
protects ``_warned`` (a leaf: nothing else is done while it is held).
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from activedb import mask_secrets

from spark_bridge.errors import IngestError, describe

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from activedb.cli.application import AppSpec

__all__ = ["check_database_for_executors", "connect_failed", "is_local_master", "ship_app", "shipped_app",
           "socket_only", "task_failure"]

_log = logging.getLogger(__name__)

_LOCAL_MASTER = re.compile(r"local(\[[^\]]*\])?")

_warned_mutex = threading.Lock()
_warned: set[str] = set()     # URLs (masked) whose password warning was logged; under _warned_mutex


def is_local_master(master: str) -> bool:
    """``True`` for ``local``, ``local[N]``, ``local[N,F]`` and ``local[*]``: the tasks' Python workers are
    children of this process's JVM, on this host.  ``local-cluster[…]``, ``spark://…``, ``yarn``,
    ``k8s://…`` start executors of their own."""
    return _LOCAL_MASTER.fullmatch(master.strip()) is not None


def socket_only(url: sa.URL) -> str | None:
    """How ``url`` reaches its server when only processes on this host can use that way — ``"the unix socket
    directory /x"``, or ``"no host (…)"`` — or ``None`` when it names a TCP host (or ``hostaddr``).

    libpq's rules: the URL's host, else its ``host`` query parameters (comma-separated lists allowed); a
    host that starts with ``/`` (or ``@``, Linux's abstract namespace) is a socket directory; no host at all
    means the default socket of the machine the connecting process runs on."""
    if url.query.get("hostaddr"):
        return None
    if url.host:
        hosts = [url.host]
    else:
        given = url.query.get("host") or ()
        hosts = [host for value in ((given,) if isinstance(given, str) else given)
                 for host in value.split(",") if host]
    if not hosts:
        return "no host (libpq then uses the default unix socket of the machine each process runs on)"
    sockets = [host for host in hosts if host.startswith(("/", "@"))]
    if len(sockets) == len(hosts):
        return f"the unix socket directory {sockets[0]}"
    return None


def check_database_for_executors(url: sa.URL, master: str) -> None:
    """Before a scale-out query starts on ``master``: raise :class:`IngestError` if its tasks, on executors
    of other hosts, could not reach the database of ``url``; log a warning (once per URL) if the URL holds
    a password, which then travels to the executors inside every task.  Nothing to check on a local
    master."""
    if is_local_master(master):
        return
    shown = mask_secrets(url.render_as_string(hide_password=True))
    where = socket_only(url)
    if where is not None:
        raise IngestError(
            f"the scale-out path (partition_by_key=N) on the Spark master {master} runs its tasks on the "
            f"cluster's executors, each connecting to PostgreSQL itself, but the database URL {shown} reaches "
            f"the server through {where}, which only processes on this host can use (activedb's embedded "
            f"default database listens on a unix socket only). Point activedb at a PostgreSQL server the "
            f"executors reach over TCP, e.g. postgresql+psycopg://USER@HOST:5432/DATABASE (activedb --url, or "
            f"ACTIVEDB_DATABASE_URL), or use a local master (local[N]); spark_bridge/README.md, \"Running on "
            f"a cluster\"")
    if url.password:
        with _warned_mutex:
            if shown in _warned:
                return
            _warned.add(shown)
        _log.warning(
            "the database URL %s holds a password: the scale-out tasks carry it to the executors on %s "
            "(pickled with every task). Leave it out of the URL and give the executors a password file "
            "(PGPASSFILE in the workers' environment) or spark.executorEnv.PGPASSWORD instead; "
            "spark_bridge/README.md, \"Running on a cluster\"", shown, master)


def connect_failed(url: str, error: BaseException) -> IngestError:
    """The error of a scale-out task whose ``activedb.connect(url)`` raised ``error``: which host, which
    server, PostgreSQL's reason and, for a missing or refused password, how executors get one.  The caller
    raises it ``from error`` (the cause chain keeps ``error``'s class for the failure's triage)."""
    shown = mask_secrets(sa.make_url(url).render_as_string(hide_password=True))
    reason = mask_secrets(describe(error))
    advice = ""
    if "password" in str(error).lower():
        advice = (" The executors need the database password: a password file in the workers' environment "
                  "(PGPASSFILE, mode 0600) or spark.executorEnv.PGPASSWORD; spark_bridge/README.md, \"Running on a "
                  "cluster\".")
    return IngestError(f"a scale-out task on host {socket.gethostname()} could not connect to {shown}: "
                       f"{reason}.{advice}")


def task_failure(error: BaseException) -> IngestError | None:
    """The error to raise on the driver for a scale-out job that failed with ``error`` because a task's Python
    raised (Spark retried the task, then gave up): the task's exception as its traceback's last lines name it
    (``module.Class: message``), or ``None`` when ``error`` holds no Python traceback (a dead worker, Spark's
    own failure)."""
    text = str(error)
    marker = "Traceback (most recent call last):"
    if marker not in text:
        return None
    lines = text.rsplit(marker, 1)[1].splitlines()
    raised = next((index for index, line in enumerate(lines) if line and not line[0].isspace()), None)
    if raised is None:
        return None
    cause = mask_secrets("\n".join(lines[raised:]).strip())
    missing = re.search(r"No module named '([^'.]+)", cause)
    if missing is not None:     # (their environment lacks a package: the driver's has it, or the task would not run)
        module = missing.group(1)
        why = ": the tasks take their rows as Arrow batches" if module == "pyarrow" else ""
        cause += (f"; the executors' Python environment needs {module}{why} (spark_bridge's README.md, \"Running on a "
                  f"cluster\")")
    return IngestError(f"a scale-out task failed on the executors (Spark gave up on it): {cause}")


def ship_app(session: SparkSession | None, app: AppSpec) -> bool:
    """On a cluster master, send an application given as a ``.py`` path to the executors
    (``SparkContext.addFile``); return whether it was sent (then the tasks load it with
    :func:`shipped_app`).  A module name or a callable is not sent: it must be importable on the executors
    (their Python environment; the README's "Running on a cluster")."""
    if session is None or is_local_master(str(session.sparkContext.master)):
        return False
    if not isinstance(app, (str, Path)) or not str(app).endswith(".py") or not Path(app).is_file():
        return False
    session.sparkContext.addFile(str(Path(app).resolve()))
    return True


def shipped_app(app: str) -> str:
    """In a Spark task: the path of this executor's copy of the application file the driver shipped as
    ``app`` (:func:`ship_app`)."""
    from pyspark import SparkFiles

    return SparkFiles.get(Path(app).name)
