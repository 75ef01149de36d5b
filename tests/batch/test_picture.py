"""The picture of a small batch's TPG: edge kinds and operation states, drawn to PNG."""

from __future__ import annotations

from activedb import batch
from tests.batch.test_paper_examples import FIG1_STATE, fig1_events, fig1_transactions


def test_graph_has_edge_kinds_and_states():
    graph = batch.tpg_graph(fig1_transactions(), fig1_events(v2=50), FIG1_STATE)
    kinds = {data["kind"] for _, _, data in graph.edges(data=True)}
    assert kinds == {"TD", "PD", "LD"}
    states = [graph.nodes[node]["state"] for node in sorted(graph.nodes)]
    assert states == ["EXE", "ABT", "ABT", "ABT", "ABT"]
    assert graph.graph["aborted"] == {1: "Read(A) <= 50", 2: "Read(B) <= 3"}


def test_render_to_png(tmp_path):
    path = batch.render_tpg(fig1_transactions(), fig1_events(v2=50), tmp_path / "fig1.png", FIG1_STATE)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_an_insert_into_several_tables_is_labelled_with_every_table():
    from tests.batch.test_inserts import INTO, _into_events

    graph = batch.tpg_graph(INTO, _into_events()[:2], {})
    labels = [graph.nodes[node]["label"] for node in sorted(graph.nodes)]
    assert labels[1] == "O2\ninsert\nevents_seen,stream_alerts[?]" and labels[0] == "O1\nwrite\nitems['a']"


def test_a_picture_that_cannot_be_written_is_a_picture_error_and_leaves_no_figure_open(tmp_path):
    """``render_tpg`` into a folder that cannot be made or written (a file in the way) let matplotlib's OSError out, no
    ActivedbError, and left its figure open in pyplot (each failed call one more figure kept, with all it drew)."""
    import matplotlib.pyplot as plt
    import pytest

    from activedb.errors import PictureError

    blocked = tmp_path / "file"
    blocked.write_text("")
    open_before = plt.get_fignums()
    with pytest.raises(PictureError, match=r"cannot draw .*fig1\.png: .*choose a file in a folder you may write"):
        batch.render_tpg(fig1_transactions(), fig1_events(v2=50), blocked / "fig1.png", FIG1_STATE)
    assert plt.get_fignums() == open_before
