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


@pytest.mark.parametrize("as_given", [str, lambda path: path], ids=["text", "Path"])
def test_py_files_given_as_one_path_is_refused_saying_to_give_a_list(tmp_path, as_given):
    """``py_files="deps.zip"`` was walked character by character ('no such file: /, t, m, p, …', naming none of the
    files given) and a ``Path`` failed with a bare TypeError ('PosixPath' object is not iterable)."""
    pytest.importorskip("pyspark")
    from spark_bridge.session import get_spark

    helpers = tmp_path / "helpers.zip"
    helpers.write_bytes(b"")
    with pytest.raises(ActivedbError, match=r"py_files takes a list of paths, not one; did you mean "
                                            r"py_files=\[.*helpers\.zip"):
        get_spark("one-py-file", py_files=as_given(helpers))
