"""Build the SparkSession that ``spark_bridge`` runs on.

Public interface: :func:`get_spark` and, for inspection and tests, :func:`spark_conf`
(the configuration :func:`get_spark` would apply, as a plain dict, without starting Java).

Defaults are for one machine: ``local[2]``, UI off, two shuffle partitions, UTC session
time zone, driver logging at WARN (``log4j2.properties`` next to this module) and no
console progress bars. With ``fast_checkpoints=True`` (the default) the streaming
checkpoint log is written through Hadoop's ``FileSystem`` API instead of ``FileContext``
(:data:`FAST_CHECKPOINT_FILE_MANAGER`): on a local disk this cuts the fixed cost of a
micro-batch to about a third (measured numbers in ``spark_bridge/README.md``). Its rename is
weaker (not atomic on every file system); keep it off for checkpoints on object stores
or network file systems whose rename is not atomic.

pyspark is imported inside :func:`get_spark` only; importing this module starts nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from spark_bridge import _java

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import SparkSession

__all__ = ["FAST_CHECKPOINT_FILE_MANAGER", "get_spark", "spark_conf"]

#: Checkpoint file manager that writes through ``FileSystem`` (checked to exist in the
#: ``spark-sql_2.13-4.3.0.jar`` shipped with pyspark 4.3.0; Spark 4 moved it from
#: ``...execution.streaming`` to ``...execution.streaming.checkpointing``).
FAST_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
_CHECKPOINT_FILE_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"

_LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def spark_conf(
    app_name: str = "activedb",
    *,
    master: str = "local[2]",
    fast_checkpoints: bool = True,
    conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
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


def get_spark(
    app_name: str = "activedb",
    *,
    master: str = "local[2]",
    fast_checkpoints: bool = True,
    conf: Mapping[str, str] | None = None,
) -> "SparkSession":
    """Return a SparkSession configured by :func:`spark_conf`, starting Java if needed.

    Resolves Java first (:func:`spark_bridge._java.ensure_java`, which sets
    ``JAVA_HOME``); for a ``local`` master also sets ``SPARK_LOCAL_IP=127.0.0.1``, and
    ``PYSPARK_PYTHON`` to this interpreter, unless already set. They are written to
    ``os.environ`` because PySpark's launcher and worker factory read them from there.

    If a SparkSession already exists in this process it is returned (Spark allows one
    per JVM): runtime SQL options (shuffle partitions, checkpoint file manager) are
    applied to it, but static ones (``master``, Java options) keep their first values.

    Raises :class:`~spark_bridge.errors.JavaNotFoundError` when no Java 17/21 can be had.
    """
    _java.ensure_java()
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # A driver started from Python (not spark-submit) takes the workers' interpreter from
    # PYSPARK_PYTHON, not from spark.pyspark.python; without it they run `python3` from
    # PATH, which may lack this environment's packages (activedb for the scale-out tasks).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_conf(
        app_name, master=master, fast_checkpoints=fast_checkpoints, conf=conf
    ).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not fast_checkpoints and _CHECKPOINT_FILE_MANAGER_KEY not in (conf or {}):
        # A reused session may carry the option from an earlier call; back to Spark's default.
        session.conf.unset(_CHECKPOINT_FILE_MANAGER_KEY)
    session.sparkContext.setLogLevel("WARN")
    return session
