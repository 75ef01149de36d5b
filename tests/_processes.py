"""Whether a process has exited, as a test waiting for a server to stop needs to know it: gone, or a zombie."""

from __future__ import annotations

import psutil


def exited(process: int | psutil.Process) -> bool:
    """Whether ``process`` (a pid, or a process seen before: a pid used again since counts as exited) has exited:
    gone, or a zombie.  A postmaster's parent is init (``pg_ctl`` daemonises it), and so is a killed server's backends'
    once it is gone; the init of some containers reaps only every second or two, and until then the pid exists
    (``psutil.pid_exists``, ``psutil.wait_procs``) although the process ended."""
    try:
        if isinstance(process, psutil.Process) and not process.is_running():
            return True
        found = process if isinstance(process, psutil.Process) else psutil.Process(process)
        return found.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
