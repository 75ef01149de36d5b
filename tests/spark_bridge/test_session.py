"""``spark_bridge.session.get_spark``: what it refuses before Java or Spark is started."""

from __future__ import annotations

import pytest

from activedb import ActivedbError


def test_a_py_file_that_does_not_exist_is_an_activedb_error_naming_it(tmp_path):
    """A missing ``py_files`` entry was a bare FileNotFoundError, outside the errors a caller of activedb catches."""
    pytest.importorskip("pyspark")
    from spark_bridge.session import get_spark

    missing = tmp_path / "helpers.zip"
    with pytest.raises(ActivedbError, match=r"py_files.*no such file: .*helpers\.zip"):
        get_spark("missing-py-file", py_files=[missing])
