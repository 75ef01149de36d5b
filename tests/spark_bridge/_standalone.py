"""A Spark standalone cluster on 127.0.0.1 for the cluster test: a master and workers started by shell command
lines (the README's: the ``spark-class`` launcher of the pyspark wheel), and the processes of its executors.

:func:`standalone_cluster` runs the master's line, then the worker's line once per worker, each with the
environment a cluster on one host needs: Spark's own variables give random free ports (``SPARK_MASTER_PORT=0``,
the web UIs on port 0), turn the REST submission server off, size each worker (``SPARK_WORKER_CORES``,
``SPARK_WORKER_MEMORY``) and put its work directory in the test's (``SPARK_WORKER_DIR``); ``SPARK_LOCAL_IP``
binds everything to 127.0.0.1 and ``SPARK_CONF_DIR`` is an empty directory, so no ``spark-defaults.conf`` of
the machine applies.  At the end of the block, also when it fails, it stops them: SIGTERM to each daemon's
process group (a worker's executors and their Python workers are in its group), then SIGKILL to what is left.
Waits are on the daemons' log lines, bounded, and fail with the logs.  :func:`executor_of_connection` finds
the executor JVM whose Python worker holds a given TCP connection (Linux ``/proc``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from lockmgr.testing import wait_until

#: A daemon starts a JVM (5 s idle, a minute or more under 8x load): bounded, with the logs on failure.
DAEMON_WAIT_SECONDS = 300
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


@dataclass
class StandaloneCluster:
    """The running cluster: ``master_url`` (``spark://127.0.0.1:PORT``), the workers' work directories, the
    daemon processes (master first) and their logs."""

    directory: Path
    master_url: str = ""
    work_dirs: list[Path] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def executor_logs(self) -> list[Path]:
        """Every executor's ``stderr`` (``WORK_DIR/APP_ID/EXECUTOR_ID/stderr``), in start order per worker."""
        return sorted(path for work_dir in self.work_dirs for path in work_dir.glob("*/*/stderr"))

    def registered_executors(self) -> list[int]:
        """The pids of the executor JVMs running in the workers' directories that registered with the driver (their
        log says so): they take a task without a JVM to start."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and EXECUTOR_CLASS in command_line(int(entry.name)):
                try:
                    where = os.readlink(entry / "cwd")
                except OSError:
                    continue
                if any(where.startswith(f"{work_dir}{os.sep}") for work_dir in self.work_dirs) and _says(
                        Path(where) / "stderr", "Successfully registered with driver"):
                    found.append(int(entry.name))
        return found

    def registered(self) -> None:
        """Wait until every worker registered with the master (fails when one exits first, with the logs)."""
        for number in range(len(self.work_dirs)):
            _logged(self, number + 1, r"Successfully registered with master", f"worker {number}")

    def describe(self) -> str:
        """The end of every daemon's and executor's log, for a failure's message."""
        return "\n".join(f"--- {log}:\n{tail(log)}" for log in [*self.logs, *self.executor_logs()])


def _says(log: Path, text: str) -> bool:
    try:
        return text in log.read_text(errors="replace")
    except OSError:
        return False


def tail(path: Path, characters: int = 2000) -> str:
    return path.read_text(errors="replace")[-characters:] if path.exists() else "(none)"


def _start(line: str, log: Path, environment: Mapping[str, str], cwd: Path, cluster: StandaloneCluster) -> None:
    cluster.logs.append(log)
    with open(log, "wb") as output:
        cluster.processes.append(subprocess.Popen(["bash", "-c", line], cwd=cwd, stdin=subprocess.DEVNULL,
                                                  stdout=output, stderr=subprocess.STDOUT, env=dict(environment),
                                                  start_new_session=True))


def _logged(cluster: StandaloneCluster, index: int, pattern: str, what: str) -> str:
    """Wait for ``pattern`` in daemon ``index``'s log; its first group (or the match).  Fails when the daemon
    exits first."""
    expression, log, process = re.compile(pattern), cluster.logs[index], cluster.processes[index]

    def found():
        match = expression.search(log.read_text(errors="replace")) if log.exists() else None
        if match is None and process.poll() is not None:
            raise AssertionError(f"the {what} exited with {process.returncode}:\n{cluster.describe()}")
        return match and (match.group(1) if expression.groups else match.group(0))

    return wait_until(found, DAEMON_WAIT_SECONDS, f"the {what}'s {pattern!r}", cluster.describe)


@contextmanager
def standalone_cluster(directory: Path, master: str, worker: Callable[[str], str], *, cwd: Path,
                       environment: Mapping[str, str], workers: int = 2, cores: int = 1,
                       memory: str = "1g") -> Iterator[StandaloneCluster]:
    """The master (shell line ``master``) and ``workers`` workers (``worker(master_url)``), ``cores`` and
    ``memory`` each, on 127.0.0.1, running in ``cwd`` with ``environment`` (which must name Java 17/21:
    ``JAVA_HOME``) for the block.  The block begins once the master runs and the workers' lines were started, so
    that a driver can start its JVM while theirs start (a Spark application waits for executors as workers
    register); :meth:`StandaloneCluster.registered` waits for the workers."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "conf").mkdir(exist_ok=True)
    common = {**environment, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(directory / "conf")}
    cluster = StandaloneCluster(directory)
    try:
        _start(master, directory / "master.log", {
            **common, "SPARK_MASTER_PORT": "0", "SPARK_MASTER_WEBUI_PORT": "0",
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}, cwd, cluster)
        cluster.master_url = _logged(cluster, 0, r"Starting Spark master at (spark://\S+)", "master")
        for number in range(workers):
            work_dir = directory / f"worker{number}"
            work_dir.mkdir()
            cluster.work_dirs.append(work_dir)
            _start(worker(cluster.master_url), directory / f"worker{number}.log", {
                **common, "SPARK_WORKER_WEBUI_PORT": "0", "SPARK_WORKER_CORES": str(cores),
                "SPARK_WORKER_MEMORY": memory, "SPARK_WORKER_DIR": str(work_dir)}, cwd, cluster)
        yield cluster
    finally:
        stop(cluster)


def stop(cluster: StandaloneCluster) -> None:
    """SIGTERM every daemon's process group (workers first: they stop their executors), wait, SIGKILL what is
    left of each group."""
    processes = list(reversed(cluster.processes))
    for process in processes:
        _signal_group(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    for process in processes:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _signal_group(group: int, number: int) -> None:
    try:
        os.killpg(group, number)
    except ProcessLookupError:
        pass


# --- which executor holds a connection ---------------------------------------------------------------------

def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def socket_owner(local_port: int) -> int | None:
    """The process that owns the TCP socket whose local end is 127.0.0.1:``local_port`` (None if gone)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == local_port and fields[9] != "0":
                inodes.add(f"socket:[{fields[9]}]")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for descriptor in (entry / "fd").iterdir():
                if os.readlink(descriptor) in inodes:
                    return int(entry.name)
        except OSError:
            continue
    return None


def executor_of(pid: int) -> int | None:
    """The executor JVM (``CoarseGrainedExecutorBackend``) among ``pid`` and its ancestors."""
    current: int | None = pid
    while current and current > 1:
        if EXECUTOR_CLASS in command_line(current):
            return current
        current = _parent(current)
    return None


def executor_of_connection(client_port: int) -> tuple[int, int] | None:
    """``(executor JVM pid, Python worker pid)`` of the process holding the connection whose client port
    PostgreSQL reports (``pg_stat_activity.client_port``); None if that process is not under an executor."""
    owner = socket_owner(client_port)
    executor = executor_of(owner) if owner is not None else None
    return (executor, owner) if executor is not None else None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
