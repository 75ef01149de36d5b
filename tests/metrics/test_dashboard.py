"""The Grafana dashboard shipped beside the exporter (``activedb/metrics/grafana-dashboard.json``) has the
fields Grafana's dashboard model requires for an import, and every metric its queries name is one the
exporter really exports (read from a scrape of a real exporter on real PostgreSQL)."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
from prometheus_client.parser import text_string_to_metric_families

import activedb
from activedb.metrics import MetricsExporter

PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text"}
GRID_COLUMNS = 24
PROMQL_WORDS = {"sum", "by", "rate", "increase", "max", "min", "histogram_quantile", "le", "without", "avg"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    text = resources.files("activedb.metrics").joinpath("grafana-dashboard.json").read_text()
    return json.loads(text)


@pytest.fixture(scope="module")
def exported(database_url) -> set[str]:
    """Every sample name the exporter can produce (a counter's ``_total``, a histogram's ``_bucket``…)."""
    database = activedb.connect(database_url)
    try:
        text = MetricsExporter(database).scrape()
    finally:
        database.close()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {family.name + suffix for family in text_string_to_metric_families(text)
            for suffix in suffixes[family.type]}


def test_the_dashboard_has_the_fields_an_import_needs(dashboard):
    for field, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list),
                        ("templating", dict), ("time", dict), ("version", int)):
        assert isinstance(dashboard.get(field), kind), field
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["schemaVersion"] >= 36
    [variable] = [item for item in dashboard["templating"]["list"] if item["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(number, int) for number in ids)
    for panel in dashboard["panels"]:
        assert panel["type"] in PANEL_TYPES and panel["title"], panel
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in ("x", "y", "w", "h"))
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= GRID_COLUMNS and grid["h"] > 0, panel["title"]
        assert panel["datasource"]["uid"] == "${" + variable["name"] + "}"
        assert panel["targets"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        assert all(target["expr"].strip() for target in panel["targets"])


def test_every_metric_a_query_names_is_exported(dashboard, exported):
    named = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            # drop label matchers, ranges, strings and grouping clauses: what remains names metrics
            without_labels = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"|\b(by|without)\s*\([^)]*\)", "", target["expr"])
            named |= {word for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_labels)
                      if word not in PROMQL_WORDS and not word.startswith("$")}
    assert named, "the dashboard queries nothing"
    assert named <= exported, f"not exported: {sorted(named - exported)}"
    families = {name.removesuffix("_total").removesuffix("_bucket") for name in named}
    for needed in ("activedb_ingest_events", "activedb_ingest_batches", "activedb_batch_seconds",
                   "activedb_rule_firings", "activedb_dead_letters", "activedb_outbox_firings",
                   "activedb_capture_backlog_changes", "activedb_lock_waits", "activedb_deadlocks"):
        assert needed in families, needed
