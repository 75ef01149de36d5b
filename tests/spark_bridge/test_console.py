"""What reaches the console of a program that started Spark through ``get_spark``: the JVM's and Spark's
log lines (any level, with their stack traces) go to the log file, a Python worker's output does not."""

from spark_bridge.session import to_log

# Lines as the JVM and log4j2.properties's pattern print them (the noise issue 56 lists), then lines that
# are not theirs.
JVM = [
    b"WARNING: Using incubator modules: jdk.incubator.vector\n",
    b"26/11/25 19:16:40 WARN DAGScheduler: Broadcasting large task binary with size 1033.6 KiB\n",
    b"26/11/25 19:16:41 ERROR TorrentBroadcast: Store broadcast broadcast_12 fail, remove all pieces of the "
    b"broadcast\n",
    b"java.lang.InterruptedException\n",
    b"\tat java.base/java.util.concurrent.locks.AbstractQueuedSynchronizer.acquireSharedInterruptibly(Unknown)\n",
    b"\t... 12 more\n",
    b"Caused by: org.apache.spark.SparkException: Exception thrown in awaitResult: \n",
    b"\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:53)\n",
    b"Picked up JAVA_TOOL_OPTIONS: -Xss4m\n",
]
OTHERS = [b"hello from a Python worker\n", b"Traceback (most recent call last):\n"]


def test_the_jvms_lines_go_to_the_log_and_the_rest_to_the_console():
    in_record = False
    routed = []
    for line in JVM + OTHERS:
        in_record = to_log(line, in_record)
        routed.append(in_record)
    assert routed == [True] * len(JVM) + [False] * len(OTHERS)


def test_a_stack_trace_goes_to_the_log_only_after_a_log_record():
    assert not to_log(b"\tat some.Frame(File.java:1)\n", in_record=False)
    assert not to_log(b"java.lang.IllegalStateException: from a worker\n", in_record=False)
