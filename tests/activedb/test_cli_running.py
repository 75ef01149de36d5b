"""What a long-running command does with its signals (``activedb.cli.running``): the two-step Ctrl-C."""

from __future__ import annotations

import signal
import threading

from activedb.cli.running import StopRequest


def test_a_second_signal_inside_the_first_ones_handler_is_counted_not_waited_for():
    """Python runs a signal handler on the main thread between any two bytecodes — also inside the handler of the
    previous signal. The handler counted under a plain lock, so a second Ctrl-C landing while the first was being
    counted waited for a lock its own thread held: for ever, and every later Ctrl-C with it — the very signal that
    ends the process at once.  (The watchdog frees the lock after 5 s; it must not have had to.)"""
    stop = StopRequest()
    forced: list[bool] = []
    stop.at_once = lambda: forced.append(True)
    watchdog_fired = threading.Event()

    def watchdog() -> None:
        watchdog_fired.set()
        stop._mutex.release()

    timer = threading.Timer(5.0, watchdog)
    stop._mutex.acquire()            # the first signal's handler, counting, when the second one comes
    timer.start()
    try:
        stop._handle(signal.SIGINT, None)
    finally:
        timer.cancel()
        if not watchdog_fired.is_set():
            stop._mutex.release()
    assert not watchdog_fired.is_set(), "the nested handler waited for the lock its own thread held"
    assert stop.event.is_set() and not forced
    stop._handle(signal.SIGINT, None)
    assert stop.forced.is_set() and forced == [True]
