"""A command run with its standard error (or output) on a terminal (a pseudo-terminal this process reads), as a user at
a shell runs it: what a command draws only for a person (progress bars, the revisions as they start, text wrapped to
the terminal's width) is tested so."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Literal

SECONDS = 120       # (a bound for the command on a busy machine: it fails with what it drew so far)


def run_on_terminal(command: Sequence[str], env: Mapping[str, str] | None = None, *,
                    terminal: Literal["stderr", "stdout"] = "stderr") -> tuple[int, str, bytes]:
    """Run ``command`` with ``terminal`` (stderr, or stdout) on a pseudo-terminal and the other piped; its exit code,
    what it wrote to the pipe and what it drew on the terminal (bytes, with the terminal's ``\\r``)."""
    primary, secondary = pty.openpty()
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, terminal: secondary}
    process = subprocess.Popen(list(command), **streams, env=None if env is None else dict(env))
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
    piped = process.communicate(timeout=SECONDS)
    out = (piped[1] if terminal == "stdout" else piped[0]).decode()
    return process.returncode, out, drawn
