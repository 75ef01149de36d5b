"""Helpers for the tests that scrape a long-running command: the process (started with ``--metrics-port
127.0.0.1:0`` in its own session, its output in a file) and the scrape, parsed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from activedb.testing import wait_until


class ServingProcess:
    """A command serving metrics; a context manager that kills it if it is still running at the end."""

    def __init__(self, command: list[str], output: Path, env: dict[str, str]) -> None:
        self.output = output
        with open(output, "wb") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1", **env})

    def seen(self) -> str:
        return f"exit code {self.process.poll()}; output:\n{self.output.read_text()[-3000:]}"

    def wait_for(self, predicate, what: str, timeout: float):
        """``predicate()``'s first truthy value; fails at once if the process exited."""
        def check():
            assert self.process.poll() is None, self.seen()
            return predicate()
        return wait_until(check, timeout, what, self.seen)

    def endpoint(self, timeout: float) -> str:
        """The URL the command printed (``metrics: http://…/metrics``)."""
        match = self.wait_for(lambda: re.search(r"metrics: (http://\S+/metrics)", self.output.read_text()),
                              "the metrics line", timeout)
        return match.group(1)

    def interrupt(self, timeout: float) -> None:
        """Ctrl-C as a terminal sends it (SIGINT to the process group); the command must stop cleanly."""
        os.killpg(self.process.pid, signal.SIGINT)
        assert self.process.wait(timeout=timeout) == 0, self.seen()
        assert "Traceback" not in self.output.read_text()

    def __enter__(self) -> "ServingProcess":
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def scrape(url: str) -> dict[str, list]:
    """``{family name: [samples]}`` of one scrape."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def total(families: dict[str, list], name: str, **labels: str) -> float:
    """The sum of family ``name``'s samples (a counter's ``_total``, a gauge's value) with ``labels``."""
    return sum(sample.value for sample in families[name]
               if sample.name in (name, f"{name}_total")
               and all(sample.labels.get(label) == value for label, value in labels.items()))
