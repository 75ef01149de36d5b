"""The suite's own harness (``tests/conftest.py``): what it decides from the environment a test process starts in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _DRIVER_OPTIONS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("inherited, own", [(_DRIVER_OPTIONS, False), ("-Xmx2g", True), ("", True), (None, False)])
def test_only_a_spark_submit_opts_of_the_users_own_keeps_the_class_data_archive_out(inherited, own):
    """pytest-xdist's workers inherit the environment of the process that started them, which loaded the conftest
    and set ``SPARK_SUBMIT_OPTS`` to the suite's value: taken for a value of the user's, it kept every worker of the
    suite's runs (``-n auto``) from adding the Spark drivers' class-data archive."""
    environment = {key: value for key, value in os.environ.items() if key != "SPARK_SUBMIT_OPTS"}
    if inherited is not None:
        environment["SPARK_SUBMIT_OPTS"] = inherited
    done = subprocess.run([sys.executable, "-c", "import tests.conftest as c; print(c._OWN_SUBMIT_OPTS)"],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (0, f"{own}\n"), done.stderr[-3000:]
