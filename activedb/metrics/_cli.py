"""``--metrics-port`` for the long-running commands (``activedb run``, ``activedb capture consume``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

_Command = TypeVar("_Command", bound=Callable[..., Any])

import click

if TYPE_CHECKING:  # pragma: no cover
    from activedb.metrics._collector import ScrapedDatabase
    from activedb.metrics._exporter import MetricsExporter

HELP = ("Serve Prometheus metrics on http://127.0.0.1:PORT/metrics (ADDRESS:PORT to choose the interface, "
        "e.g. 0.0.0.0:9464, or [::1]:9464 for IPv6; 0: any free port). Off by default.")


def metrics_port_option(function: _Command) -> _Command:
    """The ``--metrics-port [ADDRESS:]PORT`` option (the value reaches the command as ``metrics_port``, as given).
    A value that is no ``[ADDRESS:]PORT`` (``parse_listen``) is click's usage error (exit 2), before the command
    does anything — not a refusal once the exporter starts, after the command created tables."""
    return click.option("--metrics-port", "metrics_port", default=None, metavar="[ADDRESS:]PORT", help=HELP,
                        callback=_checked_listen)(function)


def _checked_listen(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from activedb.metrics._exporter import parse_listen
    from activedb.metrics.errors import MetricsError

    try:
        parse_listen(value)
    except MetricsError as error:
        reason = str(error).removeprefix(f"--metrics-port {value.strip()!r}: ")
        raise click.BadParameter(f"{value.strip()!r} is no [ADDRESS:]PORT: {reason}", ctx, param) from None
    return value


def start_metrics(database: ScrapedDatabase, listen: str | None) -> MetricsExporter | None:
    """A started :class:`~activedb.metrics.MetricsExporter` on ``listen``, or None when ``listen`` is None.
    The caller closes it.  A bad value or a port in use is a one-line click error."""
    if listen is None:
        return None
    from activedb.metrics._exporter import MetricsExporter
    from activedb.metrics.errors import MetricsError

    exporter = MetricsExporter(database)
    try:
        exporter.start(listen)
    except MetricsError as error:
        raise click.ClickException(str(error)) from None
    return exporter
