"""Database URLs: parsing (``postgresql://`` URLs and libpq ``key=value`` strings, for the psycopg 3 driver),
describing one for a message, masking passwords in any text that may show one, and the driver's connect timeout
for a URL.  Used by ``connect()`` (``_database.py``, which is wiring only) and by everything that prints a URL or an
error that may hold one."""

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
# A URL written without its scheme (``user:password@host/db``): user info, up to an "@", before any "=" or space (which
# would make it a libpq ``key=value`` string).  Refused with the scheme put back, so its password can be masked.
_NO_SCHEME = re.compile(r"[^\s=]*@")


def mask_secrets(text: str) -> str:
    """``text`` with every database password masked: in URLs (user info and ``?password=``), and in libpq
    ``host=... password=...`` strings.  Applied to every message and log line that may show a URL."""
    text = _URL_USERINFO_SECRET.sub(lambda match: f"{match.group(1)}{MASK}{match.group(3)}", text)
    return _PASSWORD_PARAMETER.sub(lambda match: f"{match.group(1)}{MASK}", text)


def normalise_url(url: str | URL) -> URL:
    """Accept ``postgresql://`` / ``postgres://`` URLs (a password in the query string moves into the URL's
    user info) and libpq ``key=value`` connection strings; use the psycopg 3 driver."""
    if isinstance(url, str) and "://" not in url and _NO_SCHEME.match(url):
        raise BadDatabaseURL(
            f"the database URL lacks postgresql:// at its start: write {mask_secrets('postgresql://' + url)!r}")
    if isinstance(url, str) and "://" not in url and "=" in url:
        url = _from_conninfo(url)
    elif isinstance(url, str):
        url = _several_hosts(url)
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
            f"activedb needs PostgreSQL, got a {parsed.drivername!r} URL ({describe_url(parsed)}): give a PostgreSQL "
            f"server's, postgresql://user:password@host:port/database")
    return parsed


#: A URL whose authority names several hosts, as libpq writes them (``scheme://[user info@]h1:p1,h2,…/…``): the
#: user info runs to the last "@" before the path (a password may hold one unencoded, refused later), the host list
#: to the path, query or fragment.
_SEVERAL_HOSTS = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://(?:[^/?#]*@)?)(?P<hosts>[^/?#@]*,[^/?#@]*)(?P<tail>[/?#].*)?",
                            re.DOTALL)
#: One of them: a name, an address, a percent-encoded socket directory or a bracketed IPv6 address, its port after ":".
_ONE_HOST = re.compile(r"(?P<host>\[[^\]]*\]|[^:]*)(?::(?P<port>[^:]*))?")


def _several_hosts(url: str) -> str:
    """A URL of several hosts (libpq's ``postgresql://u@h1:5432,h2:5433/db``, each host with its own port or the
    default) in the form SQLAlchemy reads for the driver: ``?host=h1,h2&port=5432,5433`` (an empty port: the
    default), as libpq's ``key=value`` form gives them (``_from_conninfo``).  SQLAlchemy reads the host list as one
    host, and what follows the first ":" as its port: ``h1:5432,h2`` fails as no number, and ``h1,h2:5433`` would
    put every host on 5433, where libpq puts ``h1`` on the default port.  Any other URL is returned as it is (so are
    one without a port, whose host list the driver gets as it is, and one that names ``host`` or ``port`` in its
    query too: SQLAlchemy's to refuse)."""
    match = _SEVERAL_HOSTS.fullmatch(url)
    if match is None:
        return url
    tail = match.group("tail") or ""
    path, _, query = tail.partition("?")
    if re.search(r"(?:^|&)(?:host|port)=", query):
        return url
    hosts, ports = [], []
    for entry in match.group("hosts").split(","):
        one = _ONE_HOST.fullmatch(entry)
        host, port = (one.group("host"), one.group("port") or "") if one is not None else (entry, "")
        if port and not port.isdigit():
            raise BadDatabaseURL(
                f"the database URL's port {port!r} of host {urllib.parse.unquote(host)!r} is no number "
                f"({mask_secrets(url)}); give each host its port as a number, or none for the default: "
                f"postgresql://user@host1:5432,host2:5433/database")
        hosts.append(urllib.parse.unquote(host.strip("[]") if host.startswith("[") else host))
        ports.append(port)
    if not any(ports):
        return url          # (the host list as one host reaches the driver as it is; a socket's: normalise_url)
    encoded = urllib.parse.urlencode([("host", ",".join(hosts)), ("port", ",".join(ports))], safe="/,:")
    return f"{match.group('head')}{path or '/'}?{encoded}{'&' + query if query else ''}"


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


#: Seconds libpq waits for a connection unless told otherwise (``EngineOptions.connect_timeout``'s default).
CONNECT_TIMEOUT = 5


def timeout_args(url: URL, seconds: int = CONNECT_TIMEOUT) -> dict[str, object]:
    """The driver's ``connect_args`` that bound a connection to ``url`` to ``seconds``: none when the URL gives its
    own ``connect_timeout`` (SQLAlchemy passes ``connect_args`` over the URL's options, so a default there would
    silently replace the URL's)."""
    return {} if "connect_timeout" in url.query else {"connect_timeout": seconds}
