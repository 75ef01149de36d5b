"""Rows to a composition engine's inputs (``activedb.composite.rows_to_items``): bad rows are rejected, never raised."""

from __future__ import annotations

from activedb.composite import Heartbeat, rows_to_items
from activedb.ingest import EventMapping

MAPPING = EventMapping("kind", "id", "ts", payload_columns=[], producer_column="producer", accuracy_column="accuracy",
                       type_map={"a": "A", 2: "B"}, heartbeat_type="beat")


def test_a_row_whose_type_cannot_be_looked_up_in_the_type_map_is_rejected_and_the_others_are_taken():
    """With ``type_map``, a row whose type is a list (an array column) is a rejected row naming the field, as any
    other bad type is — not a TypeError (unhashable) that failed the whole batch."""
    rows = [{"producer": "P", "kind": "a", "ts": 1.0, "id": "x", "accuracy": 0.001},
            {"producer": "P", "kind": ["a"], "ts": 2.0, "id": "y", "accuracy": 0.001},
            {"producer": "P", "kind": 2, "ts": 3.0, "id": "z", "accuracy": 0.001},
            {"producer": "P", "kind": "beat", "ts": 4.0, "id": None, "accuracy": 0.001}]
    items, rejected = rows_to_items(rows, MAPPING)
    assert [item.type if not isinstance(item, Heartbeat) else "heartbeat" for item in items] == ["A", "B",
                                                                                                  "heartbeat"]
    assert [(row.position, row.reason) for row in rejected] == [(1, "event type ('kind') is ['a'], need a "
                                                                    "non-empty string")]
