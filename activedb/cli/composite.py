"""``activedb composite plot``: draw a window of a composition (contributed through the
``activedb.commands`` entry point); its ``--help`` gives the examples and the ``--input`` format."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Required, TypedDict, cast

import click

from activedb import composite        # lazy: the engine is imported when a command uses it

if TYPE_CHECKING:  # pragma: no cover
    from activedb import streams


class Arrival(TypedDict, total=False):
    """One arrival of a window (``--input``'s JSON lines): an event of ``type``, or a heartbeat."""

    producer: Required[str]
    ref: Required[float]
    type: str
    heartbeat: bool
    accuracy: float
    minus: float
    plus: float
    local: float
    attributes: dict[str, object]
    arrival: float


FIG3: list[Arrival] = [
    {"producer": "P1B", "type": "B", "ref": 1.002, "attributes": {"id": "b1_0"}},
    {"producer": "PA", "type": "A", "ref": 1.000, "attributes": {"id": "a0"}},
    {"producer": "PA", "type": "A", "ref": 2.000, "attributes": {"id": "a1"}},
    {"producer": "P1B", "type": "B", "ref": 2.000, "attributes": {"id": "b1_1"}},
    {"producer": "P2B", "type": "B", "ref": 1.004, "attributes": {"id": "b2_0"}},
    {"producer": "P2B", "type": "B", "ref": 2.100, "attributes": {"id": "b2_1"}},
    {"producer": "PA", "type": "A", "ref": 2.500, "attributes": {"id": "a2"}},
    {"producer": "P1B", "heartbeat": True, "ref": 2.600},
    {"producer": "P2B", "heartbeat": True, "ref": 2.600},
]


def random_arrivals(producers: int, accuracy: float, events: int, seed: int) -> list[Arrival]:
    """A random window: producer 0 sends A, the others B, clocks off by up to ``accuracy``."""
    rng = random.Random(seed)
    rows: list[Arrival] = []
    for index in range(producers):
        name = f"P{index}"
        event_type = "A" if index == 0 else "B"
        offset = rng.uniform(-accuracy, accuracy)
        for number, true in enumerate(sorted(rng.uniform(0, 1.0) for _ in range(events // producers or 1))):
            rows.append({"producer": name, "type": event_type, "ref": true + offset, "accuracy": accuracy,
                         "attributes": {"id": f"{event_type.lower()}{index}_{number}"}, "arrival": true})
        rows.append({"producer": name, "heartbeat": True, "ref": 1.1 + offset, "accuracy": accuracy, "arrival": 1.1})
    rows.sort(key=lambda row: row["arrival"])
    return rows


def _item(row: Arrival, default_accuracy: float) -> streams.StreamEvent | composite.Heartbeat:
    from activedb import streams
    from activedb.events import Timestamp

    minus = row.get("minus", row.get("accuracy", default_accuracy))
    plus = row.get("plus", row.get("accuracy", default_accuracy))
    stamp = Timestamp.at(row["ref"], minus=minus, plus=plus, producer=row["producer"], local=row.get("local"))
    if row.get("heartbeat"):
        return composite.Heartbeat(row["producer"], stamp)
    return streams.StreamEvent(row["type"], stamp, dict(row.get("attributes", {})))


_EXAMPLE = ('{"producer": "PA", "type": "A", "ref": 1.0, "accuracy": 0.005, "attributes": {"id": "a0"}} (a heartbeat: '
            '{"producer": "PA", "heartbeat": true, "ref": 1.6})')


def _arrival_problem(row: object) -> str | None:
    """What keeps ``row`` (one parsed ``--input`` line) from being an :class:`Arrival`, or None."""
    def number(value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if not isinstance(row, dict):
        return f"{row!r} is no JSON object"
    if not isinstance(row.get("producer"), str) or not row["producer"]:
        return "'producer' is missing or no non-empty text"
    if not number(row.get("ref")):
        return "'ref' (the reference time, seconds) is missing or no number"
    if not row.get("heartbeat") and (not isinstance(row.get("type"), str) or not row["type"]):
        return "'type' is missing or no non-empty text (a heartbeat says \"heartbeat\": true)"
    for name in ("accuracy", "minus", "plus", "local", "arrival"):
        if row.get(name) is not None and not number(row[name]):
            return f"{name!r} is no number of seconds"
    if not isinstance(row.get("attributes", {}), dict):
        return "'attributes' is no JSON object"
    return None


def read_arrivals(path: Path) -> list[Arrival]:
    """``--input``'s arrivals, one JSON object a line (blank lines skipped); a file that cannot be read, or a line
    that is no arrival, is a ``click.ClickException`` naming the line and the format."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise click.ClickException(f"cannot read --input {path}: {error}; give JSON lines, one arrival each: "
                                   f"{_EXAMPLE}") from None
    rows: list[Arrival] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row: object = json.loads(line)
        except json.JSONDecodeError as error:
            problem: str | None = f"it is no JSON ({error})"
        else:
            problem = _arrival_problem(row)
        if problem is not None:
            raise click.ClickException(f"--input {path}, line {number}: {problem}; each line is one arrival, e.g. "
                                       f"{_EXAMPLE}")
        rows.append(cast(Arrival, row))
    return rows


def build(rows: list[Arrival], query: str, default_accuracy: float = 0.005) -> composite.CompositionEngine:
    """Run ``rows`` through an engine with ``query``; uncertainties take the first candidate."""
    engine = composite.CompositionEngine(name="plot", clock=composite.ManualClock(), timeout=None,
                                         on_uncertain=lambda uncertainty: uncertainty.candidates[0])
    types = sorted({row["type"] for row in rows if not row.get("heartbeat")})
    attributes = sorted({key for row in rows for key in row.get("attributes", {})})
    engine.create_stream("input", types=types, attributes=attributes)
    engine.define(query)
    produced: dict[str, set[str]] = {}
    for row in rows:
        produced.setdefault(row["producer"], set()).update(() if row.get("heartbeat") else (row["type"],))
    for producer, kinds in produced.items():
        engine.join(producer, types=sorted(kinds) or types)
    for row in rows:
        engine.signal(_item(row, default_accuracy))
    return engine


def register_commands(main: click.Group) -> None:
    from activedb.cli import _Group     # (the group's errors as the others': one line naming the command)

    @main.group(name="composite", cls=_Group)
    def composite_group() -> None:
        """Composite events from many producers (accuracy-interval time)."""

    @composite_group.command(name="plot")
    @click.option("--scenario", type=click.Choice(["fig3", "random"]), default=None,
                  help="A built-in window: the paper's Figure 3 scenario or random producers.")
    @click.option("--input", "input_path", type=click.Path(exists=True, dir_okay=False), default=None,
                  help="JSON lines of arrivals (the format: above).")
    @click.option("--query", show_default=True,
                  default="CREATE QUERY AB PATTERN AND(A, B) CONSUMING CHRONICLE RETURN A.id AS a, B.id AS b",
                  help="The composition to run over the window.")
    @click.option("--producers", default=3, show_default=True, type=click.IntRange(min=1),
                  help="random: number of producers.")
    @click.option("--accuracy-ms", default=5.0, show_default=True, type=click.FloatRange(min=0),
                  help="random: accuracy of every clock (ms).")
    @click.option("--events", default=24, show_default=True, type=click.IntRange(min=0),
                  help="random: number of events.")
    @click.option("--seed", default=1, show_default=True, help="random: seed.")
    @click.option("--out", "out", type=click.Path(dir_okay=False), required=True, help="The PNG to write.")
    def plot_command(scenario: str | None, input_path: str | None, query: str, producers: int, accuracy_ms: float,
                     events: int, seed: int, out: str) -> None:
        """Draw the accuracy intervals of a window of events per producer, their sync-points and the
        composition chosen (PNG). No database is needed; uncertainties take the first candidate (orange).

        \b
        activedb composite plot --scenario fig3 --out fig3.png
        activedb composite plot --scenario random --producers 4 --accuracy-ms 20 --seed 3 --out window.png

        --input reads JSON lines, one arrival each, in arrival order (each producer's in its own order):

        \b
        {"producer": "PA", "type": "A", "ref": 1.000, "accuracy": 0.005, "attributes": {"id": "a0"}}
        {"producer": "P2B", "heartbeat": true, "ref": 1.6, "accuracy": 0.005}

        (minus/plus instead of accuracy for asymmetric intervals; local for a local reading.) Producers join
        with the types they send."""
        if (scenario is None) == (input_path is None):
            raise click.UsageError("give exactly one of --scenario and --input")
        if input_path is not None:
            rows = read_arrivals(Path(input_path))
        elif scenario == "fig3":
            rows = FIG3
        else:
            rows = random_arrivals(producers, accuracy_ms / 1000.0, events, seed)
        engine = build(rows, query)
        try:
            path = composite.plot(engine.window(), out)
        except OSError as error:
            raise click.ClickException(f"cannot write the picture {out}: {error.strerror or error}; give --out a "
                                       f"file in a directory that exists and you may write") from None
        statistics = engine.statistics()
        click.echo(f"wrote {path}: {statistics.events} events, {statistics.heartbeats} heartbeats, "
                   f"{statistics.composites} composites, {statistics.uncertainties} uncertain choices")
