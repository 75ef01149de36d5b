"""A TCP port on 127.0.0.1 that never answers: a listening socket whose backlog is full and that never accepts, so
the connection's SYNs are dropped, not refused — as by a host behind a firewall that drops the packets."""

from __future__ import annotations

import contextlib
import socket
from typing import Iterator


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """The port, silent until the block ends."""
    with contextlib.ExitStack() as stack:
        silent = stack.enter_context(socket.socket())
        silent.bind(("127.0.0.1", 0))
        silent.listen(0)
        port = silent.getsockname()[1]
        for _ in range(3):                  # fill the backlog: the SYNs to come are dropped, not refused
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        yield port
