"""A command run with its standard error on a terminal (a pseudo-terminal this process reads), as a user at a shell
runs it: what a command draws only for a person (progress bars, the revisions as they start) is tested so."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Mapping, Sequence

SECONDS = 120       # (a bound for the command on a busy machine: it fails with what it drew so far)


def run_on_terminal(command: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[int, str, bytes]:
    """Run ``command`` with stderr on a pseudo-terminal and stdout piped; its exit code, its stdout and what it drew
    on the terminal (bytes, with the terminal's ``\\r``)."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=secondary,
                               env=None if env is None else dict(env))
    os.close(secondary)
    drawn = b""
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        if select.select([primary], [], [], 1.0)[0]:
            try:
                chunk = os.read(primary, 65536)
            except OSError:             # (the terminal's other side closed: the command ended)
                break
            if not chunk:
                break
            drawn += chunk
        elif process.poll() is not None:
            break
    os.close(primary)
    out = process.communicate(timeout=SECONDS)[0].decode()
    return process.returncode, out, drawn
