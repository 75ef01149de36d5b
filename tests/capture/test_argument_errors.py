"""A capture consumer refuses deadlines that are no ``Deadlines``, a second ``start()``, and ``run_once`` /
``run_until_caught_up`` while it runs on its own thread, with a ``CaptureError`` that says what to call instead."""

from __future__ import annotations

import pytest

from activedb.capture.errors import CaptureError


@pytest.mark.parametrize("deadlines", [5, {"rule": 1.0}], ids=["seconds", "a-dict"])
def test_deadlines_that_are_no_deadlines_are_refused(clean, deadlines):
    with pytest.raises(CaptureError, match=r"db\.capture\.consumer\(deadlines=.*\) takes an activedb\.ingest\."
                                           r"Deadlines\(batch=…, rule=…\) in seconds, or None for no limit"):
        clean.capture.consumer(deadlines=deadlines)


def test_a_running_consumer_refuses_a_second_start_and_the_calls_of_a_consumer_on_the_callers_thread(clean):
    consumer = clean.capture.consumer("runs-once")
    consumer.start()
    try:
        with pytest.raises(CaptureError, match=r"capture consumer .runs-once. is already running: stop\(\) it before "
                                               r"starting it again"):
            consumer.start()
        with pytest.raises(CaptureError, match=r"runs on its own thread \(start\(\)\); use wait_caught_up\(\) "
                                               r"instead of run_once\(\)"):
            consumer.run_once()
        with pytest.raises(CaptureError, match=r"runs on its own thread \(start\(\)\); use wait_caught_up\(\) "
                                               r"instead$"):
            consumer.run_until_caught_up()
    finally:
        consumer.stop()
    assert consumer.run_until_caught_up() == 0      # stopped: the caller's thread may run it again
