"""``activedb run`` given options it cannot use — a ``--spark-conf`` that is no KEY=VALUE, a ``--py-files`` entry that
is no file, ``--reset`` for an application without ``reset(db)`` — stops before Spark starts or anything is
written, saying which option and what to give; so do ``ingest()``'s options and ``sink_of`` of another query."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from activedb.cli import main

#: An application with everything ``activedb run`` needs but ``reset(db)``.
APP = ("from tests.spark_bridge.app_counters import MAPPING, MIGRATIONS, SCHEMA, register\n")


@pytest.mark.parametrize("options, code, says", [
    (["--spark-conf", "spark.master"], 2, "'spark.master' is not KEY=VALUE"),
    (["--spark-conf", "=local[2]"], 2, "'=local[2]' is not KEY=VALUE"),
    (["--py-files", "helpers.py,missing.py"], 2, "no such file: missing.py"),
    (["--reset"], 1, "--reset: application no_reset_app has no reset(db) function"),
    (["--app-settings", "QUERIES = []\nEXECUTOR = 'tpg'"], 1, "QUERIES and EXECUTOR = 'tpg' name two ways"),
], ids=["conf-without-value", "conf-without-key", "py-files-missing", "reset-without-reset", "queries-and-executor"])
def test_an_option_it_cannot_use_stops_the_run_before_anything_starts(database_url, tmp_path, monkeypatch, options,
                                                                      code, says):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    app = "no_reset_app"
    if options[0] == "--app-settings":      # (not an option: more lines of an application's file of its own name,
        app = "queries_and_executor_app"    # as imports are cached by name)
        (tmp_path / f"{app}.py").write_text(APP + options[1] + "\n")
        options = []
    else:
        (tmp_path / f"{app}.py").write_text(APP)
    (tmp_path / "helpers.py").write_text("")
    (tmp_path / "events").mkdir()
    before = sorted(path.name for path in tmp_path.iterdir())
    result = CliRunner().invoke(main, ["--url", database_url, "--home", str(tmp_path / "home"), "run", app,
                                       "--source", f"file:{tmp_path / 'events'}", *options], catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert says in result.output
    assert "Traceback" not in result.output
    assert sorted(path.name for path in tmp_path.iterdir() if path.name != "__pycache__") == before   # no checkpoint


def test_ingest_options_and_mapping_of_no_kind_it_takes_are_refused_before_spark_is_asked(db):
    """``IngestOptions(deadlines=…)`` and ``ingest(mapping=…)`` of the wrong kind are the caller's mistake, said at
    the call (no streaming DataFrame is looked at: the frame given here is no frame at all)."""
    import spark_bridge
    from activedb.ingest.errors import IngestError

    with pytest.raises(IngestError, match=r"deadlines must be an activedb.ingest.Deadlines \(or None\), got 5"):
        spark_bridge.IngestOptions(deadlines=5)
    with pytest.raises(IngestError, match=r"^mapping: "):
        spark_bridge.ingest(db, object(), mapping=5, query_name="refused", checkpoint_location="/nonexistent/refused")


def test_the_sink_of_a_query_ingest_did_not_start_is_refused_saying_so():
    import spark_bridge
    from activedb.ingest.errors import IngestError

    with pytest.raises(IngestError, match=r"this query was not started by spark_bridge.ingest\(\)"):
        spark_bridge.sink_of(object())
