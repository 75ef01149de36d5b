"""Reading a capture consumer's next batch: where it ends, then each table's changes up to there with
typed old and new rows (PostgreSQL turns the captured ``jsonb`` into the table's row type), as events of
origin ``EXTERNAL``.  Design note: ``README.md`` in this package."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from activedb.capture import _sql
from activedb.capture._position import KINDS, CapturedChange, Position
from activedb.errors import UNDEFINED_COLUMN, UNDEFINED_OBJECT, UNDEFINED_TABLE, UnknownTable, sqlstate_of
from activedb.events import Event, EventKind, Origin

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle as Database

logger = logging.getLogger("activedb.capture")

#: One fetched change: its event, or None and why it cannot become one.
Entry = tuple[CapturedChange, "Event | None", "str | None"]


class ChangeReader:
    """Reads batches of captured changes of ``database``.  Not thread-safe: the consumer calls it under
    its ``_run_mutex`` (``_statements`` caches, per table and columns, the typed changes query)."""

    def __init__(self, database: "Database"):
        self.database = database
        self._statements: dict[tuple[object, ...], Any] = {}
        # (table, columns) the catalog did not show even after reading it again: warned about once, not read again
        self._unseen: set[tuple[str, tuple[str, ...]]] = set()

    def fetch(self, start: Position, limit: int) -> list[Entry]:
        """The next changes after ``start``, in order, with their events (None and a reason for a change
        that cannot become one, e.g. of a table that no longer exists): where the batch ends, then each
        table's changes in that range with typed rows."""
        with self.database.engine.connect() as connection:
            bounds = connection.execute(sa.text(_sql.BATCH_BOUNDS), {
                "position": start.commit, "change_id": start.change_id, "limit": limit}).first()
            if bounds is None:
                return []
            end = Position(bounds.position, bounds.id)
            result = []
            for oid, name, relation, columns in bounds.tables:
                if name is None:         # recorded by a trigger on a table that is not (or no longer) captured
                    table = relation or f"a dropped table (oid {oid})"
                    result.extend(self._undeliverable(
                        connection, oid, table, start, end,
                        f"{table} is not captured (capture knows a table by its oid: db.capture(table) or "
                        f"enable_capture(op, table) installs its trigger; drop any other trigger calling "
                        f"activedb_capture_row())"))
                    continue
                self._know_columns(name, columns or ())
                # Read again, under the same handlers, after a column this process read is gone (dropped or
                # renamed since): the table may change again meanwhile (a race with another process).
                for read_again in (False, True):
                    try:
                        if relation is None:
                            raise UnknownTable(f"table {name!r} no longer exists")
                        result.extend(self._changes_of(connection, oid, name, relation, start, end))
                    except sa.exc.DataError:    # a captured row that does not fit a column's type as it is now
                        connection.rollback()
                        result.extend(self._one_by_one(connection, oid, name, relation, start, end))
                    except sa.exc.ProgrammingError as error:   # its type changed after capture
                        state = sqlstate_of(error)
                        if state == UNDEFINED_COLUMN and not read_again:
                            connection.rollback()
                            self.database.catalog.refresh()
                            continue
                        if state not in (UNDEFINED_TABLE, UNDEFINED_OBJECT):
                            raise
                        connection.rollback()
                        result.extend(self._undeliverable(connection, oid, name, start, end,
                                                          f"table {name!r} no longer exists"))
                    except UnknownTable:      # dropped, or not known to activedb's catalog by that name (renamed)
                        # (Not the catalog's message: its advice is for a table never created.)
                        result.extend(self._undeliverable(
                            connection, oid, name, start, end,
                            f"table {name!r} no longer exists under that name (dropped, or renamed: capture it again "
                            f"under its new name)"))
                    break
        if len(bounds.tables) > 1:
            result.sort(key=lambda entry: (entry[0].position, entry[0].change_id))
        return result

    def _know_columns(self, table_name: str, columns: Sequence[str]) -> None:
        """Read the tables' layouts again (once) when ``table_name`` has a column this process does not know: one
        added by another process (``ALTER TABLE … ADD COLUMN``) since it read them, which the changes query would
        otherwise leave out of every event (a dropped or renamed one makes that query fail instead: ``fetch``).
        A column the catalog does not show even then (another table of that name first on this process's
        ``search_path``) is warned about once."""
        try:
            known = self.database.table(table_name).columns
            unknown = tuple(column for column in columns if column not in known)
            if not unknown or (table_name, unknown) in self._unseen:
                return
            self.database.catalog.refresh()
            known = self.database.table(table_name).columns
        except UnknownTable:          # dropped or renamed: the changes become dead letters (fetch)
            return
        unseen = tuple(column for column in columns if column not in known)
        if unseen:
            self._unseen.add((table_name, unseen))
            logger.warning("capture: table %r has the column(s) %s, which activedb's catalog does not show after "
                           "reading the table again (is another table named %r first on this process's search_path?); "
                           "the events of its changes leave them out", table_name, ", ".join(unseen), table_name)

    def _changes_of(self, connection: sa.Connection, oid: int, table_name: str, relation: str, start: Position,
                    end: Position) -> list[Entry]:
        table = self.database.table(table_name)
        columns = list(table.columns)
        names = [column.name for column in columns]
        key_indexes = [names.index(column.name) for column in table.primary_key.columns]
        statement = self._statements.get((relation, tuple(names)))
        if statement is None:
            statement = sa.text(_sql.changes_of(relation, names)).columns(
                sa.column("position", sa.BigInteger), sa.column("id", sa.BigInteger), sa.column("xid", sa.Text),
                sa.column("operation", sa.Text), sa.column("committed_at", sa.DateTime(timezone=True)),
                *[sa.column(f"o_{index}", column.type) for index, column in enumerate(columns)],
                *[sa.column(f"n_{index}", column.type) for index, column in enumerate(columns)])
            self._statements[(relation, tuple(names))] = statement
        rows = connection.execute(statement, {
            "table_oid": oid, "first_position": start.commit, "first_change": start.change_id,
            "last_position": end.commit, "last_change": end.change_id})
        width = len(names)
        entries: list[tuple[CapturedChange, Event | None, str | None]] = []
        for row in rows:
            change = CapturedChange(row[0], row[1], int(row[2]), table_name, row[3], row[4])
            values = tuple(row)
            kind = KINDS[change.operation]
            old = dict(zip(names, values[5:5 + width])) if kind is not EventKind.INSERTED else None
            new = dict(zip(names, values[5 + width:])) if kind is not EventKind.DELETED else None
            image = values[5 + width:] if new is not None else values[5:5 + width]
            key = tuple(image[index] for index in key_indexes) if key_indexes else None
            if key is not None and len(key) == 1:
                key = key[0]
            event = Event(kind, table_name, key, old, new,
                          payload={"xid": change.xid, "commit_position": change.position,
                                   "change_id": change.change_id, "committed_at": change.committed_at},
                          transaction=f"pg:{change.xid}", origin=Origin.EXTERNAL)
            entries.append((change, event, None))
        return entries

    def _one_by_one(self, connection: sa.Connection, oid: int, table_name: str, relation: str, start: Position,
                    end: Position) -> list[Entry]:
        """The changes of one table in ``start``..``end`` read one at a time, after PostgreSQL refused to turn one
        of their captured rows into the table's row type (a column's type changed since, ``ALTER … TYPE``, and a
        value recorded before does not fit the new one): each that fits is delivered, each that does not becomes
        a change without an event and the reason (its dead letter)."""
        entries: list[Entry] = []
        for change, _, _ in self._undeliverable(connection, oid, table_name, start, end, ""):
            # (the range of this change alone: after the one before it in its commit, up to itself)
            just = Position(change.position, change.change_id - 1), Position(change.position, change.change_id)
            try:
                entries.extend(self._changes_of(connection, oid, table_name, relation, *just))
            except sa.exc.DataError as error:
                connection.rollback()
                refusal = str(error.orig or error).strip().splitlines()[0]
                entries.append((change, None, f"{change.describe()} cannot be delivered: its captured row does not "
                                              f"fit the columns table {table_name!r} has now (a column's type "
                                              f"changed since it was written): {refusal}"))
        return entries

    def _undeliverable(self, connection: sa.Connection, oid: int, table_name: str, start: Position, end: Position,
                       reason: str) -> list[Entry]:
        rows = connection.execute(sa.text(_sql.changes_of(None, None)), {
            "table_oid": oid, "first_position": start.commit, "first_change": start.change_id,
            "last_position": end.commit, "last_change": end.change_id})
        changes = [CapturedChange(row.position, row.id, int(row.xid), table_name, row.operation, row.committed_at,
                                  row.old_row, row.new_row) for row in rows]
        return [(change, None, f"{change.describe()} cannot be delivered: {reason}") for change in changes]
