"""``--plot`` draws a benchmark's report: its sweeps as lines (a reference series — a target or limit — as a
dashed line without markers), its rows against their baselines as bars; an unknown picture format is refused."""

from __future__ import annotations

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
