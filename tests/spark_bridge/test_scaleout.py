"""``spark_bridge._scaleout``'s per-worker caches, without Spark: a Spark task's Python worker keeps one ``Database``
(and one ``Ingestion``) per what it was connected with, and reuses it for later tasks of the same kind."""

from __future__ import annotations

from activedb import RuleExecution
from spark_bridge import _scaleout
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import APP_FILE, app_database


def _task(url: str, **connect_options: object) -> _scaleout._PartitionTask:
    return _scaleout._PartitionTask(
        url=url, app=APP_FILE, mapping=app_counters.MAPPING, query_name="counters", query_id="counters@q",
        batch_id=0, watermark=None, known_types=None, prefetch=(), connect_options=tuple(sorted(connect_options.items())),
        detached_timeout=30.0)


def test_a_worker_keeps_a_database_per_connect_options_not_only_per_url_and_app(database_url):
    """The caches were keyed by (URL, app) and (URL, app, query, …) without the connect options: a second scale-out
    query (or a re-run in the same driver session) with the same URL and app but other ``connect_options`` had its
    tasks reuse the first one's database, connected with the first one's options."""
    app_database(database_url).close()       # (the app's tables)
    made = []
    try:
        inline = _task(database_url, rule_execution=RuleExecution.INLINE, lock_timeout=5.0,
                       outbox_options={"group_size": 10})
        threads = _task(database_url, rule_execution=RuleExecution.THREADS, lock_timeout=7.0,
                        outbox_options={"group_size": 20})
        first, second = inline._sink(), threads._sink()
        made += [first.db, second.db]
        assert first is not second and first.db is not second.db
        assert (first.db.config.lock_timeout, first.db.config.rule_execution) == (5.0, RuleExecution.INLINE)
        assert (second.db.config.lock_timeout, second.db.config.rule_execution) == (7.0, RuleExecution.THREADS)
        assert _task(database_url, rule_execution=RuleExecution.INLINE, lock_timeout=5.0,
                     outbox_options={"group_size": 10})._sink() is first      # (the same options: reused)
    finally:
        with _scaleout._worker_mutex:
            _scaleout._worker_sinks.clear()
            _scaleout._worker_databases.clear()
        for database in {id(database): database for database in made}.values():
            database.close()


def test_the_engines_connect_args_reach_a_task_only_as_connect_options(database_url):
    """The driver's ``engine=EngineOptions(…)`` (its ``connect_args``: TLS settings, say) stays on the driver, as the
    design note's "Running on a cluster" says; a task connects with those given in ``connect_options`` — sent to it
    pickled, as Spark sends a task."""
    import pickle

    import sqlalchemy as sa

    from activedb import EngineOptions

    app_database(database_url).close()       # (the app's tables)
    engine = EngineOptions(create_engine={"connect_args": {"application_name": "activedb-task"}})
    try:
        task = pickle.loads(pickle.dumps(_task(database_url, engine=engine)))
        with task._sink().db.engine.connect() as connection:
            named = connection.execute(sa.text("SELECT application_name FROM pg_stat_activity "
                                               "WHERE pid = pg_backend_pid()")).scalar_one()
        assert named == "activedb-task"
    finally:
        with _scaleout._worker_mutex:
            _scaleout._worker_sinks.clear()
            for database in _scaleout._worker_databases.values():
                database.close()
            _scaleout._worker_databases.clear()


def test_an_option_a_task_cannot_connect_with_is_one_line_naming_it_not_a_failed_connection(database_url):
    """A task's ``activedb.connect`` refusing one of ``connect_options`` (a process whose activedb takes other values
    than the driver's, which checked them) told only an unknown keyword or a ``BadArgument`` as such: a value not of
    its closed set (``InvalidChoice``, a ``ValueError`` but no ``BadArgument``) was reported as "could not connect
    to" the database, sending the user to the network and the password."""
    import pytest

    from spark_bridge.errors import IngestError

    for options, named in (({"victim_policy": "bogus"}, "victim_policy='bogus' is not a VictimPolicy"),
                           ({"lock_timeout": "x"}, "Config(lock_timeout='x') takes None"),
                           ({"no_such_option": 1}, "unknown keyword(s) no_such_option")):
        with pytest.raises(IngestError) as refused:
            _task(database_url, **options)._sink()
        message = str(refused.value)
        assert "\n" not in message and "could not connect" not in message, message
        assert message.startswith("the scale-out tasks' connect_options were refused by activedb.connect ("), message
        assert named in message and message.endswith("fix ingest(connect_options=…): each task connects with them"), \
            message
    with _scaleout._worker_mutex:
        assert not _scaleout._worker_databases     # (nothing was connected)


def test_a_partition_that_conflicted_on_every_attempt_stops_the_query_saying_so_not_that_postgresql_was_down(db):
    """A partition whose batch met a serialization conflict on each of its attempts (``Ingestion.process`` raises
    ``SerializationConflict`` after the last) is not the partition's fault, so the driver stops the query — but its
    ``PartitionFailed`` said "PostgreSQL was unusable" (and to restart "once PostgreSQL is back"), sending the user
    to look for an outage that never was.  It names the conflict, the attempts and what to do now; an outage is
    still told as one."""
    import dataclasses

    import pytest

    from activedb import atomic
    from activedb.atomic.errors import PartitionFailed
    from activedb.errors import DatabaseUnavailable, SerializationConflict

    task = dataclasses.replace(_task("postgresql://unused"), batch_attempts=4)
    conflict = task._failure(None, 1, "counters@q", [], SerializationConflict(   # type: ignore[arg-type]
        "commit of t1 failed on concurrent updates by another process (SQLSTATE 40001); nothing was written"))
    with pytest.raises(PartitionFailed) as stopped:
        atomic.settle(db, "counters@q", 9, 2, atomic.SplitFailure.COMPENSATE, [conflict])
    message = str(stopped.value)
    assert "PostgreSQL was unusable" not in message and "once PostgreSQL is back" not in message, message
    assert "partition 1 met a serialization conflict on each of its 4 attempts" in message, message
    assert "batch_attempts" in message and "restart the query from its checkpoint" in message, message

    down = task._failure(None, 0, "counters@q", [], DatabaseUnavailable("connection refused"))  # type: ignore[arg-type]
    with pytest.raises(PartitionFailed, match=r"partition 0: PostgreSQL was unusable \(connection lost\).*"
                                              r"once PostgreSQL is back"):
        atomic.settle(db, "counters@q", 9, 2, atomic.SplitFailure.COMPENSATE, [down])
