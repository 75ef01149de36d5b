"""``.ci/run`` runs what the README says: its test command verbatim, then the ``server`` part of the suite
against the distribution's PostgreSQL (and the list of that part names files that exist), then builds the
documentation site with warnings as errors, then type-checks the four packages with ``mypy --strict``."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import SERVER_SUITE

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command_then_the_server_part_the_docs_and_the_type_check():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_command = next(block for block in blocks if "pytest" in block)
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert commands[0] == test_command
    assert commands[1] == ".ci/with-distribution-postgres .venv/bin/python -m pytest -m server -n 0"
    assert commands[1] in " ".join(readme.split())
    assert commands[2] == ".venv/bin/pip install -q -e '.[docs]' && NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict"
    assert "strict: true" in (ROOT / "mkdocs.yml").read_text()
    assert commands[3] == ".venv/bin/pip install -q -e '.[typecheck]' && .venv/bin/mypy --strict"


def test_the_server_part_names_existing_tests():
    for entry in SERVER_SUITE:
        assert (ROOT / "tests" / entry).exists(), entry
