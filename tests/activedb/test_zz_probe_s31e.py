import pytest
from tests.activedb.test_pytest_plugin import project  # noqa

CASES = r'''
import pytest
import activedb
from activedb.testing import Interleavings, check_history

@pytest.mark.activedb(bogus=1)
def test_bogus(activedb_db):
    pass

@pytest.mark.activedb("migrations")
def test_positional(activedb_db):
    pass

@pytest.mark.activedb(record_history="yes")
def test_history_text(activedb_db):
    pass

def test_runner_given_url(activedb_url):
    Interleavings(activedb_url, [print])

def test_runner_given_none():
    Interleavings(None, [print])

@pytest.mark.activedb(record_history=True)
def test_check_history_given_db(activedb_db):
    check_history(activedb_db)

@pytest.mark.activedb(record_history=True)
def test_check_history_given_none(activedb_db):
    check_history(None)
'''

def test_probe(project, activedb_server):
    project.makepyfile(test_cases=CASES)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--activedb-url={activedb_server.url('postgres')}")
    print(result.stdout.str()[-12000:])
    print(result.stderr.str()[-3000:])
