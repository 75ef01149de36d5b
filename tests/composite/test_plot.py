"""``composite.plot``'s time axis: long empty stretches are compressed by a monotone map, so millisecond
intervals in a window of seconds are drawn wide enough to see, and order and overlap are kept."""

from __future__ import annotations

import itertools

import pytest

from click.testing import CliRunner

from activedb.cli import main
from activedb.composite._plot import _TimeAxis


def test_the_map_is_monotone_and_keeps_overlap():
    intervals = [(0, 10), (5, 15), (1000, 1010), (1004, 1012), (2500, 2510)]
    axis = _TimeAxis([end for interval in intervals for end in interval], [high - low for low, high in intervals])
    samples = sorted({value for low, high in intervals for value in (low, high, (low + high) / 2)} | {500, 1800})
    drawn = [axis(value) for value in samples]
    assert drawn == sorted(drawn) and len(set(drawn)) == len(drawn)
    for (low, high), (other_low, other_high) in itertools.combinations(intervals, 2):
        overlaps = low <= other_high and other_low <= high
        assert overlaps == (axis(low) <= axis(other_high) and axis(other_low) <= axis(high))
    assert len(axis.breaks) == 2
    span = axis(2510) - axis(0)
    assert all((axis(high) - axis(low)) / span > 0.05 for low, high in intervals)     # no slivers


def test_an_axis_without_long_gaps_is_not_compressed():
    axis = _TimeAxis([0, 40, 60, 100, 130, 170], [40, 40, 40])
    assert axis.breaks == [] and [axis(value) - axis(0) for value in (0, 60, 170)] == [0, 60, 170]


def test_the_fig3_scenario_draws(tmp_path):
    out = tmp_path / "fig3.png"
    result = CliRunner().invoke(main, ["composite", "plot", "--scenario", "fig3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_random_window_draws_the_same_picture_for_the_same_seed(tmp_path):
    """``--scenario random``: producer 0 sends A, the others B, with clocks off by up to --accuracy-ms; one seed,
    one window."""
    pictures = []
    for name in ("first.png", "again.png"):
        result = CliRunner().invoke(main, ["composite", "plot", "--scenario", "random", "--producers", "4",
                                           "--accuracy-ms", "20", "--events", "12", "--seed", "3",
                                           "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        pictures.append((tmp_path / name).read_bytes())
    assert pictures[0][:8] == b"\x89PNG\r\n\x1a\n" and pictures[0] == pictures[1]


def test_the_axis_unit_is_a_time_unit():
    from activedb.composite import plot
    from activedb.errors import InvalidChoice

    with pytest.raises(InvalidChoice, match=r"plot\(unit=\.\.\.\)='minutes' is not a TimeUnit: use one of TimeUnit.S"):
        plot(None, "never.png", unit="minutes")          # refused before anything is drawn


GOOD = '{"producer": "PA", "type": "A", "ref": 1.0, "attributes": {"id": "a0"}}'


@pytest.mark.parametrize("line, said", [
    ('{"producer": "PA", "type": "A", "ref": 1.0', "is no JSON"),                  # cut short
    ("[1, 2]", "is no JSON object"),
    ('{"type": "B", "ref": 1.0}', "'producer'"),
    ('{"producer": "PB", "type": "B"}', "'ref'"),
    ('{"producer": "PB", "type": "B", "ref": "soon"}', "'ref'"),
    ('{"producer": "PB", "ref": 2.0}', "'type'"),                                   # no type, and no heartbeat
    ('{"producer": "PB", "type": "B", "ref": 2.0, "attributes": 5}', "'attributes'"),
    ('{"producer": "PB", "type": "B", "ref": 2.0, "accuracy": "5 ms"}', "'accuracy'"),
])
def test_an_input_line_that_is_no_arrival_is_one_line_naming_it(tmp_path, line, said):
    """A malformed --input line was a traceback (JSONDecodeError, AttributeError, KeyError, TypeError from deep in
    the engine): it is one line naming the file's line, what is wrong and the format."""
    arrivals = tmp_path / "window.jsonl"
    arrivals.write_text(f"{GOOD}\n\n{line}\n")
    result = CliRunner().invoke(main, ["composite", "plot", "--input", str(arrivals), "--out",
                                       str(tmp_path / "window.png")])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    message = result.output.strip()
    assert message.startswith("activedb: error: ") and "\n" not in message, message
    assert f"{arrivals}, line 3" in message and said in message and '"producer"' in message, message
    assert not (tmp_path / "window.png").exists()


def test_an_input_that_is_no_text_is_one_line(tmp_path):
    arrivals = tmp_path / "window.jsonl"
    arrivals.write_bytes(b"\xff\xfe\x00")
    result = CliRunner().invoke(main, ["composite", "plot", "--input", str(arrivals), "--out",
                                       str(tmp_path / "window.png")])
    assert result.exit_code == 1 and result.output.startswith("activedb: error: "), result.output
    assert str(arrivals) in result.output


@pytest.mark.parametrize("where", ["missing/fig3.png", "a_file/fig3.png"])
def test_a_picture_that_cannot_be_written_is_one_line(tmp_path, where):
    """--out in a directory that does not exist (or below a file) was matplotlib's FileNotFoundError as a traceback."""
    (tmp_path / "a_file").write_text("")
    out = tmp_path / where
    result = CliRunner().invoke(main, ["composite", "plot", "--scenario", "fig3", "--out", str(out)])
    assert result.exit_code == 1, result.output
    message = result.output.strip()
    assert message.startswith("activedb: error: cannot write") and "\n" not in message, message
    assert str(out) in message


@pytest.mark.parametrize("option, value", [("--producers", "0"), ("--producers", "-2"), ("--events", "-1"),
                                           ("--accuracy-ms", "-5")])
def test_a_random_window_option_out_of_range_is_refused_naming_the_option(tmp_path, option, value):
    """--producers 0 said 'query AB: stream input has no event type 'A' (types: )', --accuracy-ms -5 'α⁻ must be a
    non-negative number of seconds', and --events -1 drew a window without events: none named the option."""
    result = CliRunner().invoke(main, ["composite", "plot", "--scenario", "random", option, value, "--out",
                                       str(tmp_path / "window.png")])
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output, result.output
    assert not (tmp_path / "window.png").exists()


def test_a_picture_that_cannot_be_written_leaves_no_figure_open(tmp_path):
    """``composite.plot`` to a path it cannot write let savefig's OSError out before closing its figure, so each failed
    call kept one more figure (with everything it drew) open in pyplot, as ``batch.render_tpg`` did before 1e981599."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (tmp_path / "a_file").write_text("")
    open_before = plt.get_fignums()
    for _ in range(2):
        result = CliRunner().invoke(main, ["composite", "plot", "--scenario", "fig3",
                                           "--out", str(tmp_path / "a_file" / "fig3.png")])
        assert result.exit_code == 1, result.output
    assert plt.get_fignums() == open_before
