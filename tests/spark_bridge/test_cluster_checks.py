"""What the scale-out path checks and says before and after running on a cluster, without one (the cluster
itself: ``test_cluster.py``):

* which masters keep the tasks on this host, which database URLs only this host can use (a unix socket, no
  host), and that a scale-out run on a cluster master refuses the embedded server's URL — ``activedb run
  --master spark://… --partitions 2`` says so before Spark starts, with what to do;
* a password in the URL of a scale-out query on a cluster is warned about once;
* a scale-out job whose task raised on a Spark worker fails with the task's Python exception, not Spark's
  Java trace around it (real Spark, ``local[2]``).
"""

from __future__ import annotations

import logging
import os

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from activedb.cli import main
import spark_bridge
from spark_bridge import _cluster
from spark_bridge.errors import IngestError
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, iso, new_app_database, write_files


@pytest.mark.parametrize("master, local", [("local", True), ("local[2]", True), ("local[*]", True),
                                           ("local[2,3]", True), ("local-cluster[2,1,1024]", False),
                                           ("spark://10.0.0.1:7077", False), ("yarn", False),
                                           ("k8s://https://kube:6443", False)])
def test_which_masters_keep_the_tasks_on_this_host(master, local):
    assert _cluster.is_local_master(master) is local


@pytest.mark.parametrize("url, reachable", [
    ("postgresql+psycopg://u:p@/activedb?host=%2Ftmp%2Fhome%2Fpgdata", False),   # the embedded server's form
    ("postgresql+psycopg://u@/activedb", False),                                  # libpq's default socket
    ("postgresql+psycopg://u@/activedb?host=/run/a&host=/run/b", False),
    ("postgresql+psycopg://u@/activedb?host=@abstract", False),
    ("postgresql+psycopg://u@db.example.com:5432/activedb", True),
    ("postgresql+psycopg://u@/activedb?host=/run/a,db.example.com", True),        # a TCP host among them
    ("postgresql+psycopg://u@/activedb?host=/run/a&hostaddr=10.0.0.5", True),
])
def test_a_url_only_this_host_can_use_is_told_apart(url, reachable):
    assert (_cluster.socket_only(sa.make_url(url)) is None) is reachable


def test_activedb_run_on_a_cluster_refuses_the_embedded_server_before_spark_starts(database_url, tmp_path):
    if os.environ.get("ACTIVEDB_TEST_SERVER") == "1":
        pytest.skip("the suite's databases are on a TCP server here, not the embedded one")
    assert sa.make_url(database_url).query.get("host", "").startswith("/")   # the suite's embedded server
    (tmp_path / "in").mkdir()
    result = CliRunner().invoke(main, ["--url", database_url, "run", app_counters.__file__, "--source",
                                       f"file:{tmp_path / 'in'}", "--partitions", "2", "--master",
                                       "spark://10.0.0.1:7077", "--checkpoint", str(tmp_path / "ck")])
    assert result.exit_code == 1, result.output
    assert "unix socket directory" in result.output and "over TCP" in result.output, result.output
    assert "Running on a cluster" in result.output
    assert "starting Spark" not in result.output and "secret" not in result.output


def test_a_password_in_the_url_of_a_scale_out_query_on_a_cluster_is_warned_about_once(caplog):
    url = sa.make_url("postgresql+psycopg://u:hunter2@db.example.com/warned_once")
    with caplog.at_level(logging.WARNING, logger="spark_bridge._cluster"):
        _cluster.check_database_for_executors(url, "local[2]")
        _cluster.check_database_for_executors(url, "spark://10.0.0.1:7077")
        _cluster.check_database_for_executors(url, "spark://10.0.0.1:7077")
    [record] = caplog.records
    assert "PGPASSFILE" in record.getMessage() and "hunter2" not in record.getMessage()
    _cluster.check_database_for_executors(url.set(password=""), "spark://10.0.0.1:7077")   # nothing to say


FAILING_APP = '''
class NotOnThisWorker(RuntimeError):
    """What register() raises in a task."""

def register(db):
    raise NotOnThisWorker("register() refused on this worker: the app needs a setting the executors lack")
'''


@pytest.mark.spark
def test_a_failed_scale_out_task_fails_the_batch_with_its_python_exception(spark, tmp_path, make_database_url):
    app = tmp_path / "failing_app.py"
    app.write_text(FAILING_APP)
    write_files(tmp_path / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    database = new_app_database(make_database_url, "failing")
    try:
        frame = spark.readStream.schema(app_counters.SCHEMA).json(str(tmp_path / "in"))
        query = spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name="failing",
                                    checkpoint_location=str(tmp_path / "ck"), trigger={"availableNow": True},
                                    partition_by_key=2, app=str(app))
        with pytest.raises(Exception):
            query.awaitTermination(120)
        batch, error = spark_bridge.sink_of(query).last_failure()
        assert batch == 0 and isinstance(error, IngestError), error
        message = str(error)
        assert message.startswith("a scale-out task failed on the executors"), message
        assert "NotOnThisWorker: register() refused on this worker" in message, message
        assert "Traceback" not in message and "at org.apache" not in message, message
    finally:
        database.close()


def test_executors_without_pyarrow_are_told_what_their_environment_needs():
    from spark_bridge._cluster import task_failure

    trace = ("org.apache.spark.SparkException: Job aborted due to stage failure: ... "
             "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
             "  File \"/work/environment/lib/python3.11/site-packages/pyspark/worker.py\", line 1, in main\n"
             "    import pyarrow as pa\n"
             "ModuleNotFoundError: No module named 'pyarrow'\n")
    message = str(task_failure(Exception(trace)))
    assert message.startswith("a scale-out task failed on the executors (Spark gave up on it): ModuleNotFoundError: "
                              "No module named 'pyarrow'"), message
    assert "the executors' Python environment needs pyarrow" in message and "Running on a cluster" in message
