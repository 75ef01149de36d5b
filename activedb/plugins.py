"""What other packages contribute to activedb without activedb importing them: entry points.

activedb never imports ``spark_bridge`` (imports point one way).  A package that builds on activedb
declares in its ``pyproject.toml``::

    [project.entry-points."activedb.commands"]     # a callable register(main: click.Group)
    [project.entry-points."activedb.benchmarks"]   # a module with run(quick=False) -> a report
    [project.entry-points."activedb.feeds"]        # a callable feed(db, events, app, console)

and activedb finds them here, by name.  ``spark_bridge`` contributes ``activedb run``/``status`` and the
``spark`` feed of the demo; the repository's ``benchmarks`` package every benchmark.  A benchmark's
report (``benchmarks.report.BenchReport``) has ``notes`` (a list of lines), ``print_table(console)``,
``print(json_only=True)``, ``write_json(path)`` and ``plot(path) -> Path``: what ``activedb bench NAME``
calls.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from activedb.errors import ActivedbError

COMMANDS = "activedb.commands"
BENCHMARKS = "activedb.benchmarks"
FEEDS = "activedb.feeds"


class PluginMissing(ActivedbError):
    """A contribution (feed, benchmark, command) that no installed package provides."""


def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    return {entry.name: entry for entry in metadata.entry_points(group=group)}


def load_feed(name: str) -> Callable[..., dict[str, object]]:
    """The event feed ``name`` (``feed(db, events, app, console, progress=..., engine=...)``, returning what the
    demo reports on), e.g. ``"spark"``."""
    entry = entry_points(FEEDS).get(name)
    if entry is None:
        raise PluginMissing(f"no event feed named {name!r} is installed (entry point group {FEEDS!r}); it comes with "
                            f"the package that provides it (the activedb distribution's spark_bridge provides 'spark')")
    feed: Callable[..., dict[str, object]] = entry.load()
    return feed
