"""MkDocs hooks of the documentation site (``mkdocs.yml`` names this file).

* The design notes are the packages' own ``README.md`` files, added to the site where they are in the
  repository (``activedb/txn/README.md`` is the page ``activedb/txn/``), with the pictures in each package's
  ``docs/`` folder: one copy of each note, its relative links unchanged.
* The API reference is generated from each public package's ``__all__``: one page per package, one
  mkdocstrings entry per public name at the module that defines it (the packages export their names lazily,
  which a static reader cannot follow). A name several pages export is documented once, on the page of the
  package that defines it (or the first that exports it), and linked from the others.
* A page may include a section of a design note instead of copying it: the line
  ``<!-- include: spark_bridge/README.md "Running on a cluster" -->`` becomes that section's text (its
  heading left out, its deeper headings raised to the page's levels, its relative links made relative to the
  page).
* Docstrings are written with Sphinx's roles (``:class:`Transaction```); the rendered pages drop the role and
  keep the code.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import typing
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

# The public API, in the order of the reference's pages.
REFERENCE = ["activedb", "activedb.lowlevel", "activedb.ingest", "activedb.streams", "activedb.batch",
             "activedb.composite", "activedb.testing", "spark_bridge", "lockmgr", "coupling"]

_TYPING_NAMES = set(dir(typing))
_SKIPPED_PARTS = {".venv", "build", "node_modules", "docs", "tests"}


def design_notes() -> list[Path]:
    """Every package's ``README.md`` (the top-level README is the repository's front page, whose content the
    site's home page and tutorial carry), and the benchmarks' results."""
    notes = [path for path in ROOT.glob("*/**/README.md")
             if not _SKIPPED_PARTS & set(path.relative_to(ROOT).parts[:-1]) and ".egg-info" not in str(path)]
    results = ROOT / "benchmarks" / "RESULTS.md"
    return sorted(notes + ([results] if results.exists() else []))


def on_files(files: Files, config) -> Files:
    notes = design_notes()
    pictures = {picture for note in notes for picture in (note.parent / "docs").glob("*.png")}
    for path in notes + sorted(pictures):
        _add(files, path, config)
    exported = {page: _public_names(page) for page in REFERENCE}
    owners = _owners(exported)
    for page in REFERENCE:
        files.append(File.generated(config, f"reference/{page}.md", content=_reference_page(page, exported[page],
                                                                                          owners)))
    return files


def _add(files: Files, path: Path, config) -> None:
    if files.get_file_from_path(str(path.relative_to(ROOT))) is not None:
        raise RuntimeError(f"{path.relative_to(ROOT)} is in docs/ and in the repository, or added twice: keep one copy")
    files.append(File(str(path.relative_to(ROOT)), str(ROOT), config["site_dir"], config["use_directory_urls"]))


_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|const):(?=<code>)")


_INCLUDE = re.compile(r'^<!-- include: (\S+) "([^"]+)" -->$', re.M)
_HEADING = re.compile(r"^(#+) ", re.M)
_LINK = re.compile(r"\]\((?!https?:|#|/)([^)]+)\)")


def on_page_markdown(markdown: str, page, config, files) -> str:
    def section(match: re.Match) -> str:
        note, title = ROOT / match.group(1), match.group(2)
        text = note.read_text()
        start = re.search(rf"^(#+) {re.escape(title)}.*$", text, re.M)
        if start is None:
            raise LookupError(f"{page.file.src_uri} includes {match.group(1)}, section {title!r}, which has no such "
                              f"heading")
        level = len(start.group(1))
        end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, start.end())
        body = text[start.end():end.start() if end else len(text)]
        body = _HEADING.sub(lambda heading: "#" * (len(heading.group(1)) - level + 1) + " ", body)
        here = Path(page.file.src_uri).parent
        return _LINK.sub(lambda link: "](" + os.path.relpath(Path(match.group(1)).parent / link.group(1), here) + ")",
                         body).strip() + "\n"

    return _INCLUDE.sub(section, markdown)


def on_page_content(html: str, page, config, files) -> str:
    return _ROLE.sub("", html)


# -- the API reference ---------------------------------------------------------------------------------------

def _public_names(package: str) -> dict[str, str]:
    """``{public name: the identifier mkdocstrings renders it from}`` for ``package``'s ``__all__``."""
    module = importlib.import_module(package)
    names = {}
    for name in module.__all__:
        if name in _TYPING_NAMES:
            continue                                # a `from typing import ...` an `__all__` swept up
        value = getattr(module, name)
        if inspect.ismodule(value):
            names[name] = value.__name__
        elif inspect.isclass(value) or inspect.isfunction(value):
            names[name] = f"{value.__module__}.{value.__qualname__}"
        else:
            names[name] = f"{_defining_module(package, name)}.{name}"
    return names


def _defining_module(package: str, name: str) -> str:
    """The module of ``package`` (or a package it re-exports from) whose source binds ``name`` at its top
    level: a type alias or a constant has no ``__module__``."""
    binding = re.compile(rf"^{re.escape(name)}\s*[:=]", re.M)
    top = package.split(".")[0]
    candidates = sorted(loaded for loaded in list(sys.modules)
                        if loaded == top or loaded.startswith(top + ".") or loaded.startswith("activedb."))
    for candidate in sorted(candidates, key=lambda loaded: (not loaded.startswith(package), loaded)):
        source = getattr(sys.modules[candidate], "__file__", None)
        if source and source.endswith(".py") and binding.search(Path(source).read_text()):
            return candidate
    raise LookupError(f"{package}.{name}: no module binds it at its top level; the reference cannot show it")


def _owners(exported: dict[str, dict[str, str]]) -> dict[str, str]:
    """``{identifier: the page that documents it}``: among the pages that export it, the one whose package
    defines it (the longest prefix of its module), else the first."""
    pages: dict[str, list[str]] = {}
    for page, names in exported.items():
        for identifier in names.values():
            pages.setdefault(identifier, []).append(page)
    owners = {}
    for identifier, candidates in pages.items():
        defining = [page for page in candidates if identifier.startswith(page + ".")]
        owners[identifier] = max(defining, key=len) if defining else candidates[0]
    return owners


def _reference_page(page: str, names: dict[str, str], owners: dict[str, str]) -> str:
    lines = [f"# `{page}`", "", f"::: {page}", "    options:", "      members: false", "      show_root_heading: false",
             ""]
    modules = {name: identifier for name, identifier in names.items() if identifier in sys.modules}
    elsewhere = []
    for name, identifier in sorted(names.items(), key=lambda item: item[0].lower()):
        if name in modules or identifier.rsplit(".", 1)[0] in modules.values():
            continue                                # documented with its module, below
        if owners[identifier] != page:
            elsewhere.append(f"* [`{page}.{name}`][{identifier}] — documented with `{owners[identifier]}`")
            continue
        lines += [f"::: {identifier}", "    options:", f"      heading: {name}", ""]
    for name, identifier in modules.items():
        lines += [f"## `{page}.{name}`", "", f"::: {identifier}", "    options:", "      show_root_heading: false",
                  "      heading_level: 3", ""]
    if elsewhere:
        lines += ["## Also exported here", "", *elsewhere, ""]
    return "\n".join(lines)
