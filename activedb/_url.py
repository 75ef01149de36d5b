"""Database URLs: parsing (``postgresql://`` URLs and libpq ``key=value`` strings, for the psycopg 3 driver),
describing one for a message, and masking passwords in any text that may show one.  Used by ``connect()``
(``_database.py``, which is wiring only) and by everything that prints a URL or an error that may hold one."""

from __future__ import annotations

import re
import urllib.parse

from sqlalchemy.engine import URL, make_url

from activedb.errors import BadDatabaseURL


# A password in a URL's user info (``scheme://user:SECRET@host``, also when the rest does not parse), and a
# ``password=`` parameter (URL query, or libpq's ``key=value`` connection string; quoted values too).
# The secret runs to the "@" before the host, the last of the user info: a password may hold "@" unencoded (refused by
# normalise_url, but shown in its message), and that "@" is followed by more "@" before the host's end.
_URL_USERINFO_SECRET = re.compile(r"(://[^:/?#@\s]*:)(\S*?)(@)(?=[^\s@/?#]*(?:[/?#\s]|$))")
# (An unquoted value runs to a space, libpq's end of a value, or to "&", a URL query's: a "," ";" or quote inside
# it is the password's.)
_PASSWORD_PARAMETER = re.compile(
    r"""(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&]+)""")
MASK = "***"


def mask_secrets(text: str) -> str:
    """``text`` with every database password masked: in URLs (user info and ``?password=``), and in libpq
    ``host=... password=...`` strings.  Applied to every message and log line that may show a URL."""
    text = _URL_USERINFO_SECRET.sub(lambda match: f"{match.group(1)}{MASK}{match.group(3)}", text)
    return _PASSWORD_PARAMETER.sub(lambda match: f"{match.group(1)}{MASK}", text)


def normalise_url(url: str | URL) -> URL:
    """Accept ``postgresql://`` / ``postgres://`` URLs (a password in the query string moves into the URL's
    user info) and libpq ``key=value`` connection strings; use the psycopg 3 driver."""
    if isinstance(url, str) and "://" not in url and "=" in url:
        url = _from_conninfo(url)
    try:
        parsed = make_url(url)
    except Exception as error:
        raise BadDatabaseURL(
            f"not a database URL: {mask_secrets(str(url))!r} ({mask_secrets(str(error))}); expected "
            f"postgresql://user:password@host:port/database") from None
    if "@" in (parsed.host or "") or "@" in (parsed.database or "") or "@" in str(parsed.query.get("host", "")):
        raise BadDatabaseURL(
            f"the database URL has more than one '@' before its host (it would connect to host "
            f"{(parsed.host or '').rsplit('@', 1)[-1]!r}): a password containing '@' must be percent-encoded as %40 "
            f"(urllib.parse.quote(password, safe='')), or given apart from the URL: in the PGPASSWORD environment "
            f"variable, or as the URL's query parameter named password")
    backend, _, driver = parsed.drivername.partition("+")
    if backend in ("postgresql", "postgres") and driver not in ("", "psycopg"):
        raise BadDatabaseURL(
            f"activedb connects to PostgreSQL with the psycopg 3 driver, not {driver!r} ({describe_url(parsed)}): "
            f"write it with postgresql:// (or postgresql+psycopg://) at its start")
    if backend in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.host and "%" in parsed.host and "host" not in parsed.query:
        # libpq's URL names a unix socket's directory as the host, percent-encoded (postgresql://%2Fvar%2Frun%2Fpg/db);
        # SQLAlchemy keeps it as written, which the driver would look up as a host name.
        directory = urllib.parse.unquote(parsed.host)
        if directory.startswith("/"):
            parsed = parsed.set(host=None, query={**parsed.query, "host": directory})
    if "password" in parsed.query:
        query = {key: value for key, value in parsed.query.items() if key != "password"}
        secret = parsed.query["password"]
        parsed = parsed.set(password=secret if isinstance(secret, str) else secret[0], query=query)
    if not parsed.drivername.startswith("postgresql"):
        raise BadDatabaseURL(
            f"activedb needs PostgreSQL, got a {parsed.drivername!r} URL ({describe_url(parsed)})")
    return parsed


def _from_conninfo(conninfo: str) -> URL:
    """A libpq ``key=value`` connection string as a SQLAlchemy URL."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = {key: str(value) for key, value in conninfo_to_dict(conninfo).items()}
    except Exception as error:
        raise BadDatabaseURL(
            f"not a connection string: {mask_secrets(conninfo)!r} ({mask_secrets(str(error))}); expected "
            f"postgresql://user:password@host:port/database or host=... dbname=... user=...") from None
    host = parts.pop("host", None)
    port = parts.pop("port", None)
    if port and not all(part.isdigit() for part in port.split(",")):
        raise BadDatabaseURL(
            f"the connection string's port {port!r} is no number: give port=5432 (or one port per host, "
            f"host=h1,h2 port=5432,5433)")
    query = {}
    if host and (host.startswith("/") or (port and "," in port)):
        query["host"] = host            # a socket directory, or libpq's list of hosts with their list of ports
        host = None
    if port and "," in port:
        query["port"] = port
        port = None
    query.update(parts)
    return URL.create("postgresql+psycopg", username=query.pop("user", None), password=query.pop("password", None),
                      host=host, port=int(port) if port else None,
                      database=query.pop("dbname", None), query=query)


def describe_url(url: URL) -> str:
    """Host, port and database with the password masked, for error messages."""
    host = url.host or url.query.get("host") or "localhost"
    port = f":{url.port}" if url.port else ""
    return mask_secrets(f"host {host}{port}, database {url.database!r} ({url.render_as_string(hide_password=True)})")
