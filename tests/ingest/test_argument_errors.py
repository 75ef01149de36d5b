"""An ingestion (``Ingestion``, ``feed``) and its ``EventMapping`` refuse a wrong argument — a handler that is no
``BatchHandler``, deadlines that are no ``Deadlines``, an owner that is no ``ReservedSource``, a column name that is no
text, a ``RulesHandler`` shared by two databases — with an ``IngestError`` that says what to give."""

from __future__ import annotations

import pytest

import activedb
from activedb.ingest import (
    EventMapping,
    Ingestion,
    ReservedSource,
    RulesHandler,
    as_mapping,
    feed,
)
from activedb.ingest.errors import IngestError, MappingError

MAPPING = {"type_column": "type", "key_column": "key", "ts_column": "ts"}


@pytest.mark.parametrize("handler", [object(), RulesHandler, "rules"], ids=["an-object", "the-class", "a-name"])
def test_a_handler_that_is_no_batch_handler_is_refused_naming_the_handlers(db, handler):
    with pytest.raises(IngestError, match=r"handler must be an activedb\.ingest\.BatchHandler \(RulesHandler, "
                                          r"streams\.QueriesHandler, batch\.TpgHandler, composite\.CompositeHandler"):
        Ingestion(db, MAPPING, source="wrong-handler", handler=handler)


@pytest.mark.parametrize("deadlines", [5, {"batch": 5.0}], ids=["seconds", "a-dict"])
def test_deadlines_that_are_no_deadlines_are_refused(db, deadlines):
    with pytest.raises(IngestError, match=r"deadlines must be an activedb\.ingest\.Deadlines \(or None\), got"):
        Ingestion(db, MAPPING, source="wrong-deadlines", deadlines=deadlines)


@pytest.mark.parametrize("call", ["Ingestion", "feed"])
def test_an_owner_that_is_no_reserved_source_member_is_refused(db, call):
    with pytest.raises(IngestError, match=rf"{call}\(owner='replay:'\) takes a ReservedSource member, .* or None; "
                                          r"nothing was applied"):
        if call == "feed":
            feed(db, [], source="replay:x", owner="replay:", mapping=MAPPING)
        else:
            Ingestion(db, MAPPING, source="replay:x", owner="replay:")


@pytest.mark.parametrize("call", ["Ingestion", "feed"])
def test_an_owner_whose_prefix_the_source_lacks_says_to_use_its_source_name(db, call):
    with pytest.raises(IngestError, match=rf"{call}\(source='mine', owner=capture:\) names a source that does not "
                                          r"begin with 'capture:': give owner\.source\(name\); nothing was applied"):
        if call == "feed":
            feed(db, [], source="mine", owner=ReservedSource.CAPTURE, mapping=MAPPING)
        else:
            Ingestion(db, MAPPING, source="mine", owner=ReservedSource.CAPTURE)


@pytest.mark.parametrize("field, value", [("producer_column", ""), ("id_column", 5), ("accuracy_column", "")],
                         ids=["empty-producer", "numeric-id", "empty-accuracy"])
def test_an_optional_mapping_column_that_is_no_name_is_refused(field, value):
    with pytest.raises(MappingError, match=rf"EventMapping\.{field} must be a non-empty string or None, got "
                                           rf"{value!r}"):
        EventMapping(**MAPPING, **{field: value})


@pytest.mark.parametrize("column", ["", None, 3], ids=["empty", "none", "a-number"])
def test_a_payload_column_that_is_no_name_is_refused(column):
    with pytest.raises(MappingError, match=rf"payload column names must be non-empty strings, got {column!r}"):
        EventMapping(**MAPPING, payload_columns=["room", column])


@pytest.mark.parametrize("mapping", [5, ["type", "key", "ts"]], ids=["a-number", "a-list"])
def test_a_mapping_that_is_neither_an_event_mapping_nor_a_dict_is_refused(db, mapping):
    with pytest.raises(MappingError, match="a mapping is an EventMapping or a dict of its arguments, got"):
        as_mapping(mapping)
    with pytest.raises(IngestError, match="mapping: a mapping is an EventMapping or a dict of its arguments"):
        Ingestion(db, mapping, source="wrong-mapping")


def test_a_rules_handler_feeds_one_database(db, migrated):
    handler = RulesHandler()
    Ingestion(db, MAPPING, source="first", handler=handler)
    other = activedb.connect(migrated)
    try:
        with pytest.raises(IngestError, match="this RulesHandler already feeds another database; give each "
                                              "ingestion its own"):
            Ingestion(other, MAPPING, source="second", handler=handler)
        Ingestion(other, MAPPING, source="second", handler=RulesHandler())
    finally:
        other.close()
