"""The README's short example runs exactly as printed — the text itself, saved as a file in a fresh
directory and run by a new interpreter — against the test database (``ACTIVEDB_DATABASE_URL``, which
``activedb.connect()`` honours as the README says)."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def example() -> str:
    text = README.read_text()
    section = text[text.index("## A short example"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_as_printed(code: str, database_url: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``code`` saved as a file in ``tmp_path`` and run by a new interpreter against ``database_url`` (with an
    ``ACTIVEDB_HOME`` of its own, which the code must not need); it must exit 0."""
    script = tmp_path / "example.py"
    script.write_text(code)
    environment = {**os.environ, "ACTIVEDB_DATABASE_URL": database_url, "ACTIVEDB_HOME": str(tmp_path / "home"),
                   "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_readme_example_runs_as_printed(database_url, tmp_path):
    done = run_as_printed(example(), database_url, tmp_path)
    assert done.stdout == "None\n"                      # w2 does not exist
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            assert connection.execute(sa.text("SELECT status FROM worker_status WHERE worker='w1'")).scalar() == \
                "violation"
            assert connection.execute(sa.text("SELECT count(*) FROM alerts WHERE worker='w1'")).scalar() == 1
            assert connection.execute(sa.text("SELECT count(*) FROM notifications WHERE worker='w1'")).scalar() == 1
            fired = dict(connection.execute(sa.text(
                "SELECT f.key, sum(f.value::int) FROM activedb_transaction_log, "
                "jsonb_each_text(info -> 'rule_firings') AS f GROUP BY f.key")).all())
    finally:
        engine.dispose()
    assert fired == {"alert": 1, "notify": 1}
    assert not (tmp_path / "home").exists(), "the example must not start an embedded server here"


def test_the_commands_the_readme_documents_exist():
    from click.testing import CliRunner

    from activedb.cli import main

    pages = [README, *sorted((ROOT / "docs").glob("**/*.md"))]
    def mentioned(text: str) -> list[str]:              # in `code`, and the commands of ```bash blocks
        shell = "\n".join(re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M))
        return re.findall(r"`activedb ([a-z-]+)", text) + re.findall(r"^activedb ([a-z-]+)", shell, re.M)

    commands = {command: page for page in reversed(pages) for command in mentioned(page.read_text())}
    for command, page in commands.items():
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0, f"{page.relative_to(ROOT)} mentions `activedb {command}`: {result.output}"


FENCE = re.compile(r"^```python\n(.*?)^```\n", re.S | re.M)
FILE_FENCE = re.compile(r'^```python title="([^"]+)"\n(.*?)^```\n', re.S | re.M)   # a file the text asks to save
FRAGMENT = "# fragment:"
SAID = re.compile(r"\s*It prints(?: `([^`]*)`| nothing|:\n+```text\n(.*?)```)", re.S)


@dataclasses.dataclass(frozen=True)
class Block:
    """One ``python`` code block of a README: a complete example (run as printed, its output compared with
    what the text after it says it prints) or a fragment (first line ``# fragment: what it continues``)."""

    readme: Path
    line: int
    code: str
    expected: str | None            # what the README says it prints; None: it does not say
    files: tuple[tuple[str, str], ...] = ()     # (path, text) of the files saved above it (a ``title="path"`` block)

    @property
    def fragment(self) -> bool:
        return self.code.startswith(FRAGMENT)

    @property
    def spark(self) -> bool:
        return "spark_bridge" in self.code

    def __str__(self) -> str:
        return f"{self.readme.relative_to(ROOT)}:{self.line}"


def readmes() -> list[Path]:
    """Every README and every page of the documentation site (``docs/``: the tutorial, the how-to guides):
    their ``python`` blocks are examples alike."""
    found = [path for path in [*ROOT.glob("**/README.md"), *ROOT.glob("docs/**/*.md")]
             if not {".venv", "node_modules", "build"} & set(path.relative_to(ROOT).parts)
             and ".egg-info" not in str(path)]
    return sorted(found)


def blocks(readme: Path) -> list[Block]:
    text = readme.read_text()
    found = []
    for match in FENCE.finditer(text):
        said = SAID.match(text, match.end())
        expected = None
        if said is not None:
            expected = said.group(1) + "\n" if said.group(1) is not None else (said.group(2) or "")
        files = _saved_before(readme, text, match.start())
        found.append(Block(readme, text.count("\n", 0, match.start()) + 1, match.group(1), expected, files))
    return found


TUTORIAL = ROOT / "docs" / "tutorial.md"


def _saved_before(page: Path, text: str, end: int) -> tuple[tuple[str, str], ...]:
    """The files a block's page asked to save above it (``python title="path"`` blocks); a page of the site
    other than the tutorial starts from the tutorial's directory, so the tutorial's files come first."""
    tutorial = ()
    if page.parent.parent == TUTORIAL.parent and TUTORIAL.exists():          # docs/howto/*.md and the like
        tutorial = _saved_before(TUTORIAL, TUTORIAL.read_text(), len(TUTORIAL.read_text()))
    return tutorial + tuple((saved.group(1), saved.group(2)) for saved in FILE_FENCE.finditer(text, 0, end))


ALL_BLOCKS = [block for readme in readmes() for block in blocks(readme)]
#: The complete examples each run alone on a fresh database — but the tutorial's programs, which run once each, in
#: the page's order, as a reader runs them (``test_the_tutorials_programs_run_in_order…``): run alone as well, they
#: cost the suite the same programs' time again and check nothing more.
COMPLETE = [pytest.param(block, id=str(block), marks=[pytest.mark.spark] if block.spark else [])
            for block in ALL_BLOCKS if not block.fragment and block.readme != TUTORIAL]


def test_every_readme_block_is_a_complete_example_or_a_marked_fragment():
    assert len(ALL_BLOCKS) >= 15 and len(COMPLETE) >= 8, [str(block) for block in ALL_BLOCKS]
    tutorial = [block for block in ALL_BLOCKS if block.readme == TUTORIAL and not block.fragment]
    assert tutorial and not any(param.values[0] in tutorial for param in COMPLETE), \
        "the tutorial's programs run in order, once (test_the_tutorials_programs_run_in_order…), not also alone"
    for block in ALL_BLOCKS:
        if block.fragment:
            assert len(block.code.splitlines()[0]) > len(FRAGMENT) + 10, f"{block}: say what the fragment continues"
            earlier = [other for other in ALL_BLOCKS if other.readme == block.readme and other.line < block.line]
            assert any(not other.fragment for other in earlier) or re.search(r"README|\.md\b", block.code.splitlines()[0]), \
                f"{block}: a fragment continues a complete example above it, or names the README or page that has it"
        else:
            assert block.expected is not None, \
                f"{block}: a complete example is followed by 'It prints `…`', 'It prints nothing' or 'It prints:' " \
                f"and a text block (or its first line is '{FRAGMENT} …')"


#: A Markdown link or picture, ``[text](target)`` or ``![text](target "title")``: the target.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_every_link_of_the_readme_leads_to_a_file_of_the_repository():
    """The top-level README is read where it lies (a clone, the repository's web page) and is no page of the site, so
    a relative link or picture in it must name a file that is there.  The site's pages and the design notes it carries
    (``docs/hooks.py``) have their links checked by its build (``mkdocs build --strict``).  Code, fenced or inline, is
    not a link."""
    text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", README.read_text(), flags=re.S))
    broken = [target for target in LINK.findall(text)
              if (path := target.partition("#")[0]) and not re.match(r"[a-z][a-z0-9+.-]*:", path)
              and not (ROOT / path).exists()]
    assert not broken, "README.md links to nothing:\n" + "\n".join(broken)
    assert "docs/explain.png" in LINK.findall(README.read_text())


@pytest.mark.parametrize("block", COMPLETE)
def test_a_complete_readme_example_runs_in_a_fresh_directory_and_prints_what_the_readme_says(
        block, make_database_url, tmp_path):
    url = make_database_url(re.sub(r"[^a-z0-9]", "_", str(block).lower())[-30:])
    assert _run_example(block.code, url, tmp_path, timeout=600 if block.spark else 180, files=block.files) == \
        block.expected, str(block)


def _run_example(code: str, database_url: str, tmp_path: Path, *, timeout: float = 180,
                 files: tuple[tuple[str, str], ...] = ()) -> str:
    for path, text in files:                          # what the page asked to save before, by its title
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    script = tmp_path / "example.py"
    script.write_text(code)
    environment = {**os.environ, "ACTIVEDB_DATABASE_URL": database_url, "ACTIVEDB_HOME": str(tmp_path / "home"),
                   "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:      # its message names the script only, never the URL
        raise AssertionError(f"the example did not finish in {timeout} s: {(expired.stderr or b'')[-3000:]!r}") \
            from None
    assert done.returncode == 0, done.stderr[-3000:]
    # Nothing on the console but what the example prints: Spark's and the JVM's lines go to
    # $ACTIVEDB_HOME/logs/spark.log, activedb's threads' to $ACTIVEDB_HOME/logs/activedb.log.
    assert done.stderr == "", done.stderr[-3000:]
    return done.stdout


def test_the_pattern_query_example_prints_the_same_on_a_second_run_on_the_same_database(make_database_url, tmp_path):
    [block] = [block for block in ALL_BLOCKS if block.readme == ROOT / "docs" / "howto" / "pattern-queries.md"
               and "CREATE RULE R1 ON OUTPUT Q1" in block.code]
    url = make_database_url("pattern_twice")
    first = _run_example(block.code, url, tmp_path)
    assert first == _run_example(block.code, url, tmp_path) == block.expected == "warning\n"


@pytest.mark.spark
def test_the_tutorials_programs_run_in_order_in_one_directory_print_what_the_page_says(make_database_url, tmp_path):
    """The tutorial as a reader follows it: `activedb app init`, the files it saves, then first.py, withdrawals.py and
    stream.py one after another in one directory on one database, and stream.py once more, as step 5 asks — each
    printing what the page says.  (The only run of the tutorial's programs: the test above leaves them out.)"""
    text = TUTORIAL.read_text()
    programs = [block for block in ALL_BLOCKS if block.readme == TUTORIAL and not block.fragment]
    assert len(programs) == 3, [str(block) for block in programs]
    environment = {**os.environ, "ACTIVEDB_DATABASE_URL": make_database_url("tutorial_in_order"),
                   "ACTIVEDB_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}

    def run(*argv: str) -> str:
        done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=environment, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    run("-m", "activedb.cli", "app", "init", "bank/migrations")
    for path, saved in programs[-1].files:           # the page's files replace what `app init` wrote
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(saved)
    assert sorted(p.name for p in (tmp_path / "bank" / "migrations" / "versions").glob("*.py")) == \
        ["0001_first_tables.py"]
    for name, block in zip(("first.py", "withdrawals.py", "stream.py"), programs):
        assert f"`{name}`" in text
        (tmp_path / name).write_text(block.code)
        assert run(name) == block.expected, f"{block} ({name}), run after the programs before it"
    again = re.search(r"Run the program again:.*?```text\n(.*?)```", text, re.S)
    assert again is not None, "the page says what stream.py prints when run again"
    assert run("stream.py") == again.group(1), "stream.py run again"
