"""The textual language: Active CEP's Q1/R1 as printed, the same in Python, errors with line
and column, unknown names caught at definition time."""

from __future__ import annotations

import pytest

from activedb import streams
from activedb.streams import algebra as ast
from activedb.errors import UnknownTable
from activedb.streams.errors import DefinitionError, QuerySyntaxError, UnknownAttribute, UnknownName, UnknownQueryTable
from tests.streams.conftest import BADGE_TYPES, Q1_R1, Q2, badge, hygiene_engine, set_status, statuses


def engine_for(db, **options):
    engine = streams.StreamEngine(db, name="language", durable=False, **options)
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    return engine


def python_q1_r1():
    EXIT, ENTER = streams.event("EXIT"), streams.event("ENTER")
    query = streams._builders.query_definition(
        "Q1", stream="estream", pattern=streams.seq("EXIT", streams.not_("SANITIZE"), "ENTER"),
        where=[streams.same("HCW-ID"),
               EXIT["location"] != ENTER["location"],
               streams.lit("safe") == streams.store("workerStatus", "status", workerID=ENTER["HCW-ID"])],
        within=45, returns=[ENTER["HCW-ID"], ENTER["location"]])
    rule = streams._builders.rule_definition(
        "R1", on_output="Q1", new="newEvent",
        action=streams.update("workerStatus", set={"status": "warning"},
                              where={"workerID": streams.event("newEvent")["HCW-ID"]}))
    return query, rule


def test_q1_r1_as_printed_parse_to_the_python_definitions():
    query, rule = streams.parse(Q1_R1)
    assert (query, rule) == python_q1_r1()
    assert query.within == 45.0 and query.stream == "estream"
    assert [item.name for item in query.returns] == ["HCW-ID", "location"]
    assert rule.new_alias == "newEvent" and isinstance(rule.actions[0], ast.UpdateAction)


def test_q1_r1_in_python_run_like_the_text(db):
    set_status(db, w1="safe", w2="safe")
    engine = engine_for(db)
    EXIT, ENTER = streams.event("EXIT"), streams.event("ENTER")
    engine.query("Q1", stream="estream", pattern=streams.seq("EXIT", streams.not_("SANITIZE"), "ENTER"),
                 where=[streams.same("HCW-ID"), EXIT.location != ENTER.location,
                        streams.lit("safe") == streams.store("workerStatus", "status", workerID=ENTER["HCW-ID"])],
                 within=45, returns=[ENTER["HCW-ID"], ENTER.location])
    engine.rule("R1", on_output="Q1", new="newEvent",
                action=streams.update("workerStatus", set={"status": "warning"},
                                      where={"workerID": streams.event("newEvent")["HCW-ID"]}))
    events = [badge("EXIT", 1, "w1", "a"), badge("EXIT", 2, "w2", "a"), badge("SANITIZE", 3, "w2", "hall"),
              badge("ENTER", 10, "w1", "b"), badge("ENTER", 11, "w2", "b")]
    result = engine.feed(events, punctuation=streams.END_OF_STREAM)
    assert [(output.query, output["HCW-ID"]) for output in result.outputs] == [("Q1", "w1")]
    assert statuses(db) == {"w1": "warning", "w2": "safe"}


def test_paper_clause_order_and_the_appendix_order_both_parse():
    appendix = Q1_R1.replace("CREATE QUERY Q1 ON estream\nPATTERN SEQ(EXIT, !SANITIZE, ENTER)",
                             "CREATE QUERY Q1\nPATTERN SEQ(EXIT, !SANITIZE, ENTER) ON estream")
    assert streams.parse(appendix) == streams.parse(Q1_R1)


def test_extensions_and_expressions_parse():
    (query,) = streams.parse("""
        create query Hot on s pattern seq(A a1, !B, A a2)   -- aliases for a repeated type
        where [key] and a2.x - a1.x >= 2 * 3 and not (a1.y is null) and exists (select * from t where k = a2.key)
        within 1500 ms matching skip till next match priority 5
        return a2.key, a2.x + 1 as next_x""")
    assert query.selection is streams.Selection.SKIP_TILL_NEXT_MATCH
    assert query.within == 1.5 and query.priority == 5
    assert [component.name for component in query.pattern.components()] == ["a1", "B", "a2"]
    assert query.returns[1].name == "next_x"


@pytest.mark.parametrize("text, line, column, words", [
    ("CREATE QUERY Q PATTERN SEQ(A, B\nRETURN A.x", 2, 1, "expected ')' to close SEQ("),
    ("CREATE QUERY Q\n  PATTERN SEQ(A)\n  WITHIN 45\n  RETURN A.x", 4, 3, "time unit"),
    ("CREATE QUERY Q PATTERN SEQ(A) RETURN A.x + 1", 1, 38, "name this RETURN expression with AS"),
    ("CREATE QUERY Q PATTERN SEQ(A) WHERE A.s = 'open\nRETURN A.x", 1, 43, "unterminated string"),
    ("CREATE RULE R ON OUTPUT Q\nBEGIN\n  UPDATE t SET a = 1\nEND", 4, 1, "expected WHERE"),
    ("CREATE RULE R ON Q BEGIN END", 1, 18, "expected OUTPUT"),
    ("CREATE QUERY Q PATTERN SEQ(A) WHERE A.x = # RETURN A.x", 1, 43, "unexpected character '#'"),
    ("CREATE TABLE t", 1, 8, "expected QUERY or RULE"),
    ("CREATE QUERY Q PATTERN SEQ(A) WHERE A.k = (SELECT * FROM t WHERE k = 1) RETURN A.x", 1, 43,
     "scalar subquery selects one column"),
])
def test_syntax_errors_point_at_line_and_column(text, line, column, words):
    with pytest.raises(QuerySyntaxError) as caught:
        streams.parse(text)
    assert (caught.value.line, caught.value.column) == (line, column)
    assert words in str(caught.value)
    assert str(caught.value).startswith(f"line {line}, column {column}: ")
    assert "^" in str(caught.value)            # the line is shown with a caret


@pytest.mark.parametrize("text, error, line, column, words", [
    (Q1_R1.replace("workerStatus\nWHERE", "workerStatuses\nWHERE"), UnknownQueryTable, 5, 28, "no table 'workerStatuses'"),
    (Q1_R1.replace("SELECT status FROM", "SELECT state FROM"), UnknownAttribute, 5, 27, "no column 'state'"),
    (Q1_R1.replace("EXIT.location !=", "EXIT.room !="), UnknownAttribute, 4, 1, "no attribute 'room'"),
    (Q1_R1.replace("[HCW-ID]", "[worker]"), UnknownAttribute, 3, 7, "no attribute 'worker'"),
    (Q1_R1.replace("SEQ(EXIT, !SANITIZE", "SEQ(EXIT, !WASH"), UnknownName, 2, 19, "no event type 'WASH'"),
    (Q1_R1.replace("ON estream", "ON badges"), UnknownName, 1, 1, "no stream 'badges'"),
    (Q1_R1.replace("newEvent.HCW-ID", "newEvent.worker"), UnknownAttribute, 16, 18, "returns no attribute 'worker'"),
    (Q1_R1.replace("UPDATE workerStatus SET status", "UPDATE workerStatus SET colour"), UnknownAttribute, 15, 1,
     "no column 'colour'"),
    (Q1_R1.replace("WHERE workerID = newEvent.HCW-ID", "WHERE status = newEvent.HCW-ID"), DefinitionError, 15, 1,
     "whole primary key"),
    (Q1_R1.replace("ON OUTPUT Q1", "ON OUTPUT Q9"), UnknownName, 10, 1, "no such query"),
    (Q1_R1.replace("SEQ(EXIT, !SANITIZE, ENTER)", "SEQ(EXIT, ENTER, !SANITIZE)"), DefinitionError, 2, 26,
     "must stand between two positive events"),
    (Q1_R1.replace("RETURN ENTER.HCW-ID", "RETURN SANITIZE.HCW-ID"), DefinitionError, 8, 8, "negative event"),
])
def test_unknown_names_fail_at_definition_time(db, text, error, line, column, words):
    engine = engine_for(db)
    with pytest.raises(error) as caught:
        engine.define(text)
    assert words in str(caught.value)
    assert (caught.value.line, caught.value.column) == (line, column), str(caught.value)


def test_python_definitions_fail_at_definition_time_too(db):
    engine = engine_for(db)
    with pytest.raises(UnknownQueryTable, match="no table 'nowhere'") as caught:
        engine.query("Q", pattern="ENTER", returns=[streams.event("ENTER")["HCW-ID"]],
                     where=streams.exists("nowhere", id=streams.event("ENTER")["HCW-ID"]))
    assert isinstance(caught.value, UnknownTable)     # the store's error too: one class per name
    with pytest.raises(UnknownAttribute, match="no attribute 'badge'"):
        engine.query("Q", pattern="ENTER", returns=[streams.event("ENTER")["badge"]])
    with pytest.raises(TypeError, match="&, \\| and ~"):
        engine.query("Q", pattern="ENTER", returns=[streams.event("ENTER")["HCW-ID"]],
                     where=streams.event("ENTER").location == "a" and streams.event("ENTER").location == "b")
    assert engine.queries == {}


def test_hygiene_engine_accepts_q2(db):
    engine = hygiene_engine(db, durable=False)
    assert set(engine.queries) == {"Q1", "Q2"}
    assert engine.queries["Q2"].accepting_type == "EXIT"
    assert Q2.startswith("CREATE QUERY Q2")


@pytest.mark.parametrize("text", [None, 5, Q2.encode()], ids=["none", "a-number", "bytes"])
def test_a_definition_that_is_no_text_is_a_definition_error(db, text):
    """``engine.define(…)`` and ``streams.parse(…)`` take the definitions' text: anything else is a DefinitionError
    (an ActivedbError) saying what to give — it was a bare TypeError."""
    engine = streams.StreamEngine(db, name="no_text", durable=False)
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    with pytest.raises(DefinitionError, match=r"take the definitions' text \(CREATE QUERY"):
        engine.define(text)
    with pytest.raises(DefinitionError, match=r"take the definitions' text"):
        streams.parse(text)
    assert engine.queries == {}


@pytest.mark.parametrize("name, options, match", [
    (None, {}, r"a stream's name is a non-empty text, got None"), ("", {}, r"a stream's name is a non-empty text"),
    ("estream", {"tie_key": 5}, r"stream estream: tie_key is a function event -> sortable \(or None\), got 5"),
], ids=["none-name", "empty-name", "number-tie-key"])
def test_a_stream_s_name_or_tie_key_of_the_wrong_kind_is_refused(db, name, options, match):
    """``create_stream`` refuses a name that is no non-empty text and a tie_key that is no function: both were taken —
    a stream named None, and a tie_key of 5 called on every event with equal timestamps, each then a dead letter
    ('int' object is not callable)."""
    engine = streams.StreamEngine(db, name="bad_stream", durable=False)
    with pytest.raises(DefinitionError, match=match):
        engine.create_stream(name, types=BADGE_TYPES, **options)
    assert engine.streams == {}


def test_a_stream_whose_name_differs_from_a_declared_one_only_in_case_is_refused(db):
    """A query's ``ON`` names its stream as SQL names an unquoted name, ignoring case (as query names are unique
    ignoring case): streams ``estream`` and ``ESTREAM`` were both taken, and ``ON Estream`` then named neither
    ("no stream 'Estream'"), though each alone would be found.  The second is refused, naming the first; the
    composition engine's streams alike."""
    from activedb import composite

    engine = streams.StreamEngine(db, name="cased", durable=False)
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    with pytest.raises(DefinitionError, match=r"stream 'ESTREAM' differs from the declared stream 'estream' only in "
                                              r"case.*give it another name"):
        engine.create_stream("ESTREAM", types=BADGE_TYPES, attributes=("HCW-ID",))
    with pytest.raises(DefinitionError, match=r"stream 'estream' is already declared"):
        engine.create_stream("estream", types=BADGE_TYPES)
    assert list(engine.streams) == ["estream"]
    engine.define("CREATE QUERY QX ON Estream PATTERN SEQ(EXIT, ENTER) RETURN EXIT.location")
    composer = composite.CompositionEngine(timeout=None)
    composer.create_stream("s", types=["A"])
    with pytest.raises(DefinitionError, match=r"stream 'S' differs from the declared stream 's' only in case"):
        composer.create_stream("S", types=["B"])


@pytest.mark.parametrize("options, twice", [
    ({"attributes": ["HCW-ID", "location", "HCW-ID"]}, "HCW-ID"),
    ({"attributes": ["HCW-ID"], "type_attributes": {"EXIT": ["room", "room"]}}, "room"),
    ({"attributes": ["HCW-ID", "room"], "type_attributes": {"EXIT": ["room"]}}, "room"),
], ids=["attributes", "one-type", "type-and-stream"])
def test_an_attribute_declared_twice_is_refused(db, options, twice):
    """``create_stream(attributes=["k", "k"])`` was taken (an event type's attributes then listed it twice), where a
    type declared twice is refused; so was an attribute given twice to one type, or to a type and to the stream."""
    engine = streams.StreamEngine(db, name="twice", durable=False)
    with pytest.raises(DefinitionError, match=rf"stream estream: attribute '{twice}' is declared twice.*once"):
        engine.create_stream("estream", types=BADGE_TYPES, **options)
    assert engine.streams == {}


@pytest.mark.parametrize("options, clash", [
    ({"attributes": ["HCW-ID", "location", "Location"]}, ("location", "Location")),
    ({"attributes": ["HCW-ID"], "type_attributes": {"EXIT": ["room", "ROOM"]}}, ("room", "ROOM")),
    ({"attributes": ["HCW-ID", "room"], "type_attributes": {"exit": ["Room"]}}, ("room", "Room")),
], ids=["attributes", "one-type", "type-and-stream"])
def test_attributes_differing_only_in_case_are_refused(db, options, clash):
    """The text finds an attribute as SQL an unquoted name (the one spelled so, else the one equal ignoring case), so
    of attributes ``room`` and ``ROOM`` a query's ``EXIT.Room`` named neither ("no attribute 'Room'"), though each
    alone is found so; event types, streams and queries differing only in case are refused already.  Such a
    declaration is refused, naming the two; two types may each have their own spelling (an ``A.k`` names one type's)."""
    engine = streams.StreamEngine(db, name="cased_attributes", durable=False)
    first, second = clash
    with pytest.raises(DefinitionError, match=rf"stream estream: attributes '{first}' and '{second}' differ only in "
                                              rf"case.*give them names that differ otherwise"):
        engine.create_stream("estream", types=BADGE_TYPES, **options)
    assert engine.streams == {}
    engine.create_stream("estream", types=BADGE_TYPES, attributes=["HCW-ID"],
                         type_attributes={"EXIT": ["room"], "ENTER": ["ROOM"]})
    engine.define("CREATE QUERY QR ON estream PATTERN SEQ(EXIT, ENTER) WHERE EXIT.Room = ENTER.Room RETURN EXIT.room")


@pytest.mark.parametrize("build", [lambda: streams.seq(None), lambda: streams.seq("EXIT", 5),
                                   lambda: streams.conj(["EXIT", "ENTER"]), lambda: streams.component(None),
                                   lambda: streams.not_(5)],
                         ids=["seq-none", "seq-a-number", "conj-a-list", "component-none", "not-a-number"])
def test_a_pattern_component_that_is_no_event_type_is_refused_when_built(build):
    """``seq(None)`` (a number, a list; ``component(None)``, ``not_(5)``) was taken, and defining the query failed
    later with a bare AttributeError ("'NoneType' object has no attribute 'casefold'"), no ActivedbError."""
    with pytest.raises(DefinitionError, match=r"an event component is the name of an event type \(a text\)"):
        build()


@pytest.mark.parametrize("options, match", [
    ({"types": [None]}, r"types is a collection of names \(texts\)"), ({"types": 5}, r"types is a collection of names"),
    ({"attributes": ["HCW-ID", 5]}, r"attributes is a collection of names"),
    ({"attributes": None}, r"attributes is a collection of names"),
    ({"priorities": {5: 1}}, r"priorities maps event type names \(texts\) to numbers"),
    ({"priorities": ["EXIT"]}, r"priorities maps event type names"),
], ids=["types-none", "types-number", "attribute-number", "attributes-none", "priority-key-number", "priorities-list"])
def test_a_stream_s_names_of_the_wrong_kind_are_refused_saying_what_to_give(db, options, match):
    """``create_stream`` takes texts for its types, attributes and priorities' keys: types=[None] or priorities={5: 1}
    failed with a bare AttributeError ('has no attribute casefold'), types=5 or attributes=None with a TypeError ('not
    iterable'), priorities=['EXIT'] with dict()'s ValueError, and attributes=['HCW-ID', 5] was taken, every query
    naming an attribute of the stream then failing with an AttributeError — none an ActivedbError."""
    engine = streams.StreamEngine(db, name="names", durable=False)
    arguments = {"types": BADGE_TYPES, "attributes": ("HCW-ID", "location"), **options}
    with pytest.raises(DefinitionError, match=rf"stream estream: {match}"):
        engine.create_stream("estream", **arguments)
    assert engine.streams == {}


@pytest.mark.parametrize("priority", ["high", float("nan"), [1], True, float("inf"), float("-inf"), 10**400],
                         ids=["a-text", "nan", "a-list", "a-bool", "inf", "minus-inf", "an-int-no-float-holds"])
def test_a_stream_s_priority_that_is_no_number_is_refused_when_the_stream_is_declared(db, priority):
    """``create_stream(priorities={"EXIT": "high"})`` was taken, and every later batch holding an EXIT failed at
    admission with a bare TypeError ('bad operand type for unary -'), every retry alike: the stream stopped for good.
    A NaN was taken too, and put equal-timestamp events in an order that depended on their arrival.  An infinite
    priority (or an int no float holds) was taken as well, where a query's or rule's is refused: -inf ranked its type
    with the unlisted ones, inf above every other."""
    engine = streams.StreamEngine(db, name="prioritised", durable=False)
    with pytest.raises(DefinitionError, match=r"stream estream: the priority of 'EXIT' is a number \(higher first\)"):
        engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"),
                             priorities={"EXIT": priority, "ENTER": 1})
    assert engine.streams == {}


def test_a_stream_s_attributes_for_an_undeclared_type_are_refused_as_its_priorities_are(db):
    """``create_stream(types=[…], type_attributes={"EXTI": […]})`` (a type the stream does not declare) was taken
    where ``priorities={"EXTI": 1}`` is refused: the attributes were given to no type, and a query naming one of them
    on EXIT was refused as an unknown attribute telling to declare what was declared.  A key spelled in another case
    than the declared type (``"exit"``) was taken and never found (types are matched ignoring case): it now names
    the declared type."""
    engine = streams.StreamEngine(db, name="typed", durable=False)
    with pytest.raises(UnknownName, match=r"stream estream: attributes for undeclared event type 'EXTI'"):
        engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID",),
                             type_attributes={"EXTI": ["location"]})
    assert engine.streams == {}
    schema = engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID",),
                                  type_attributes={"exit": ["location"]})
    assert schema.attributes_of("EXIT") == ("HCW-ID", "location")
    engine.define("CREATE QUERY QX ON estream PATTERN SEQ(EXIT, ENTER) RETURN EXIT.location")
    anywhere = streams.StreamSchema("any", None, ("HCW-ID",), {"EXTI": ("location",)})     # (types=None: any type)
    assert anywhere.attributes_of("EXTI") == ("HCW-ID", "location")


@pytest.mark.parametrize("name", [None, "", 5], ids=["none", "empty", "a-number"])
def test_a_query_or_rule_name_that_is_no_text_is_refused_and_later_definitions_work(db, name):
    """``engine.query(None, …)`` (``rule(None, …)``) was defined, and every later definition of the engine then
    failed with a bare AttributeError ("'NoneType' object has no attribute 'casefold'") comparing names: the engine
    took no query or rule more until the process restarted.  An empty name was taken too (outputs of query '')."""
    engine = engine_for(db)
    with pytest.raises(DefinitionError, match=r"a query's name is a non-empty text"):
        engine.query(name, pattern=streams.seq("EXIT", "ENTER"), returns=[streams.event("ENTER")["HCW-ID"]])
    engine.define("CREATE QUERY QX ON estream PATTERN SEQ(EXIT, ENTER) WHERE [HCW-ID] RETURN ENTER.HCW-ID")
    with pytest.raises(DefinitionError, match=r"a rule's name is a non-empty text"):
        engine.rule(name, on_output="QX", action=lambda tx, new: None)
    engine.rule("R", on_output="QX", action=lambda tx, new: None)
    assert list(engine.queries) == ["QX"] and list(engine.rules) == ["R"]


@pytest.mark.parametrize("declared, match", [
    ({"reads": "workerStatus"}, r"reads=\['workerStatus'\]"), ({"writes": "workerStatus"}, r"writes=\['workerStatus'\]"),
    ({"writes": 5}, r"writes is a collection of table names"), ({"reads": [None]}, r"reads is a collection of table names"),
], ids=["reads-a-text", "writes-a-text", "writes-a-number", "reads-none-in-a-list"])
def test_a_rule_s_declared_tables_of_the_wrong_kind_are_refused_saying_what_to_write(db, declared, match):
    """``engine.rule(…, reads="workerStatus")`` read the text letter by letter and was refused as "no table 'o' in
    the store" (one of its letters), naming a table nobody wrote; writes=5 failed with a bare TypeError ('int'
    object is not iterable), reads=[None] with an AttributeError."""
    engine = engine_for(db)
    engine.define("CREATE QUERY QX ON estream PATTERN SEQ(EXIT, ENTER) WHERE [HCW-ID] RETURN ENTER.HCW-ID")
    with pytest.raises(DefinitionError, match=rf"rule R: .*{match}"):
        engine.rule("R", on_output="QX", action=lambda tx, new: None, **declared)
    assert engine.rules == {}


@pytest.mark.parametrize("returns", [None, 5, "EXIT.HCW-ID"], ids=["none", "a-number", "a-text"])
def test_returns_that_is_no_collection_of_expressions_is_a_definition_error(db, returns):
    """``query(returns=…)`` is a mapping name -> expression or a list of attribute references: None or a number failed
    with a bare TypeError ('object is not iterable'), and a text was read letter by letter ("name the returned
    expression Literal(value='E')")."""
    engine = streams.StreamEngine(db, name="returns", durable=False)
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    with pytest.raises(DefinitionError, match=r"query Q: returns is a mapping \{'name': expression\} or a list"):
        engine.query("Q", pattern=streams.seq("EXIT"), returns=returns)
    assert engine.queries == {}


@pytest.mark.parametrize("options", [{"types": "ENTER", "attributes": ("HCW-ID",)},
                                     {"types": BADGE_TYPES, "attributes": "location"}],
                         ids=["types", "attributes"])
def test_a_stream_s_types_or_attributes_given_as_one_text_are_refused(db, options):
    """``create_stream(types=…, attributes=…)`` take collections of names: one text there is refused saying what to
    write, instead of being read letter by letter (types="ENTER" failed with "event type 'E' is declared twice",
    attributes="location" declared the attributes l, o, c, a, t, i, o, n)."""
    engine = streams.StreamEngine(db, name="one_text", durable=False)
    (name, text), = [(key, value) for key, value in options.items() if isinstance(value, str)]
    with pytest.raises(DefinitionError, match=rf"{name}=\['{text}'\]"):
        engine.create_stream("estream", **options)
    assert engine.streams == {}


@pytest.mark.parametrize("type_attributes, match", [
    ({"EXIT": "room"}, r"type_attributes=\{'EXIT': \['room'\]\}"), ({"EXIT": [5]}, r"type_attributes maps"),
    ({5: ["room"]}, r"type_attributes maps"), (["EXIT"], r"type_attributes maps"),
], ids=["one-text", "a-number", "a-number-type", "a-list"])
def test_a_stream_s_type_attributes_of_the_wrong_kind_are_refused(db, type_attributes, match):
    """``create_stream(type_attributes={"EXIT": "room"})`` declared EXIT's attributes r, o, o, m — read letter by
    letter, as types='ENTER' was before 87b97e9; an attribute or type named by a number was taken (a query naming
    an attribute of that type then failed with a bare AttributeError, or the attributes were never EXIT's), and a
    list failed with an AttributeError ('list' object has no attribute 'items')."""
    engine = streams.StreamEngine(db, name="type_attributes", durable=False)
    with pytest.raises(DefinitionError, match=rf"stream estream: .*{match}"):
        engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID",), type_attributes=type_attributes)
    assert engine.streams == {}


def test_a_priority_that_is_not_a_number_is_refused_and_leaves_the_definitions_as_they_were(db):
    """``priority=`` is a number (higher first).  Given as a text, the query or rule was registered and only then
    failed to sort (TypeError: bad operand type for unary -), so it stayed defined and every later definition of
    the engine failed the same way; a replacing rule had already removed the one it replaced.  It is refused
    with a DefinitionError before anything changes."""
    engine = engine_for(db)
    engine.define(Q1_R1)
    original = engine.rules["R1"]
    with pytest.raises(DefinitionError, match="query P: priority is a number.*'high'"):
        engine.query("P", pattern=streams.seq("EXIT", "ENTER"), returns=[streams.event("ENTER")["HCW-ID"]],
                     priority="high")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="rule R1: priority is a number.*'1'"):
        engine.rule("R1", on_output="Q1", action=lambda tx, new: None, priority="1",  # type: ignore[arg-type]
                    replace=True)
    assert set(engine.queries) == {"Q1"} and engine.rules == {"R1": original}
    engine.define(Q2)                 # the engine still takes definitions
    assert set(engine.queries) == {"Q1", "Q2"}


@pytest.mark.parametrize("option, match", [
    ({"selection": "skip_till_some_match"}, r"selection .*'skip_till_any_match'.*got 'skip_till_some_match'"),
    ({"within": "ten seconds"}, r"query\(within='ten seconds'\) takes None \(no window\) or a finite number of "),
    ({"within": True}, r"query\(within=True\) takes None \(no window\) or a finite number of seconds"),
    ({"within": "5"}, r"query\(within='5'\) takes None \(no window\) or a finite number of seconds above 0$"),
    ({"stream": 5}, r"stream is the name of a declared stream \(or None\), got 5"),
    ({"stream": ["estream"]}, r"stream is the name of a declared stream"),
], ids=["selection", "within", "within-a-bool", "within-a-text-number", "stream-a-number", "stream-a-list"])
def test_a_query_s_selection_or_window_of_the_wrong_kind_is_a_definition_error(db, option, match):
    """``engine.query(selection=…, within=…)``: a text that is no Selection, or a window that is no number, is a
    DefinitionError saying what to give (was a bare ValueError from the enum or float()); within=True was taken as
    a window of one second (float(True) is 1.0), and within="5" as five seconds (float("5")), where every other
    duration of the package takes a number of seconds (``activedb.errors.check_seconds``, which checks this one too);
    stream=5 failed with a bare AttributeError (no 'casefold')."""
    engine = engine_for(db)
    with pytest.raises(DefinitionError, match=f"query P: {match}"):
        engine.query("P", pattern=streams.seq("EXIT", "ENTER"), returns=[streams.event("ENTER")["HCW-ID"]],
                     **option)
    assert engine.queries == {}


@pytest.mark.parametrize("option, match", [
    ({"within": float("inf")}, r"query\(within=inf\) takes None \(no window\) or a finite number of seconds"),
    ({"within": float("nan")}, r"query\(within=nan\) takes None \(no window\) or a finite number of seconds"),
    ({"within": "1e999"}, r"query\(within='1e999'\) takes None \(no window\) or a finite number of seconds"),
    ({"within": 10 ** 400}, r"query\(within=1000.*\) takes None \(no window\) or a finite number of seconds"),
    ({"priority": float("inf")}, r"priority is a number \(finite; higher first\) or None, got inf"),
    ({"priority": -float("inf")}, r"priority is a number \(finite; higher first\) or None, got -inf"),
    ({"priority": 10 ** 400}, r"priority is a number \(finite; higher first\) or None, got 1000"),
], ids=["within-inf", "within-nan", "within-text-1e999", "within-int-beyond-float", "priority-inf",
        "priority-minus-inf", "priority-int-beyond-float"])
def test_a_window_or_priority_that_is_no_finite_number_is_refused_by_the_python_api_as_by_the_language(
        db, option, match):
    """The text language refuses WITHIN and PRIORITY numbers that are not finite as floats (48db25b8); the Python API
    took ``within=float('inf')`` (a window that limits nothing) and ``priority=±inf`` (a query or rule above or below
    every other) silently, ``within=nan`` failed only at compilation ("WITHIN needs a positive window"), and
    ``within=10**400`` with a bare OverflowError.  Each is a DefinitionError at once, for queries and rules, and
    nothing is defined."""
    engine = engine_for(db)
    engine.define(Q1_R1)
    original = engine.rules["R1"]
    with pytest.raises(DefinitionError, match=f"query P: {match}"):
        engine.query("P", pattern=streams.seq("EXIT", "ENTER"), returns=[streams.event("ENTER")["HCW-ID"]],
                     **option)
    if "priority" in option:
        with pytest.raises(DefinitionError, match=f"rule R1: {match}"):
            engine.rule("R1", on_output="Q1", action=lambda tx, new: None, replace=True, **option)
    assert set(engine.queries) == {"Q1"} and engine.rules == {"R1": original}


def test_a_script_with_an_error_defines_none_of_its_statements(db):
    """``define(text)`` is all or nothing: a script whose rule names a column that does not exist defines neither
    the rule nor the query before it, so that the corrected script can be defined on the same engine.  Before, the
    query stayed defined and the corrected script failed with 'query Q1 is already defined'."""
    engine = engine_for(db)
    with pytest.raises(UnknownAttribute, match="no column 'colour'"):
        engine.define(Q1_R1.replace("UPDATE workerStatus SET status", "UPDATE workerStatus SET colour"))
    assert (engine.queries, engine.rules) == ({}, {})
    defined = engine.define(Q1_R1)
    assert [definition.name for definition in defined] == ["Q1", "R1"]
    with pytest.raises(DefinitionError, match="already defined"):       # (a statement of the script, as before)
        engine.define(Q1_R1.replace("CREATE QUERY Q1", "CREATE QUERY Q3"))
    assert sorted(engine.queries) == ["Q1"] and sorted(engine.rules) == ["R1"]


@pytest.mark.parametrize("text, column, words", [
    ("CREATE QUERY Q PATTERN SEQ(A) WITHIN 1e999 sec RETURN A.x", 38, "the window's length (a finite number)"),
    ("CREATE QUERY Q PATTERN SEQ(A) WITHIN 1" + "0" * 400 + " sec RETURN A.x", 38,
     "the window's length (a finite number)"),
    ("CREATE QUERY Q PATTERN SEQ(A) WITHIN 1e308 hour RETURN A.x", 38, "WITHIN 1e308 hour is no finite window"),
    ("CREATE QUERY Q PATTERN SEQ(A) PRIORITY 1e999 RETURN A.x", 40, "the query's priority (a finite number)"),
    ("CREATE QUERY Q PATTERN SEQ(A) PRIORITY -1e999 RETURN A.x", 41, "the query's priority (a finite number)"),
    ("CREATE RULE R ON OUTPUT Q PRIORITY 1e999 BEGIN DELETE FROM t WHERE k = 1 END", 36,
     "the rule's priority (a finite number)"),
], ids=["within-inf", "within-a-huge-integer", "within-overflowing-its-unit", "query-priority-inf",
        "query-priority-minus-inf", "rule-priority-inf"])
def test_a_window_or_priority_that_is_no_finite_number_is_a_syntax_error(text, column, words):
    """``WITHIN`` and ``PRIORITY`` take finite numbers: ``1e999`` (read as infinity), a window whose unit makes it
    infinite, and an integer too large for a float are refused by the parser with the line and column and what it
    expected.  Before, the infinities were accepted (a window of no length limit, a priority above every other) and
    the huge integer failed with a bare OverflowError (no ActivedbError)."""
    with pytest.raises(QuerySyntaxError) as caught:
        streams.parse(text)
    assert (caught.value.line, caught.value.column) == (1, column), str(caught.value)
    assert words in str(caught.value)


@pytest.mark.parametrize("action, column, words", [
    ("UPDATE workerStatus SET status = 'warning', status = 'safe' WHERE workerID = newEvent.HCW-ID", 1,
     "UPDATE workerStatus sets status twice"),
    ("UPDATE workerStatus SET status = 'warning', STATUS = 'safe' WHERE workerID = newEvent.HCW-ID", 1,
     "UPDATE workerStatus sets STATUS twice"),
    ("INSERT INTO workerStatus (workerID, status, workerID) VALUES (newEvent.HCW-ID, 'new', 'other')", 1,
     "INSERT INTO workerStatus names workerID twice"),
], ids=["update", "update-another-case", "insert"])
def test_an_action_naming_a_column_twice_is_refused_at_definition_time(db, action, column, words):
    """``UPDATE … SET c = 1, c = 2`` and ``INSERT INTO t (c, …, c)``: SQL refuses both ("multiple assignments to
    same column", "column specified more than once"); the rule took the last value of the column and dropped the
    first without a word, whichever the writer meant."""
    engine = engine_for(db)
    engine.define(Q1_R1.split("CREATE RULE")[0])
    text = f"CREATE RULE R1 ON OUTPUT Q1 REFERENCING NEW AS newEvent\n{action}"
    with pytest.raises(DefinitionError) as caught:
        engine.define(text)
    assert words in str(caught.value) and "give each column once" in str(caught.value), str(caught.value)
    assert (caught.value.line, caught.value.column) == (2, column), str(caught.value)
    assert engine.rules == {}


def test_a_python_update_naming_a_column_twice_in_two_cases_is_refused(db):
    engine = engine_for(db)
    engine.define(Q1_R1.split("CREATE RULE")[0])
    with pytest.raises(DefinitionError, match="UPDATE workerStatus sets STATUS twice; give each column once"):
        engine.rule("R1", on_output="Q1", action=streams.update(
            "workerStatus", set={"status": "warning", "STATUS": "safe"},
            where={"workerID": streams.event("NEW")["HCW-ID"]}))
    assert engine.rules == {}


@pytest.mark.parametrize("types", [[], ()], ids=["a-list", "a-tuple"])
def test_a_stream_of_no_event_type_is_refused_when_declared(db, types):
    """``create_stream(types=[])`` was taken: a stream that admits no event, each one fed to it a dead letter.  Now it
    is refused, saying to list the types it admits or leave types=None for any."""
    engine = streams.StreamEngine(db, name="no_types", durable=False)
    with pytest.raises(DefinitionError, match=r"stream estream: types=(\[\]|\(\)) admits no event type.*types=None"):
        engine.create_stream("estream", types=types, attributes=("HCW-ID", "location"))
    assert engine.streams == {}


@pytest.mark.parametrize("action", [[], ()], ids=["a-list", "a-tuple"])
def test_a_rule_of_no_action_is_refused_when_defined(db, action):
    """``engine.rule(…, action=[])`` was taken: a rule that does nothing on every output of its query (the language
    refuses an empty BEGIN … END already).  Now it is refused, saying what an action is."""
    engine = engine_for(db)
    engine.define("CREATE QUERY QX ON estream PATTERN SEQ(EXIT, ENTER) WHERE [HCW-ID] RETURN ENTER.HCW-ID")
    with pytest.raises(DefinitionError, match=r"rule R: action=(\[\]|\(\)) gives no action.*update\(…\), insert\(…\)"):
        engine.rule("R", on_output="QX", action=action)
    assert list(engine.rules) == []
