"""The rule path's handler (``activedb.ingest.RulesHandler``): what its constructor refuses."""

from __future__ import annotations

import pytest

from activedb.ingest import RulesHandler
from activedb.ingest.errors import IngestError


@pytest.mark.parametrize("prefetch", [5, ["items"], [("items", None)], "items", {"items": 5}, {5: None}],
                         ids=["a-number", "a-list-of-names", "a-list-of-pairs", "a-text", "a-number-as-how",
                              "a-number-as-table"])
def test_a_prefetch_that_is_no_mapping_of_table_to_how_is_refused_saying_what_to_give(prefetch):
    """``prefetch`` maps each table to how an event names its row (None: the event's key; a payload field's name; a
    callable): a number failed with dict()'s TypeError, a list of names or a text with its ValueError ('dictionary
    update sequence element #0 has length 5'), a list of pairs was taken, and a number as the how (or the table)
    read a payload field that cannot exist, prefetching nothing."""
    with pytest.raises(IngestError, match=r"prefetch maps each table's name to how an event names its row"):
        RulesHandler(prefetch)


def test_a_prefetch_of_tables_to_keys_fields_and_callables_is_taken():
    def key(event):
        return event.key

    handler = RulesHandler({"counters": None, "items": "item", "others": key})
    assert handler.prefetch == {"counters": None, "items": "item", "others": key}
    assert RulesHandler(None).prefetch == {} and RulesHandler({}).prefetch == {}
