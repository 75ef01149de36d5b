"""Every error activedb raises on purpose.

Messages say what happened *and what to do next*.  The CLI prints
``ActivedbError`` messages as one line and exits non-zero, without a traceback.

Every error a user can meet derives from :class:`ActivedbError`, and no two public classes share a name.
The lock manager's two errors a caller handles are raised as :class:`DeadlockDetected` and
:class:`LockWaitTimeout`: ``lockmgr`` knows nothing of activedb, so activedb names them to it
(``lockmgr.ErrorClasses``); each is also the ``lockmgr`` class it replaces.  They are defined on first use
(``lockmgr`` is not imported by ``import activedb``).
"""

from __future__ import annotations

import datetime as _dt
import enum
import inspect as _inspect
import logging as _logging
import math
import re
from types import FunctionType as _FunctionType, MethodType as _MethodType
from typing import TYPE_CHECKING, Callable, Hashable, Iterable, Iterator, Mapping, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import lockmgr
    from lockmgr.errors import Lazy

# What ``from activedb.errors import *`` (the ``activedb`` package) takes.  DeadlockDetected and LockWaitTimeout
# are public too, but defined on first use (they import lockmgr): ``activedb`` lists them itself.
__all__ = ["ActivedbError", "BadDatabaseURL", "BatchAlreadyCommitted", "CascadeLimitExceeded",
           "DatabaseError", "DatabaseUnavailable", "DiskFull", "DuplicateKey", "EmbeddedServerError", "Failure",
           "GeneratedKeysReset", "BadArgument", "InvalidChoice", "InvalidKey", "InvalidTime", "InvalidValue", "NestedTooDeep",
           "MigrationError", "OutboxError",
           "PictureError", "RecordsTakenOver", "RuleDeadlineExceeded", "RuleDefinitionChangedWarning", "RuleError",
           "RuleFailed", "SchemaError", "SchemaNotAtHead", "SerializationConflict", "ServerDiskFull",
           "TransactionAborted", "TransactionError", "Unconnected", "UnknownColumn", "UnknownTable", "WaitTimeout"]


class ActivedbError(Exception):
    """Base class of activedb's own errors."""


class InvalidChoice(ActivedbError, ValueError):
    """A value that is not one of a closed set (an activedb enum, ``activedb._closedset.ClosedSet``): the message
    lists the members.  ``choices`` is the enum, ``given`` the value, ``parameter`` where it was given."""

    def __init__(self, choices: type[enum.Enum], given: object, parameter: str | None = None,
                 allowed: Iterable[enum.Enum] | None = None):
        self.choices = choices
        self.given = given
        self.parameter = parameter
        listed = tuple(choices) if allowed is None else tuple(allowed)
        members = ", ".join(f"{choices.__name__}.{member.name} ({member.value!r})" for member in listed)
        shown = f"{type(given).__name__}.{given.name}" if isinstance(given, enum.Enum) else repr(given)
        where = f"{parameter}={shown}" if parameter else shown
        try:
            known = given in set(choices)           # (a Choice's member equals its value)
        except TypeError:                           # unhashable: not a member
            known = False
        what = "taken here" if allowed is not None and known else f"a {choices.__name__}"
        super().__init__(f"{where} is not {what}: use one of {members}")


class BadArgument(ActivedbError, ValueError):
    """A public call (or a ``Config`` field, a ``connect()`` keyword) was given a value it cannot take: a number out
    of its range, a value of the wrong type, an empty name.  The message names the argument and what to give.
    Also a ``ValueError``, as such errors were before they were activedb's."""


# The argument checks every package uses (one owner; extenders find them in ``activedb.lowlevel``).  Each raises
# ``error`` — BadArgument unless the caller's package has its own class (``CaptureError``) — with the message
# ``owner(name=value) takes …``: the argument, and what to give.

def check_whole_number(owner: str, name: str, value: object, least: int, meaning: str = "", *,
                       error: type[ActivedbError] = BadArgument) -> None:
    """Raise ``error`` (:class:`BadArgument`) unless ``value`` (given as ``owner(name=value)``) is an ``int`` (not a
    bool) of at least ``least``; ``meaning`` says what the number is, in the message."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise error(f"{owner}({name}={value!r}) takes a whole number of at least {least}{meaning}")


def check_switch(owner: str, name: str, value: object, none: str | None = None, *,
                 error: type[ActivedbError] = BadArgument) -> None:
    """Raise ``error`` (:class:`BadArgument`) unless ``value`` (given as ``owner(name=value)``) is True or False, or
    None if ``none`` says what None means (a text such as 'false' is true to Python: never taken for a switch)."""
    if not isinstance(value, bool) and (value is not None or none is None):
        alternative = "" if none is None else f" (None: {none})"
        raise error(f"{owner}({name}={value!r}) takes True or False{alternative}")


def check_seconds(owner: str, name: str, value: object, *, none: str | None, zero: bool = True,
                  finite: bool = False, error: type[ActivedbError] = BadArgument) -> None:
    """Raise ``error`` (:class:`BadArgument`) unless ``value`` (given as ``owner(name=value)``) is a number of
    seconds (not a bool, not a text, not NaN; infinity is one unless ``finite``) of at least 0 (``zero=False``: above
    0), or None if ``none`` says what None means."""
    if value is None and none is not None:
        return
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")
    if not (number >= 0 if zero else number > 0) or (finite and not finite_number(number)):
        bound = "of at least 0" if zero else "above 0"
        alternative = "" if none is None else f"None ({none}) or "
        raise error(f"{owner}({name}={value!r}) takes {alternative}a {'finite ' if finite else ''}number of seconds "
                    f"{bound}")


def body_not_run(function: object, called: str = "calling it") -> str | None:
    """Why ``function`` is no plain function, if calling it runs none of its body — an async function, a generator
    function, an async generator function, or a callable object whose ``__call__`` is one: its call returns a coroutine
    (a generator) that activedb, which runs transactions and rules in threads, never awaits (iterates) — else None.
    The reason reads "an async function: <called> runs none of its body (…); declare it with a plain def …"."""
    kind = None
    for target in (function, getattr(type(function), "__call__", None)):
        if _inspect.isasyncgenfunction(target):
            kind = "an async generator function"
        elif _inspect.iscoroutinefunction(target):
            kind = "an async function"
        elif _inspect.isgeneratorfunction(target):
            kind = "a generator function"
        if kind is not None or _inspect.isfunction(target) or _inspect.ismethod(target):   # (its own kind says it all)
            break
    if kind is None:
        return None
    returned = "a generator that nothing iterates" if "generator" in kind else "a coroutine that nothing awaits"
    return (f"{kind}: {called} runs none of its body (it returns {returned}: activedb runs transactions and rules in "
            f"threads, not in an event loop); declare it with a plain def that does its work synchronously")


def check_plain_function(owner: str, function: object, *, error: type[ActivedbError] = BadArgument) -> None:
    """Raise ``error`` (:class:`BadArgument`) if ``function`` (given as ``owner(function)``) is one whose call runs
    none of its body (:func:`body_not_run`): the transaction would commit without its work, which only Python's
    "coroutine ... was never awaited" warning would tell."""
    reason = body_not_run(function)
    if reason is not None:
        raise error(f"{owner}({getattr(function, '__name__', function)}) takes a plain function: this is {reason}")


def check_call_fits(owner: str, called: str, function: Callable[..., object], positional: int,
                    keywords: Iterable[str], *, error: type[ActivedbError] = BadArgument) -> None:
    """Raise ``error`` (:class:`BadArgument`) if ``function`` — a Python function or a method of one; anything else
    passes — would refuse a call with ``positional`` positional arguments and the keyword arguments ``keywords`` for
    their count: too many positional ones, or a required one missing.  ``called`` says how ``owner`` calls it
    (``function(child, *args, **kwargs)``).  The cheap test first (it runs per ``tx.spawn``): the signature is read
    only to word a refusal, so a call Python might take is never refused."""
    plain: object = function
    given = positional
    if type(plain) is _MethodType:
        plain, given = plain.__func__, given + 1
    if type(plain) is not _FunctionType:
        return
    code = plain.__code__
    keywords = tuple(keywords)
    required_keywords = code.co_kwonlyargcount - len(plain.__kwdefaults__ or ())
    too_many = given > code.co_argcount and not code.co_flags & _inspect.CO_VARARGS
    too_few = not keywords and (given < code.co_argcount - len(plain.__defaults__ or ()) or required_keywords > 0)
    if not (too_many or too_few):
        return
    signature = _inspect.signature(function)     # (a method's without its instance, as it is called)
    try:
        signature.bind(*([None] * positional), **dict.fromkeys(keywords))
    except TypeError as refused:
        raise error(f"{owner} runs {called}; {plain.__name__}{signature} cannot be: {refused}") from None


def rule_past_deadline(rule: str, deadline: float) -> str:
    """``rule 'r' did not return within its deadline of N s``: how every rule deadline (an ingestion's,
    ``activedb.ingest.Deadlines``; the outbox's, ``OutboxOptions.rule_deadline``) names the firing it gave up."""
    return f"rule {rule!r} did not return within its deadline of {deadline:g} s"


def finite_number(value: float) -> bool:
    """Whether ``value`` (an int or a float) is finite as a float: False for NaN, an infinity and an int no float
    holds (``math.isfinite`` raises OverflowError for it) — the one test of every number activedb takes only finite
    (times, windows, priorities, deadlines)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def shown_error(error: BaseException | None, *, message: bool = False) -> str:
    """``repr(error)``, as a failure's message shows the error a user's code raised — or, with ``message``, its
    message alone, ``str(error)``.  When that error's own ``__repr__`` (``__str__``) raises:
    ``Type(<repr failed: Kind: message>)`` (``<str failed: Kind: message>``), the error's type still named and why it
    shows no more — the repr's error is never taken for the error itself.  The one way activedb shows a user's error
    in a reason, a record or a log line."""
    try:
        return str(error) if message else repr(error)
    except Exception as broken:
        try:
            said = f"{type(broken).__name__}: {broken}" if str(broken) else type(broken).__name__
        except Exception:
            said = type(broken).__name__
        return f"<str failed: {said}>" if message else f"{type(error).__name__}(<repr failed: {said}>)"


class InvalidTime(ActivedbError, ValueError):
    """A value given as a time (an event's timestamp, a punctuation's watermark) that is neither a finite number of
    seconds nor an aware datetime, or not of the kind of the times it is compared with; an accuracy, interval or
    local clock that ``activedb.events`` cannot take.  The message names it."""


class WaitTimeout(ActivedbError, TimeoutError):
    """A wait given a timeout ended before what it waited for: detached rule firings still running at the end of
    ``db.rules.wait_idle(timeout)``, a subtransaction still running at the end of ``handle.result(timeout)``, a
    change-capture consumer not caught up at the end of ``consumer.wait_caught_up(timeout)``.  The
    message names what is still running and what to do.  Also a ``TimeoutError``, as such errors were before they
    were activedb's."""


# --- database and server -------------------------------------------------------------

class DatabaseUnavailable(ActivedbError):
    """The database could not be reached (server down, connection refused, connection lost, bad
    credentials).  ``unknown_outcome``: when the connection broke while a top-level transaction committed and
    the transaction log could not be read, that transaction's ``activedb_transaction_log.transaction_id`` (its
    row there says whether it committed); None otherwise."""

    unknown_outcome: str | None = None


class BadDatabaseURL(DatabaseUnavailable):
    """The database URL cannot be used as written (not a URL, an unknown option, an unencoded ``@`` in the
    password); nothing was contacted."""


class DatabaseError(ActivedbError):
    """PostgreSQL refused a statement for a reason other than a lost connection or a serialization
    failure (disk full, a value too large for an index, a constraint).  ``sqlstate`` is its code."""

    def __init__(self, message: str, sqlstate: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate


class DiskFull(DatabaseError):
    """The database server's disk is full (SQLSTATE 53100): nothing was written."""


class ServerDiskFull(DiskFull, DatabaseUnavailable):
    """PostgreSQL stopped (a PANIC) because its disk is full — the write-ahead log could not be written, so
    every session lost its connection and no SQLSTATE came back.  Told from another lost connection by the
    server's log (:func:`disk_full_panic`); both a :class:`DiskFull` and a :class:`DatabaseUnavailable`."""


class Failure(enum.Enum):
    """What a failure means for the caller (:func:`classify`)."""

    CONNECTION_LOST = "connection lost"      # server down, connection refused or broken: retry when it is back
    SERIALIZATION_CONFLICT = "serialization conflict"    # another writer won: re-run the transaction
    DEADLOCK = "deadlock"                    # chosen as a deadlock's victim: re-run the transaction
    DISK_FULL = "disk full"                  # the server's disk is full: free space, then re-run
    BAD_VALUE = "bad value"                  # a value or row the schema refuses: fix the data
    SERVER_BUSY = "server busy"              # out of resources, a lock not available in time, operator
                                             # intervention, a system error: retry later
    REFUSED = "refused"                      # PostgreSQL refused the statement otherwise (see its SQLSTATE)
    BUG = "bug"                              # anything else: a bug in the application or in activedb

    @property
    def transient(self) -> bool:
        """True if the same work may succeed when it runs again later (nothing about it was wrong)."""
        return self in _TRANSIENT


_TRANSIENT = frozenset({Failure.CONNECTION_LOST, Failure.SERIALIZATION_CONFLICT, Failure.DEADLOCK,
                        Failure.DISK_FULL, Failure.SERVER_BUSY})


#: PostgreSQL's SQLSTATEs by their condition names (Appendix A of its manual), for the readers that tell one error
#: from another: a lock NOWAIT or lock_timeout could not take (lock_not_available), a full disk (disk_full), a value
#: beyond a limit (program_limit_exceeded), two constraint violations (unique_violation, not_null_violation), a
#: value the type refused (invalid_text_representation), a missing privilege (insufficient_privilege), and a
#: prepared statement gone or made stale (invalid_sql_statement_name, feature_not_supported).
LOCK_NOT_AVAILABLE, DISK_FULL, PROGRAM_LIMIT_EXCEEDED = "55P03", "53100", "54000"
UNIQUE_VIOLATION, NOT_NULL_VIOLATION, INVALID_TEXT_REPRESENTATION = "23505", "23502", "22P02"
INSUFFICIENT_PRIVILEGE, INVALID_SQL_STATEMENT_NAME, FEATURE_NOT_SUPPORTED = "42501", "26000", "0A000"

# What a SQLSTATE means, by its first characters; the first match wins.  08 (connection exception) and
# 57P01-57P05 (admin/crash shutdown, cannot connect now, idle session timeout): the connection or the server is
# gone, not the statement.
_SQLSTATES = ((("08", "57P"), Failure.CONNECTION_LOST), (("40001",), Failure.SERIALIZATION_CONFLICT),
              (("40P01",), Failure.DEADLOCK), ((DISK_FULL,), Failure.DISK_FULL),
              (("22", "23", "54"), Failure.BAD_VALUE), (("53", "57", "58", LOCK_NOT_AVAILABLE), Failure.SERVER_BUSY))


def sqlstate_of(error: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error (a psycopg error, or SQLAlchemy's wrapper of one), else None."""
    return getattr(getattr(error, "orig", None), "sqlstate", None) or getattr(error, "sqlstate", None)


def causes(error: BaseException, *, contexts: bool = True, shown: bool = False) -> Iterator[BaseException]:
    """``error`` and its causes (``raise ... from``) and contexts, outermost first; a context hidden with
    ``raise ... from None`` is hidden here too.  Past a rule's failure (:class:`RuleFailed`, whose cause is what the
    rule raised) only causes are followed — and from ``error`` on with ``contexts=False``, for an error a rule raised
    itself: an error a rule raised while it handled another — in an ``except`` block, which makes that other its
    context — is the rule's own, so a conflict or an outage the rule handled does not make its failure one
    (:func:`classify`: retried, or the batch run again, instead of the rule failing).  ``shown``: every error a
    traceback of ``error`` shows instead — each context not hidden, past a rule's failure too."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        contexts = shown or (contexts and not isinstance(current, RuleFailed))
        current = current.__cause__ if current.__cause__ is not None else (
            None if current.__suppress_context__ or not contexts else current.__context__)


def classify(error: BaseException, *, contexts: bool = True) -> Failure:
    """The one classifier of failures: what ``error`` (or the first cause in its chain that says — :func:`causes`,
    with ``contexts``) means.

    A lost or never-opened connection (SQLAlchemy invalidated it, SQLSTATE class 08 or 57P, or a
    connection-level error without a SQLSTATE, e.g. "Connection refused") is ``CONNECTION_LOST``.  psycopg's
    ``OperationalError`` or ``InterfaceError`` without a SQLSTATE is taken by the connection's real state where it
    is known: SQLAlchemy's exception for a statement on a connection says it (``connection_invalidated``: the
    dialect read psycopg's ``closed``/``broken``; ``activedb.store.driver_error`` sets it so for activedb's own
    driver calls) — a connection still intact means the client refused the statement itself (e.g. "number of
    parameters must be between 0 and 65535"): ``BUG``, not to be retried; unknown (psycopg's own exception, a
    connection attempt) stays ``CONNECTION_LOST``;
    SQLSTATE 40001 and :class:`SerializationConflict` are ``SERIALIZATION_CONFLICT``; 40P01 and the lock
    manager's deadlock (:class:`DeadlockDetected`, a ``lockmgr.Deadlock``) ``DEADLOCK``; 53100 ``DISK_FULL``; classes 22, 23 and 54 and :class:`SchemaError`
    ``BAD_VALUE``; the rest of classes 53, 57 and 58 and 55P03 (lock not available) ``SERVER_BUSY``; any other
    SQLSTATE ``REFUSED``; everything else ``BUG``.  ``Failure.transient`` says which may succeed when re-run."""
    for cause in causes(error, contexts=contexts):
        found = _classify_one(cause)
        if found is not None:
            return found
    return Failure.BUG


def _classify_one(error: BaseException) -> Failure | None:
    if isinstance(error, DiskFull):           # before DatabaseUnavailable: a ServerDiskFull is both
        return Failure.DISK_FULL
    if isinstance(error, DatabaseUnavailable):
        return Failure.CONNECTION_LOST
    if isinstance(error, SerializationConflict):
        return Failure.SERIALIZATION_CONFLICT
    if isinstance(error, SchemaError):
        return Failure.BAD_VALUE
    if isinstance(error, DatabaseError):
        return _by_sqlstate(error.sqlstate) or Failure.REFUSED
    from lockmgr import Deadlock

    if isinstance(error, Deadlock):
        return Failure.DEADLOCK
    if getattr(error, "connection_invalidated", False):
        return Failure.CONNECTION_LOST
    sqlstate = sqlstate_of(error)
    if sqlstate is not None:
        return _by_sqlstate(sqlstate) or Failure.REFUSED
    import psycopg

    if isinstance(getattr(error, "orig", None) or error, (psycopg.OperationalError, psycopg.InterfaceError)):
        # No SQLSTATE: the client's side failed.  SQLAlchemy's exception for a statement it ran on a connection
        # (``statement`` set; a connection attempt has none) says whether that connection was lost: found intact,
        # the client refused the statement itself, a permanent error.  Otherwise the state is unknown.
        import sqlalchemy as sa

        if isinstance(error, sa.exc.DBAPIError) and error.statement is not None:
            return Failure.BUG          # (connection_invalidated is False: read above)
        return Failure.CONNECTION_LOST
    return None


def _by_sqlstate(sqlstate: str | None) -> Failure | None:
    return next((failure for prefixes, failure in _SQLSTATES if sqlstate and sqlstate.startswith(prefixes)), None)


def database_failure(error: BaseException, doing: str, where: str, *, server_log: str | None = None,
                     lost: str | None = None, reflected: bool = False,
                     connect_timeout: float | None = None) -> ActivedbError:
    """The documented error a caller sees for a database ``error`` met while ``doing`` (e.g. "reading")
    at ``where`` (host and database, password masked): :class:`DatabaseUnavailable` (server down,
    connection refused or lost), :class:`DiskFull`, or :class:`DatabaseError` (refused, with the SQLSTATE
    and PostgreSQL's message).  ``server_log``: where the embedded server's log is, named in the advice.
    ``lost``: for a write of its own, what a lost connection left written and what to do (instead of a read's
    "nothing committed is affected … retry the transaction").  ``reflected``: the statement was composed from tables
    as this process reflected them, so a column or table PostgreSQL does not find may have changed since
    (:func:`reflected_table_changed`).  ``connect_timeout``: while ``doing`` is "connecting", the seconds libpq was
    given (named in the advice of a server that never answered; :func:`why_not_connected` tells the cause).
    Serialization conflicts and deadlocks are not turned into one of these (their callers retry them)."""
    kind = classify(error)
    orig = getattr(error, "orig", None) or error
    lines = str(orig).strip().splitlines()
    message = lines[0] if lines else type(orig).__name__
    log = f"; the server's log is {server_log}" if server_log else ""
    panic = disk_full_panic(server_log) if kind is Failure.CONNECTION_LOST else None
    if panic is not None:
        return ServerDiskFull(
            f"PostgreSQL stopped ({where}) while {doing}: its disk is full — its log {server_log} says: {panic}. "
            f"{DISK_FULL_ADVICE}")
    if kind is Failure.CONNECTION_LOST and doing == "connecting":
        pgconn = getattr(orig, "pgconn", None)
        user, database = (("the user", "the database") if pgconn is None else
                          (pgconn.user.decode(errors="replace"), pgconn.db.decode(errors="replace")))
        advice = connect_advice(why_not_connected(error, connect_timeout), user=user, database=database,
                                waited=connect_timeout)
        urls = "connect(url), ACTIVEDB_DATABASE_URL or the command line's --url"
        return DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {where}: {message}. "
            + (f"{advice[0].upper()}{advice[1:]} (the URL: {urls}){log}" if advice else
               f"Check the URL ({urls}) and that the server is running{log}"))
    if kind is Failure.CONNECTION_LOST and lost is not None:
        return DatabaseUnavailable(
            f"lost the connection to PostgreSQL ({where}) while {doing}: {message}; {lost} — check that the server "
            f"is up{log}")
    if kind is Failure.CONNECTION_LOST:
        return DatabaseUnavailable(
            f"lost the connection to PostgreSQL ({where}) while {doing}: {message}; nothing committed is "
            f"affected — check that the server is up{log}, then retry the transaction")
    sqlstate = sqlstate_of(error)
    import psycopg

    if kind is Failure.BUG and isinstance(orig, (psycopg.OperationalError, psycopg.InterfaceError)):
        return DatabaseError(
            f"the PostgreSQL client (psycopg) refused {doing} ({where}), the connection intact: {message}. "
            f"{_HINTS[kind]}")
    if kind is Failure.DISK_FULL:
        return DiskFull(
            f"PostgreSQL's disk is full ({where}) while {doing} (SQLSTATE {sqlstate}): {message}. Nothing was "
            f"written; free space on the server's disk{log}, then retry", sqlstate=sqlstate)
    hint = (own_table_missing(error) or (reflected_table_changed(error) if reflected else None)
            or _HINTS.get(kind, "Fix what the message says, then retry"))
    return DatabaseError(f"PostgreSQL refused {doing} ({where}) (SQLSTATE {sqlstate}): {message}. {hint}",
                         sqlstate=sqlstate)


class Unconnected(enum.Enum):
    """Why a connection to PostgreSQL failed, as :func:`why_not_connected` tells it."""

    NO_ANSWER = "nothing answered within connect_timeout"
    UNKNOWN_HOST = "the host name does not resolve"
    UNREACHABLE = "nothing accepts connections at the address"
    NO_PASSWORD = "the server asks for a password and none was given"
    AUTHENTICATION = "the server refused the user or its password"
    NOT_PERMITTED = "the user may not connect to the database"
    NO_DATABASE = "the database does not exist"
    OTHER = "the server refused for another reason"


#: The most seconds the probe of :func:`why_not_connected` waits for the server's address to accept a connection.
PROBE_SECONDS = 5.0


def why_not_connected(error: BaseException, connect_timeout: float | None = None) -> Unconnected:
    """Why connecting failed with ``error`` (psycopg's, or SQLAlchemy's around it).

    libpq gives no SQLSTATE for an error met while connecting (the server's FATAL reaches psycopg as text only:
    ``error.sqlstate`` is None), so the cause is told by kinds first: psycopg's ``ConnectionTimeout``; no
    connection attempt at all (psycopg could not resolve the host: no ``pgconn``); libpq's
    ``PQconnectionNeedsPassword``; the operating system's error on a plain socket to the address libpq tried (a
    refused port, a missing socket file: nothing to talk to; the probe waits at most ``connect_timeout`` and
    :data:`PROBE_SECONDS`).  Only a server that was reached and refused is told by its message, PostgreSQL's own
    phrases for its authentication failures (28P01, 28000), a missing CONNECT privilege (42501) or ``pg_hba.conf``
    line (28000) and a missing database (3D000); a server whose messages are translated is ``OTHER`` (its message
    is shown, with no advice that could be wrong)."""
    import psycopg.errors

    orig = getattr(error, "orig", None) or error
    if isinstance(orig, psycopg.errors.ConnectionTimeout):
        return Unconnected.NO_ANSWER
    pgconn = getattr(orig, "pgconn", None)
    if pgconn is None:          # (no connection attempted: psycopg resolves the host names itself, libpq never ran)
        if not isinstance(orig, psycopg.OperationalError):
            return Unconnected.OTHER
        return Unconnected.UNKNOWN_HOST if "failed to resolve host" in str(orig) else Unconnected.UNREACHABLE
    if pgconn.needs_password:
        return Unconnected.NO_PASSWORD
    address = (pgconn.hostaddr or pgconn.host).decode(errors="replace")
    seconds = min(PROBE_SECONDS, connect_timeout) if connect_timeout else PROBE_SECONDS
    if _unreachable(address, pgconn.port.decode(errors="replace"), seconds) is not None:
        return Unconnected.UNREACHABLE
    said = pgconn.error_message.decode(errors="replace")
    if "authentication failed for user" in said:
        return Unconnected.AUTHENTICATION
    if "permission denied for database" in said or "pg_hba.conf" in said:
        return Unconnected.NOT_PERMITTED
    if re.search(r'database ".*" does not exist', said):
        return Unconnected.NO_DATABASE
    return Unconnected.OTHER


def _unreachable(host: str, port: str, seconds: float) -> OSError | None:
    """The operating system's error on opening a plain socket to ``host`` (a name, an address, or a directory of
    PostgreSQL's socket file) and ``port`` within ``seconds``; None if something accepted it (or the address is an
    abstract socket's, ``@…``, not probed)."""
    import socket

    if host.startswith("@"):
        return None
    try:
        if host.startswith("/"):
            with socket.socket(socket.AF_UNIX) as unix:
                unix.settimeout(seconds)
                unix.connect(f"{host}/.s.PGSQL.{port}")
        else:
            socket.create_connection((host or "localhost", int(port or 5432)), timeout=seconds).close()
    except (OSError, ValueError) as error:
        return error if isinstance(error, OSError) else None
    return None


#: What to do about each cause of a failed connection (:func:`connect_advice` fills in the names).
_CONNECT_ADVICE = {
    Unconnected.NO_ANSWER: ("no answer {within}: is the host reachable and does PostgreSQL listen on that port? A "
                            "server slower to answer: add ?connect_timeout=SECONDS to the URL"),
    Unconnected.UNKNOWN_HOST: "the host name does not resolve: correct the URL's host, or check this machine's DNS",
    Unconnected.UNREACHABLE: ("nothing accepts connections there: start PostgreSQL on that host and port, or correct "
                              "the URL's host and port; without a URL the embedded server is used"),
    Unconnected.NO_PASSWORD: ("the server asks {user} for a password and the URL gives none: "
                              "postgresql://{user}:PASSWORD@HOST:PORT/DATABASE, or a line of ~/.pgpass"),
    Unconnected.AUTHENTICATION: ("authentication failed: the URL's user {user} or its password is wrong for this "
                                 "server — correct them in the URL"),
    Unconnected.NOT_PERMITTED: ("the user may not connect to {quoted}: GRANT CONNECT ON DATABASE {database} TO {user} "
                                "and a pg_hba.conf line that admits the user there, or name in the URL a database it "
                                "may connect to"),
    Unconnected.NO_DATABASE: ("there is no database {quoted} on that server: create it (CREATE DATABASE {database}, "
                              "or createdb {database}) or name an existing one in the URL"),
    Unconnected.OTHER: "",
}


def libpq_timeout(value: object) -> int | None:
    """A ``connect_timeout`` as libpq (and psycopg) read it — whole seconds, at least 2 ("a value of 1 is interpreted
    as 2"), from a number or a URL's text —; None where it waits without end (0, negative) or the value is no
    number."""
    try:
        seconds = int(float(value)) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else 0
    except ValueError:
        return None
    return max(2, seconds) if seconds > 0 else None


def connect_advice(why: Unconnected, *, user: str, database: str, waited: object = None) -> str:
    """What to do about a connection to ``database`` as ``user`` that failed for ``why`` (``waited``: the
    connect_timeout given, if known: :func:`libpq_timeout` says how long that was), as one clause; "" when nothing
    sure can be said (``OTHER``).  The caller says where its URL comes from."""
    seconds = libpq_timeout(waited)
    within = f"within {seconds} seconds, the connect_timeout" if seconds is not None else "within the connect_timeout"
    return _CONNECT_ADVICE[why].format(user=user, database=database, quoted=repr(database), within=within)


#: PostgreSQL's SQLSTATE of a relation that does not exist (undefined_table), and its message for one of activedb's.
UNDEFINED_TABLE = "42P01"
#: PostgreSQL's SQLSTATEs of a column (undefined_column) and of another object — a type, a function — (undefined_object)
#: that does not exist.
UNDEFINED_COLUMN, UNDEFINED_OBJECT = "42703", "42704"
_MISSING_OWN_TABLE = re.compile(r'relation "(activedb_\w+)" does not exist')


def own_table_missing(error: BaseException) -> str | None:
    """What ``error`` (PostgreSQL's, or SQLAlchemy's wrapper of one) is told if it is a statement's on one of activedb's
    own tables that does not exist (SQLSTATE 42P01, a relation ``activedb_…``): the version table says the revision
    that creates it ran, so it was dropped or renamed by hand, or left out of a restore; None for any other error."""
    orig = getattr(error, "orig", None) or error
    missing = _MISSING_OWN_TABLE.search(str(orig)) if sqlstate_of(error) == UNDEFINED_TABLE else None
    if missing is None:
        return None
    table = missing[1]
    return (f"activedb's own table {table} is missing, though the version table (activedb_alembic_version) says the "
            f"revision that creates it ran: it was dropped or renamed by hand, or left out of a restore. `activedb db "
            f"upgrade` does not re-create it (it goes by the version table, and finds nothing to run): restore it "
            f"from a backup, or create it again with its statements in what `activedb db upgrade --sql` prints")


def reflected_table_changed(error: BaseException) -> str | None:
    """What ``error`` is told if PostgreSQL found no column (SQLSTATE 42703) or no relation (42P01, not one of
    activedb's own: :func:`own_table_missing`) in a statement activedb composed from a table as this process reflected
    it: another process's migration may have dropped or renamed it since — the counterpart of the ``UnknownColumn``
    of a column added since; None for any other error."""
    if sqlstate_of(error) not in (UNDEFINED_COLUMN, UNDEFINED_TABLE) or own_table_missing(error) is not None:
        return None
    return ("The table may have changed since this process read it (a migration run elsewhere dropped or renamed a "
            "column or the table): call db.schema.refresh() and retry")


DISK_FULL_ADVICE = ("Free space on the disk of the server's data directory (its write-ahead log, pg_wal, needs it "
                    "first): the server reinitializes after a PANIC and needs that space to recover; then retry")

#: How long after a PANIC for a full disk a lost connection is put down to it.
PANIC_RECENT_SECONDS = 600.0
_LOG_TAIL_BYTES = 256 * 1024


def disk_full_panic(server_log: str | None, *, now: _dt.datetime | None = None) -> str | None:
    """The line of PostgreSQL's log ``server_log`` (the embedded server's; None: unknown) saying the server
    PANICked on a full disk ("No space left on device"), if it is the log's latest PANIC and was logged in
    the last :data:`PANIC_RECENT_SECONDS`; else None.  A full disk under the write-ahead log reaches the
    client only as a lost connection: this is how that case is told apart.  Reads the log's last 256 kB;
    a line without the embedded server's timestamp prefix (``%m``) is not trusted."""
    if not server_log:
        return None
    try:
        with open(server_log, "rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - _LOG_TAIL_BYTES))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    panic = next((line for line in reversed(tail.splitlines()) if "PANIC:" in line), None)
    if panic is None or "No space left on device" not in panic:
        return None
    stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) (\S+)", panic)
    if stamp is None:
        return None
    logged = _dt.datetime.fromisoformat(stamp.group(1))
    now = now or _dt.datetime.now(_dt.timezone.utc)
    zone = _zone(stamp.group(2))
    candidates = [now.astimezone(zone).replace(tzinfo=None)] if zone is not None else [
        now.astimezone().replace(tzinfo=None), now.replace(tzinfo=None)]     # an abbreviation: local or UTC
    if not any(-60 <= (candidate - logged).total_seconds() <= PANIC_RECENT_SECONDS for candidate in candidates):
        return None
    return panic[panic.index("PANIC:"):].strip()


def _zone(name: str) -> _dt.tzinfo | None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if name in ("UTC", "GMT"):
        return _dt.timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


_HINTS = {
    Failure.BAD_VALUE: "A value or row does not fit the schema (a constraint, a type, a size limit): fix the data",
    Failure.BUG: "This looks like a bug: report it with the message",
}


class EmbeddedServerError(ActivedbError):
    """The embedded PostgreSQL server could not be started or reused."""


class MigrationError(ActivedbError):
    """The schema could not be upgraded or downgraded."""


class SchemaNotAtHead(MigrationError):
    """activedb's own tables are not at the revision this installation needs (the CLI never upgrades
    them on its own; ``activedb db upgrade`` does)."""


class PictureError(ActivedbError):
    """A picture could not be drawn or read: an unknown format, a saved explanation that is missing or
    not one, a benchmark with nothing to plot."""


# --- store usage ----------------------------------------------------------------------

class SchemaError(ActivedbError):
    """A table, column or value does not fit the database schema."""


class UnknownTable(SchemaError):
    pass


class UnknownColumn(SchemaError):
    pass


class InvalidValue(SchemaError):
    pass


class NestedTooDeep(InvalidValue):
    """A value's lists, dicts or tuples nest deeper than activedb takes: where a value enters the engine (a column's
    value in ``tx.write``, ``insert``, ``write_many``; a field of ``tx.emit``'s or ``tx.signal``'s payload) deeper
    than ``activedb.store.JSONABLE_DEPTH`` levels, or deeper than ``activedb.store.EXACT_DEPTH`` in
    ``activedb.store.exact_json``.  The message names the field, how deep the value is and the bound, and says to
    flatten it or store it as JSON text."""


class InvalidKey(SchemaError):
    """A key does not match the table's primary key (wrong arity or missing)."""


# --- transactions ---------------------------------------------------------------------

class TransactionError(ActivedbError):
    """A transaction was used in a state that does not allow the operation."""


class TransactionAborted(TransactionError):
    """The transaction was aborted (by its own failure, a deadlock, or its parent)."""


class SerializationConflict(TransactionError):
    """Another process changed data this transaction read or wrote; retries were exhausted."""


# The lock manager's errors as activedb raises them (see the module docstring): defined by
# ``_define_lock_errors`` on first use; their declarations for type checkers are these.
if TYPE_CHECKING:  # pragma: no cover
    class DeadlockDetected(TransactionError, lockmgr.Deadlock):
        outside: dict[str, str]

        def __init__(self, victim: Hashable, requester: Hashable, cycle: tuple[lockmgr.WaitEdge, ...], policy: str,
                     snapshot: lockmgr.LockTableSnapshot | None = None, note: str | Lazy = "", *,
                     outside: Mapping[str, str] | None = None) -> None: ...

    class LockWaitTimeout(TransactionError, lockmgr.LockTimeout): ...


def _define_lock_errors() -> dict[str, type[TransactionError]]:
    import lockmgr

    class DeadlockDetected(TransactionError, lockmgr.Deadlock):
        """This transaction's wait closed (or sat on) a wait-for cycle and it was chosen as the victim: it is
        aborted; run its work again (``Database.run(fn)`` and ``tx.retry(fn)`` do).  Also a
        ``lockmgr.Deadlock``: ``victim``, ``requester``, ``cycle`` (the wait edges), ``policy``, ``snapshot``;
        ``explanation`` (a picture) with ``connect(explain_deadlocks=True)``.  ``outside``: for a cycle through
        another process's (or another client's) backends, what PostgreSQL showed of each when the cycle was found
        (application name, state, statement), keyed by its node in ``cycle`` (``"backend PID"``); they are gone by
        the time anyone reads it.  Empty for a cycle inside this process."""

        def __init__(self, victim: Hashable, requester: Hashable, cycle: tuple[lockmgr.WaitEdge, ...], policy: str,
                     snapshot: lockmgr.LockTableSnapshot | None = None, note: str | Lazy = "", *,
                     outside: Mapping[str, str] | None = None) -> None:
            super().__init__(victim, requester, cycle, policy, snapshot, note)
            self.outside = dict(outside or {})

        def __str__(self) -> str:
            path = "; ".join(edge.describe() for edge in self.cycle)
            note = f" {self.note}" if self.note else ""
            return (f"deadlock: transaction {self.victim!r} was chosen as the victim (policy {self.policy!r}) of "
                    f"the wait-for cycle [{path}]; it is aborted: run its work again in a new transaction "
                    f"(Database.run(fn) re-runs on a deadlock, tx.retry(fn) a subtransaction).{note}")

    class LockWaitTimeout(TransactionError, lockmgr.LockTimeout):
        """A lock wait took longer than ``connect(lock_timeout=...)``: the transaction is aborted; run it again
        later.  Also a ``lockmgr.LockTimeout``: ``tid``, ``resource``, ``mode``, ``timeout``, ``blockers``."""

        def __str__(self) -> str:
            blockers = ", ".join(sorted(repr(blocker) for blocker in self.blockers)) or "nobody any more"
            return (f"transaction {self.tid!r} waited {self.timeout:g} s for {getattr(self.mode, 'name', self.mode)} "
                    f"on {self.resource!r} (blocked by {blockers}) and is aborted: run it again later, or raise "
                    f"connect(lock_timeout=...)")

    for defined in (DeadlockDetected, LockWaitTimeout):
        defined.__module__, defined.__qualname__ = __name__, defined.__name__
    return {"DeadlockDetected": DeadlockDetected, "LockWaitTimeout": LockWaitTimeout}


_LOCK_ERRORS = ("DeadlockDetected", "LockWaitTimeout")


def __getattr__(name: str) -> type[TransactionError]:
    if name in _LOCK_ERRORS:
        defined = _define_lock_errors()
        globals().update(defined)
        return defined[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class GeneratedKeysReset(SerializationConflict):
    """A generated key the transaction used came from a sequence that was reset since (``TRUNCATE …
    RESTART IDENTITY``): nothing was written; re-running the transaction draws fresh keys.  A
    :class:`SerializationConflict`, so ``Database.run`` and the outbox retry it."""

    def __init__(self, message: str, sequence: str | None = None):
        super().__init__(message)
        self.sequence = sequence


class DuplicateKey(TransactionError):
    """An insert found a row with the same primary key (``table``: where, when known)."""

    def __init__(self, message: str, table: str | None = None):
        super().__init__(message)
        self.table = table


# --- rules ----------------------------------------------------------------------------

class RuleError(ActivedbError):
    """A rule definition is invalid."""


class RuleDefinitionChangedWarning(UserWarning):
    """A persisted rule was redefined with a different definition (its version is bumped)."""


class CascadeLimitExceeded(TransactionError):
    """Rules fired rules beyond the configured depth."""

    def __init__(self, message: str, chain: list[str]):
        super().__init__(message)
        self.chain = chain


class _Described(Protocol):
    """An event as a failure names it (``activedb.Event.describe``)."""

    def describe(self) -> str: ...


class RuleFailed(TransactionError):
    """A rule's condition or action raised; the original error is ``__cause__``."""

    def __init__(self, message: str, rule: str, event: object):
        super().__init__(message)
        self.rule = rule
        self.event = event

    @classmethod
    def raised(cls, rule: str, event: _Described, error: BaseException) -> "RuleFailed":
        """The failure of rule ``rule`` whose condition or action raised ``error`` on ``event`` (an
        ``activedb.Event``: its ``describe()`` names it); the caller raises it ``from error``."""
        return cls(f"rule {rule!r} failed on {event.describe()}: {shown_error(error)}", rule, event)

    @classmethod
    def logged(cls, rule: str, event: _Described, error: BaseException) -> "RuleFailed":
        """:meth:`raised`, the failure logged: the one record of a rule's failure, whether firing ran the rule or a
        lowered batch did (which rejects the event for it) — at ERROR to the rules' log (``activedb.rules``), its
        message the failure's, "rule NAME failed on EVENT: ERROR".  The event is described and the error shown once,
        for the failure and the record alike (a rejected event's dead letter is named by the failure).  The record
        holds the error as text, not the error: a handler that keeps records (a test's capture, a buffer) would
        otherwise keep its traceback's frames and all they hold, a micro-batch included.  The caller raises the
        failure ``from error``."""
        described, shown = event.describe(), shown_error(error)
        _RULES_LOG.error("rule %r failed on %s: %s", rule, described, shown, stacklevel=2)
        return cls(f"rule {rule!r} failed on {described}: {shown}", rule, event)


#: The log of rules' failures (:meth:`RuleFailed.logged`); ``activedb.rules`` logs its other records there too.
_RULES_LOG = _logging.getLogger("activedb.rules")


# --- the outbox of detached rule firings -----------------------------------------------

class OutboxError(ActivedbError):
    """The outbox of detached rule firings could not record or run a firing."""


class RecordsTakenOver(OutboxError, SerializationConflict):
    """Outbox records this process was running were claimed by another process meanwhile (this process
    lost its liveness lock, e.g. after its connection broke): the transaction that would have marked them
    done wrote nothing; the other process runs them."""


class RuleDeadlineExceeded(OutboxError):
    """A detached-family firing did not return within the outbox's rule deadline (``OutboxOptions(rule_deadline=…)``)
    and was given up: its group transaction was doomed — nothing it wrote commits, even if its thread returns —, its
    record failed with this message, its group runner freed, its lock-manager locks released.  Python cannot stop a
    thread: the rule's thread runs on until it returns, and what it does outside the database is not undone.
    ``rule``: the rule's name; ``record_id``: its outbox record (``activedb outbox --retry ID`` runs it again, once the
    rule is fixed)."""

    def __init__(self, message: str, *, rule: str, record_id: int) -> None:
        super().__init__(message)
        self.rule = rule
        self.record_id = record_id

    def __reduce__(self) -> tuple[object, ...]:       # (pickled with its keywords)
        return _rebuild_deadline, (str(self), self.rule, self.record_id)


def _rebuild_deadline(message: str, rule: str, record_id: int) -> RuleDeadlineExceeded:
    return RuleDeadlineExceeded(message, rule=rule, record_id=record_id)


# --- ingestion ------------------------------------------------------------------------

class BatchAlreadyCommitted(TransactionError):
    """The (query id, batch id) pair was committed before: the batch is skipped."""
