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
