"""A TCP port on 127.0.0.1 that never answers: a listening socket whose backlog is full and that never accepts, so
the connection's SYNs are dropped, not refused — as by a host behind a firewall that drops the packets."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Callable, Iterator


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


def raised_within(call: Callable[[], object], seconds: float, doing: str) -> BaseException:
    """What ``call()`` raised, run on a daemon thread and waited for at most ``seconds`` (a call that still waits then
    fails the test, naming ``doing``; one that returns fails it too)."""
    outcome: list[BaseException] = []
    ended = threading.Event()

    def run() -> None:
        try:
            call()
        except BaseException as error:              # (what the test looks at, on its thread)
            outcome.append(error)
        ended.set()

    threading.Thread(target=run, name=doing, daemon=True).start()
    assert ended.wait(seconds), f"{doing} still waited for a server that never answers after {seconds} s"
    assert outcome, f"{doing} returned instead of failing"
    return outcome[0]
