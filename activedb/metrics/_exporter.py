"""The HTTP endpoint: one :class:`MetricsExporter` per process, serving ``/metrics``."""

from __future__ import annotations

import threading
from typing import Any

from activedb.metrics._collector import ActivedbCollector, ConsumerSource, IngestionSource, ScrapedDatabase
from activedb.metrics.errors import MetricsError

DEFAULT_ADDRESS = "127.0.0.1"


def parse_listen(text: str | int) -> tuple[str, int]:
    """``"9464"`` -> ``("127.0.0.1", 9464)``; ``"0.0.0.0:9464"`` -> all interfaces.  Port 0: any free port."""
    value = str(text).strip()
    address, _, port = value.rpartition(":")
    bracketed = address.startswith("[") and address.endswith("]")
    if address.startswith("[") or address.endswith("]"):
        address = address[1:-1] if bracketed else "["     # ("[": no address)
    # (decimal digits only: int() also takes "1_000", "+80", and other scripts' digits)
    number = int(port) if port.isascii() and port.isdigit() else -1
    # (An IPv6 address only in brackets: "::1:9464" is itself an address, so which part is the port is a guess.)
    if not 0 <= number <= 65535 or not _an_address(address) or (":" in address and not bracketed):
        raise MetricsError(f"--metrics-port {value!r}: give a port (e.g. 9464) or ADDRESS:PORT "
                           f"(e.g. 0.0.0.0:9464 to be scraped from other hosts; an IPv6 address in brackets, "
                           f"[::1]:9464); a port is 0 to 65535")
    return address or DEFAULT_ADDRESS, number


def _an_address(address: str) -> bool:
    """Whether ``address`` (what came before the port) can be one: empty (the default), a host name or IPv4
    address (no ':' or brackets), or an IPv6 address."""
    import ipaddress

    if ":" not in address:
        return not any(mark in address for mark in "[]")
    try:
        return isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address)
    except ValueError:
        return False


class MetricsExporter:
    """Exports a database's numbers in the Prometheus text format on ``http://ADDRESS:PORT/metrics``.

    ``start()`` opens the endpoint (a daemon thread), ``close()`` shuts it.  The numbers are read at
    scrape time (see :mod:`activedb.metrics._collector`); long-running commands add what they run with
    ``watch_ingestion`` and ``watch_consumer``.  Thread-safe: ``_mutex`` protects ``_server``."""

    def __init__(self, database: ScrapedDatabase) -> None:
        from prometheus_client import CollectorRegistry

        self.collector = ActivedbCollector(database)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._mutex = threading.Lock()
        self._server: Any = None
        self.address: str | None = None
        self.port: int | None = None

    def watch_ingestion(self, source: IngestionSource) -> None:
        """Export an ingestion's counters and batch latency (the Spark bridge passes its sink); a second one of a
        query name already watched is refused with :class:`MetricsError`."""
        self.collector.watch_ingestion(source)

    def watch_consumer(self, consumer: ConsumerSource) -> None:
        """Export a capture consumer's counters; a second one of a name already watched is refused with
        :class:`MetricsError`."""
        self.collector.watch_consumer(consumer)

    def start(self, listen: str | int) -> str:
        """Serve ``/metrics`` on ``listen`` (see :func:`parse_listen`); returns the URL to scrape."""
        from prometheus_client import start_http_server

        address, port = parse_listen(listen)
        with self._mutex:
            if self._server is not None:
                raise MetricsError(f"the metrics endpoint already runs at {self.url}")
            try:
                self._server, _ = start_http_server(port, addr=address, registry=self.registry)
            except OSError as error:
                raise MetricsError(f"cannot serve metrics on {address}:{port}: {error.strerror or error} "
                                   f"(choose another --metrics-port, or 0 for any free port)") from None
            self.address, self.port = address, self._server.server_port
        return self.url

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if self.address and ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def scrape(self) -> str:
        """The text a scrape returns now (without HTTP)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    def close(self) -> None:
        with self._mutex:
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> "MetricsExporter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
