"""A query stopped in the middle of a batch (``activedb run``'s and the demo's Ctrl-C, when a batch starts just before
the stop) on real Spark and PostgreSQL: ``stop()`` interrupts the stream's thread, the batch's next Spark job fails
with ``java.lang.InterruptedException``, and Spark takes that failure for the stop's own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.spark_bridge._waits import DRIVER_WAIT_SECONDS


@pytest.mark.spark
def test_a_batch_interrupted_by_the_stop_ends_the_query_quietly_without_a_stack_overflow(tmp_path, make_database_url):
    """The interrupted batch raised its ``Py4JJavaError`` (with the Java stack trace) to Spark as it was: Spark, to
    tell an interrupted batch from a failed one, matches py4j's text of it against a pattern that
    ``java.util.regex`` recurses through once per character, and the stream's thread died of
    ``StackOverflowError`` ("Exception in thread "stream execution thread …"" on the console; seen once after the
    demo's Ctrl-C in a clean-clone CI run).  Spark now gets a bounded error that still names the interruption: the
    query stops as stopped, and the sink keeps the batch's error whole.  Its own process (the driver): the JVM's
    console is what is checked."""
    command = [sys.executable, "-m", "tests.spark_bridge.drivers.stop_in_batch", make_database_url("stop_in_batch"),
               str(tmp_path)]
    environment = {**os.environ, "ACTIVEDB_HOME": str(tmp_path / "home")}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=DRIVER_WAIT_SECONDS)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "StackOverflowError" not in output and "Exception in thread" not in output, output[-3000:]
    assert "last failure: batch 0: Py4JJavaError: An error occurred while calling" in done.stdout, output[-3000:]
    assert "java.lang.InterruptedException" in done.stdout, output[-3000:]
    assert "query exception: None" in done.stdout, output[-3000:]
