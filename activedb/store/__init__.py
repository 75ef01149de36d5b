"""The shared store: schema checks, private write sets and their SQL.  Design note: ``README.md``.

Public names: :class:`Catalog` (and :class:`KeysCheck`, its check of generated keys as a statement), :class:`TableInfo`, :class:`Entry`, :class:`EntryKind`, :func:`resolve`,
:func:`fetch_rows`, :func:`rows_by_key`, :func:`driver_error`, :func:`lock_row`, :func:`apply_write_set` (a table's rows in statements of at most :data:`ROWS_PER_STATEMENT` rows and :data:`STATEMENT_BYTES`, the bound of every writer's :func:`statement_spans` and :func:`in_one_statement`), :func:`jsonable` (:data:`JSONABLE_DEPTH`: the levels it converts, and the levels of nesting a value entering the engine may have; its tagged form's keys :func:`tagged_key`, read back by :func:`from_jsonable`), :func:`storable_text`, :func:`not_a_time`, :func:`exact_json` (:data:`EXACT_DEPTH`: the levels it encodes), :func:`nesting_depth`,
:func:`from_exact_json`, :func:`matches`, :func:`same_image`, :func:`copy_nested`, :func:`holds_nan` (a NaN, or a tuple holding one: no key), :func:`own_image` (:data:`NESTED_TYPES`: the value types it copies), :func:`own_value`; ``Json`` (a JSON value), ``Key`` (a row's primary-key
values, in key-column order); the closed sets :class:`Granularity`, :class:`IsolationLevel`.
"""

from activedb.store._catalog import KEY_BLOCK, Catalog, KeysCheck
from activedb.store._choices import Checked, Granularity, IsolationLevel
from activedb.store._exact import exact_json, from_exact_json, from_jsonable
from activedb.store._nesting import EXACT_DEPTH, JSONABLE_DEPTH, nesting_depth
from activedb.store._schema import TableInfo, json_problem, not_a_time, text_problem
from activedb.store._statements import STATEMENT_BYTES, in_one_statement, statement_spans
from activedb.store._sql import (ROWS_PER_STATEMENT, Json, apply_write_set, array_literal, close_detached, detached_connection, driver_error,
                                 fetch_rows, is_connection_failure, jsonable, lock_row, rows_by_key,
                                 storable_text, tagged_key)
from activedb.store._writeset import (NESTED_TYPES, Entry, EntryKind, Key, Row, RowImage, TableRef, copy_nested, holds_nan, matches, own_image,
                                      own_value, resolve, same_image)

__all__ = ["Checked", "KEY_BLOCK", "Catalog", "KeysCheck", "TableInfo", "Entry", "EntryKind", "Json", "Key", "Row", "RowImage", "TableRef", "resolve", "fetch_rows", "rows_by_key", "driver_error", "lock_row",
           "apply_write_set", "ROWS_PER_STATEMENT", "STATEMENT_BYTES", "statement_spans", "in_one_statement", "array_literal", "is_connection_failure", "JSONABLE_DEPTH", "EXACT_DEPTH", "nesting_depth", "jsonable", "tagged_key", "from_jsonable", "storable_text", "json_problem", "text_problem", "not_a_time",
           "exact_json", "from_exact_json", "detached_connection", "close_detached", "matches", "same_image", "copy_nested", "holds_nan", "own_image", "NESTED_TYPES", "own_value", "Granularity", "IsolationLevel"]
