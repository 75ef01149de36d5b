"""Build the SparkSession that ``spark_bridge`` runs on.

Public interface: :func:`get_spark` and, for inspection and tests, :func:`spark_conf` (the configuration
:func:`get_spark` would apply, as a plain dict, without starting Java).  The defaults, the fast
checkpoint log and ``warnings_to=``: the package's ``README.md`` ("The session").  pyspark is imported
inside :func:`get_spark` only; importing this module starts nothing.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from activedb.errors import BadArgument
from activedb.extras import Extra, require
from spark_bridge import _cluster, _java

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import SparkSession

_T = TypeVar("_T")

__all__ = ["FAST_CHECKPOINT_FILE_MANAGER", "get_spark", "spark_conf"]

#: Checkpoint file manager that writes through ``FileSystem`` (checked to exist in the
#: ``spark-sql_2.13-4.3.0.jar`` shipped with pyspark 4.3.0; Spark 4 moved it from
#: ``...execution.streaming`` to ``...execution.streaming.checkpointing``).
FAST_CHECKPOINT_FILE_MANAGER = ("org.apache.spark.sql.execution.streaming.checkpointing."
                                "FileSystemBasedCheckpointFileManager")
_CHECKPOINT_FILE_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"

_LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def spark_conf(app_name: str = "activedb", *, master: str = "local[2]", fast_checkpoints: bool = True,
               conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark configuration :func:`get_spark` applies, as ``{key: value}``.

    Entries of ``conf`` override the defaults, except ``spark.driver.extraJavaOptions``,
    to which the log configuration is appended rather than replaced.
    """
    settings: dict[str, str] = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        # Python workers (UDFs, mapInArrow) run the interpreter that runs us.
        "spark.pyspark.python": sys.executable,
    }
    if fast_checkpoints:
        settings[_CHECKPOINT_FILE_MANAGER_KEY] = FAST_CHECKPOINT_FILE_MANAGER
    user = dict(conf or {})
    java_options = user.pop("spark.driver.extraJavaOptions", "")
    settings.update({key: str(value) for key, value in user.items()})
    if _LOG4J_CONFIG.exists():
        java_options = f"{java_options} -Dlog4j2.configurationFile=file:{_LOG4J_CONFIG}".strip()
    if java_options:
        settings["spark.driver.extraJavaOptions"] = java_options
    return settings


def get_spark(app_name: str = "activedb", *, master: str = "local[2]", fast_checkpoints: bool = True,
              conf: Mapping[str, str] | None = None, warnings_to: str | Path | None = None,
              py_files: Sequence[str | Path] = ()) -> "SparkSession":
    """Return a SparkSession configured by :func:`spark_conf`, starting Java if needed.

    ``master``: ``local[N]`` (this machine), or a cluster's master URL (``spark://HOST:7077``, ``yarn``,
    ``k8s://…``; ``conf["spark.master"]`` wins over it) — what the executors then need: README.md,
    "Running on a cluster".  ``py_files``: ``.py``, ``.zip`` or ``.egg`` files the executors' Python
    workers import (``SparkContext.addPyFile``, what spark-submit's ``--py-files`` does).
    ``warnings_to``: if this call starts the JVM, what the JVM and Spark's log print on its stderr — the
    JVM's own warnings, every log4j record with its stack trace — goes to that file instead of the console
    (README.md, "The console"); default ``$ACTIVEDB_HOME/logs/spark.log``.  Other lines (a Python
    worker's output) still reach the console.

    Resolves Java first (:func:`spark_bridge._java.ensure_java`, which sets
    ``JAVA_HOME``); for a ``local`` master also sets ``SPARK_LOCAL_IP=127.0.0.1``, and
    ``PYSPARK_PYTHON`` to this interpreter, unless already set (the interpreter the executors run: on a
    cluster, one at that path on every host, or an archive's — README.md, "Running on a cluster"). They
    are written to ``os.environ`` because PySpark's launcher and worker factory read them from there.

    If a SparkSession already exists in this process it is returned (Spark allows one
    per JVM): runtime SQL options (shuffle partitions, checkpoint file manager) are
    applied to it, but static ones (``master``, Java options) keep their first values.

    Raises :class:`activedb.extras.MissingExtra` without pyspark or pyarrow (the ``spark`` extra),
    :class:`~spark_bridge.errors.JavaNotFoundError` when no Java 17/21 can be had.
    """
    require(Extra.SPARK, "Spark (spark_bridge.get_spark)")
    if isinstance(py_files, (str, os.PathLike)):
        raise BadArgument(f"get_spark(py_files=...): py_files takes a list of paths, not one; did you mean "
                          f"py_files=[{os.fspath(py_files)!r}]?")
    missing = [os.fspath(path) for path in py_files if not Path(path).is_file()]
    if missing:
        raise BadArgument(f"get_spark(py_files=...): no such file: {', '.join(missing)}; give existing files")
    _java.ensure_java()
    settings = spark_conf(app_name, master=master, fast_checkpoints=fast_checkpoints, conf=conf)
    if _cluster.is_local_master(settings["spark.master"]):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # A driver started from Python (not spark-submit) takes the workers' interpreter from
    # PYSPARK_PYTHON, not from spark.pyspark.python; without it they run `python3` from
    # PATH, which may lack this environment's packages (activedb for the scale-out tasks).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    if SparkSession.getActiveSession() is None:
        if warnings_to is None:
            from activedb import default_home

            warnings_to = default_home() / "logs" / "spark.log"
        session = _with_quiet_stderr(builder.getOrCreate, Path(warnings_to))
    else:
        session = builder.getOrCreate()
    assert isinstance(session, SparkSession)
    if not fast_checkpoints and _CHECKPOINT_FILE_MANAGER_KEY not in (conf or {}):
        # A reused session may carry the option from an earlier call; back to Spark's default.
        session.conf.unset(_CHECKPOINT_FILE_MANAGER_KEY)
    session.sparkContext.setLogLevel("WARN")
    for path in py_files:
        session.sparkContext.addPyFile(os.fspath(Path(path).resolve()))
    return session


# A line the JVM prints itself (``WARNING: Using incubator modules …``, ``Picked up JAVA_TOOL_OPTIONS``) or
# that starts a log4j record (``log4j2.properties``: ``%d{yy/MM/dd HH:mm:ss} %p %c{1}: …``, any level).
_LOG_LINE = re.compile(rb"^(WARNING: |Picked up |\S+ \S+ (?:TRACE|DEBUG|INFO|WARN|ERROR|FATAL) )")
# The rest of a log4j record: its exception (``%ex``) — frames, causes, ``... N more`` — indented or not.
_CONTINUATION = re.compile(rb"^(\s|Caused by: |Suppressed: |[\w$.]+(?:Exception|Error|Throwable)\b)")


def to_log(line: bytes, in_record: bool) -> bool:
    """Whether a line of the JVM's stderr belongs in the log file: it starts a log4j record or is a line the
    JVM prints itself, or (``in_record``: the line before went to the log) continues that record."""
    return bool(_LOG_LINE.match(line)) or (in_record and bool(_CONTINUATION.match(line)))


def _with_quiet_stderr(start: Callable[[], _T], log_path: Path) -> _T:
    """Run ``start()`` (which launches the JVM) with file descriptor 2 on a pipe, so that the JVM
    inherits the pipe as its stderr; a daemon thread copies the lines :func:`to_log` picks to ``log_path``
    and everything else to the original stderr, for as long as the JVM lives.  Python's own fd 2 is
    restored at once."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    original = os.dup(2)

    def pump() -> None:
        in_record = False
        with os.fdopen(read_end, "rb") as source, open(log_path, "ab") as log:
            for line in source:
                in_record = to_log(line, in_record)
                if in_record:
                    log.write(line)
                    log.flush()
                else:
                    os.write(original, line)

    threading.Thread(target=pump, name="spark-stderr", daemon=True).start()
    sys.stderr.flush()
    os.dup2(write_end, 2)
    try:
        return start()
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)
        os.close(write_end)
