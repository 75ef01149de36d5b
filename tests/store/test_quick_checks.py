"""``TableInfo``'s quick value tests accept only what its full check accepts: a write or a key whose value the
quick test passes is exactly one the full check (the path that names what is wrong) would have let through.
The oracle is the full check with the quick tests switched off.  No database: the tables are built here."""

from __future__ import annotations

import decimal
import enum
import struct

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from activedb.errors import InvalidKey, InvalidValue
from activedb.store import TableInfo, _schema


class Colour(enum.Enum):
    RED = "red"


class Flag(int):
    """An ``int`` subclass: never taken by the quick test (exact types only)."""


def _info(key: sa.types.TypeEngine = sa.BigInteger()) -> TableInfo:
    metadata = sa.MetaData()
    table = sa.Table(
        "quick", metadata,
        sa.Column("id", key, primary_key=True),
        sa.Column("small", sa.SmallInteger),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("name", sa.String(20)),
        sa.Column("body", sa.Text),
        sa.Column("flag", sa.Boolean),
        sa.Column("ratio", sa.Float),
        sa.Column("single", sa.REAL),
        sa.Column("amount", sa.Numeric(10, 2)),
    )
    return TableInfo(table)


def _oracle(key: sa.types.TypeEngine = sa.BigInteger()) -> TableInfo:
    """The table with every quick test off (those run inline included): only the full check."""
    oracle = _info(key)
    oracle._quick = {name: None for name in oracle._quick}
    oracle._quick_key = None
    oracle._quick_columns = {name: None for name in oracle._quick_columns}
    oracle._text = oracle._numbers = frozenset()
    oracle._key_columns_text = False
    return oracle


INFO, ORACLE = _info(), _oracle()
TEXT_KEYED, TEXT_KEYED_ORACLE = _info(sa.String(20)), _oracle(sa.String(20))

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70), st.floats(allow_nan=True),
    st.text(), st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF)), st.binary(),
    st.integers(-5, 5).map(Flag), st.just(Colour.RED), st.decimals(allow_nan=False, places=2), st.just("\x00"), st.just("caf\u00e9"), st.just("\ud800"),
    # (at and beyond the float types' ranges)
    st.sampled_from([2**1023, 2**1024, -10**400, 2**127, 2**128, 1e39, -3.4e38, 1e-38, 1e-40, 1e-46, 0.0, -0.0,
                     decimal.Decimal("1e400"), decimal.Decimal("1e-400"), decimal.Decimal("NaN")]),
)


def _outcome(check, *args):
    try:
        return ("accepted", check(*args))
    except (InvalidValue, InvalidKey) as error:
        return ("refused", type(error).__name__, str(error))


@pytest.mark.parametrize("column", ["id", "small", "number", "name", "body", "flag", "ratio", "single", "amount"])
@given(value=VALUES)
def test_a_quick_check_accepts_exactly_what_the_full_check_accepts(column, value):
    assert _outcome(INFO.check_value, column, value) == _outcome(ORACLE.check_value, column, value)
    assert _outcome(INFO.check_values, {column: value}) == _outcome(ORACLE.check_values, {column: value})


def _each(check, column, values):
    for value in values:
        check(column, value)


@pytest.mark.parametrize("column", ["id", "small", "number", "name", "body", "flag", "ratio", "single", "amount"])
@given(values=st.one_of(st.lists(VALUES, max_size=8), st.lists(st.floats(allow_nan=True), max_size=8),
                        st.lists(st.text(), max_size=8), st.lists(st.integers(-2**40, 2**40), max_size=8),
                        st.lists(st.one_of(st.floats(), st.integers()), max_size=8)))
def test_a_whole_column_is_accepted_exactly_when_each_of_its_values_is(column, values):
    """``check_column`` (a whole column tested at once where its type allows) accepts a column exactly when the
    full check accepts each value, and otherwise refuses the first value the full check refuses."""
    assert _outcome(INFO.check_column, column, values) == _outcome(_each, ORACLE.check_value, column, values)


@pytest.mark.parametrize("info, oracle", [(INFO, ORACLE), (TEXT_KEYED, TEXT_KEYED_ORACLE)], ids=["int", "text"])
@given(value=VALUES)
def test_a_one_column_key_normalised_quickly_is_the_full_checks_key(info, oracle, value):
    assert _outcome(info.key, value) == _outcome(oracle.key, value)
    assert _outcome(info.key, (value,)) == _outcome(oracle.key, (value,))


def test_the_names_are_plain_strings():
    """SQLAlchemy's names are ``quoted_name`` (a ``str`` subclass); the table's are exact ``str``, as are the keys of
    the row images and events made of them (dicts with other keys lose the interpreter's fast lookups)."""
    names = [INFO.name, *INFO.key_columns, *INFO.columns, *INFO.required, *INFO.blank_row]
    assert type(INFO.table.name) is not str and {type(name) for name in names} == {str}


def test_the_quick_tests_cover_the_common_columns_and_leave_the_rest_to_the_full_check():
    assert INFO._quick["id"](2**62) and not INFO._quick["id"](2**63) and not INFO._quick["id"](True)
    assert INFO._quick["small"](2**15 - 1) and not INFO._quick["small"](2**15)
    assert INFO._quick["name"]("ok") and not INFO._quick["name"]("\x00") and not INFO._quick["name"]("caf\u00e9")
    assert INFO._quick["ratio"](1.5) and INFO._quick["ratio"](2) and not INFO._quick["ratio"](True)
    assert INFO._quick["amount"](float("inf")) and not INFO._quick["amount"](Flag(1))
    assert INFO._quick["flag"] is None
    assert INFO._quick_columns["body"](["ok", "fine"]) and not INFO._quick_columns["body"](["ok", "a\x00"])
    assert not INFO._quick_columns["body"](["ok", "caf\u00e9"]) and not INFO._quick_columns["body"](["ok", None])
    assert INFO._quick_columns["ratio"]([1.5, 2]) and not INFO._quick_columns["ratio"]([1.5, True])
    assert INFO._quick["ratio"](2**1000) and not INFO._quick["ratio"](2**1024) and not INFO._quick_columns["ratio"]([2**1024])
    assert INFO._quick["single"](3e38) and not INFO._quick["single"](1e39) and not INFO._quick["single"](1e-40)
    assert INFO._quick_columns["id"] is None and INFO._quick_columns["flag"] is None


@given(st.integers(min_value=1, max_value=0x7F7FFFFF) | st.floats(min_value=0.5, max_value=2.0**100, width=32).map(
    lambda number: struct.unpack("<I", struct.pack("<f", number))[0]))
def test_a_reals_shortest_printing_by_pythons_formatting_is_the_exact_ones(bits):
    """``_shortest_real``'s quick path (Python's correctly rounded ``format``, a binary search over the number of
    digits) gives the decimal the exact one (``_shortest_real_exact``) gives, or leaves it to it."""
    quick = _schema._shortest_real_quick(bits)
    assert quick is None or quick == _schema._shortest_real_exact(bits)
