"""``--plot`` draws a benchmark's report: its sweeps as lines (a reference series — a target or limit — as a
dashed line without markers), its rows against their baselines as bars; an unknown picture format is refused."""

from __future__ import annotations

import re
import time

import pytest

from benchmarks.plot import PictureError, plot_report
from benchmarks.report import BenchReport, Row, Series


def _report() -> BenchReport:
    report = BenchReport("a benchmark")
    report.add(Row(name="a row", value=2.0, unit="x/s", baseline_name="the baseline", baseline=4.0, ratio=0.5,
                   target=">= 0.4", met=True))
    report.add_series(Series("a sweep", "measured", "size", "ms", [(1, 10.0), (2, 11.0), (3, 11.5)]))
    report.add_series(Series("a sweep", "the target: the lowest + 15 %", "size", "ms", [(1, 11.5), (3, 11.5)],
                             reference=True))
    return report


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_a_report_with_a_reference_line_is_drawn(tmp_path, suffix):
    path = plot_report(_report(), tmp_path / f"bench.{suffix}")
    assert path.stat().st_size > 1000
    if suffix == "svg":
        text = path.read_text()
        assert "the target: the lowest + 15 %" in text and "measured" in text
        assert "stroke: #808080" in text and "stroke-dasharray" in text     # the reference: grey, dashed


def test_a_picture_is_png_or_svg(tmp_path):
    with pytest.raises(PictureError, match=r"\.png or \.svg"):
        plot_report(_report(), tmp_path / "bench.txt")


def _svg(report: BenchReport, tmp_path) -> str:
    return plot_report(report, tmp_path / "bench.svg").read_text()


def test_a_bar_is_coloured_by_its_goal_on_the_ratio_it_draws(tmp_path):
    """Issue 56: a bar's colour judges the ratio drawn (a 1.04 that misses its goal of 1.5 is red, a 0.992 that
    reaches 0.9 green; the goal is marked and written), a target on another figure leaves it grey and is
    written beside it — not a colour judged on something else."""
    report = BenchReport("colours")
    report.add(Row(name="misses", value=104.0, unit="x/s", baseline_name="b", baseline=100.0, ratio=1.04,
                   target=">= 1.5 of b", met=False, goal=1.5))
    report.add(Row(name="reaches", value=99.2, unit="x/s", baseline_name="b", baseline=100.0, ratio=0.992,
                   target=">= 0.90 of b", met=True, goal=0.9))
    report.add(Row(name="elsewhere", value=3.0, unit="µs", baseline_name="b", baseline=2.0, ratio=0.667,
                   target="<= 2 µs", met=False))
    text = _svg(report, tmp_path)
    red, green, grey = "fill: #dc2626", "fill: #16a34a", "fill: #9ca3af"
    assert (text.count(red), text.count(green), text.count(grey)) == (2, 2, 2), "one bar each, plus the key"
    assert "1.04  (goal 1.5)" in text and "0.992  (goal 0.9)" in text
    assert "0.667  (other target: missed)" in text


def test_labels_wrap_a_one_size_sweep_says_so_and_a_quick_run_is_marked(tmp_path):
    name = ("1,000 events/batch: hand-hygiene ECA rules, where the time goes: the sink's Python vs PostgreSQL's "
            "server time per event (COPY), without Spark")
    report = BenchReport("sizes", quick=True)
    report.add(Row(name=name, value=2.0, unit="x/s", baseline_name="PL/pgSQL peer", baseline=4.0, ratio=0.5))
    report.add_series(Series("events/s by batch size", "rules", "events per micro-batch", "events/s",
                             [(1000, 4200.0)], log_x=True, log_y=True))
    report.add_series(Series("events/s by batch size", "PL/pgSQL peer", "events per micro-batch", "events/s",
                             [(1000, 5100.0)], log_x=True, log_y=True))
    text = _svg(report, tmp_path)
    assert "…" not in text
    words = name.split()
    assert all(word in text for word in words), [word for word in words if word not in text]
    assert "one size measured (1k)" in text
    assert "QUICK RUN" in text


def test_a_long_title_wraps_to_the_figure_instead_of_running_off_it(tmp_path):
    """Issue 56: a quick run's title (the benchmark's title and the quick-run notice) ran off the picture's right
    edge; it wraps to the figure's width, every word kept."""
    report = BenchReport("stream transactions: SEI vs S2PL vs LWM (activedb bench streams)", quick=True)
    report.add(Row(name="a row", value=2.0, unit="x/s", baseline_name="b", baseline=4.0, ratio=0.5))
    text = _svg(report, tmp_path)
    title = "stream transactions: SEI vs S2PL vs LWM (activedb bench streams) — QUICK RUN (--quick): smoke sizes, " \
            "not the benchmark's figures"
    lines = [line.replace("- -", "--") for line in re.findall(r"<!-- (.*?) -->", text)]   # each drawn line
    drawn = [line for line in lines if line in title and len(line) > 20]      # (not the faint "QUICK RUN")
    assert title not in drawn, "drawn as one line: wider than the picture"
    assert " ".join(drawn).split() == title.split(), lines


def test_a_report_says_how_the_machine_shared_its_cpus_during_the_run(capsys):
    """The JSON and the table say what the machine did from the report's start: the load average, and the shares of
    the CPUs' time busy, idle, waiting for I/O and stolen by a hypervisor, which sum to one."""
    from benchmarks.report import cpu_times

    report = _report()
    if report.started_cpu is None:
        pytest.skip("no /proc/stat on this system")
    deadline = time.monotonic() + 30
    while sum(cpu_times() or ()) - sum(report.started_cpu) < 10 and time.monotonic() < deadline:
        sum(number * number for number in range(100_000))       # CPU time between the two readings
    during = report.to_json()["machine_during_run"]
    assert len(during["load_average"]) == 3
    share = during["cpu_share"]
    assert set(share) == {"busy", "idle", "iowait", "steal"}
    assert abs(sum(share.values()) - 1.0) < 0.01 and share["busy"] > 0
    assert cpu_times() is not None
    report.print_table()
    printed = capsys.readouterr().out
    assert "load average" in printed and "stolen by the hypervisor" in printed
