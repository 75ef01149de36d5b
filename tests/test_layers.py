"""The layers drawn in the README's layout section hold in the code: every import (at module level, inside
functions, or for type checking only) goes to the same layer or one below, and no circle spans two parts
(subpackages, or top-level modules of ``activedb``)."""

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("activedb", "spark_bridge", "lockmgr", "coupling", "benchmarks")


def layers() -> dict[str, int]:
    """Part -> layer, from the README's drawing (``9 benchmarks``, ``7 activedb.cli activedb.examples ...``, top first)."""
    text = (ROOT / "README.md").read_text()
    drawing = re.search(r"### Layers\n.*?```text\n(.*?)```", text, re.S).group(1)
    found = {}
    for line in drawing.splitlines():
        number, _, parts = line.partition(" ")
        found.update({part: int(number) for part in parts.split()})
    return found


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT).with_suffix("")
            if "migrations" in relative.parts:
                continue
            name = ".".join(relative.parts)
            found[name.removesuffix(".__init__")] = path
    return found


def part(module: str) -> str:
    """``activedb.txn._tree`` -> ``activedb.txn``; a top-level module of activedb stands alone; the other
    packages are one part each."""
    pieces = module.split(".")
    if pieces[0] != "activedb" or len(pieces) == 1:
        return pieces[0]
    return ".".join(pieces[:2])


def imports(name: str, path: Path) -> Iterator[tuple[list[str], str | None]]:
    """Per import statement of module ``name`` (at ``path``): the dotted names it imports (``from a import b``:
    ``a.b``), and for a ``from`` import its module ``a`` (None for a plain import); relative ones resolved."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield [alias.name for alias in node.names], None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join(here + ([node.module] if node.module else []))
            yield [f"{base}.{alias.name}" for alias in node.names], base


def import_graph() -> nx.DiGraph:
    known = modules()
    graph = nx.DiGraph()
    for name, path in known.items():
        for names, base in imports(name, path):
            targets = names + ([base] if base is not None else [])
            for target in targets:       # the first that names a module: ``from a import b`` may import a.b
                if target.startswith("activedb._migrations"):
                    break                    # the repository's migrations/ folder, installed under that name
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target:
                    if part(target) != part(name):
                        graph.add_edge(part(name), part(target), via=f"{name} -> {target}")
                    break
    return graph


def package_of(module: str) -> str:
    return module.split(".")[0]


def test_no_package_imports_a_private_name_of_another():
    """Packages meet at their public names: no import (type-checking ones included) from one of activedb,
    spark_bridge, lockmgr, coupling and benchmarks reaches a module or name of another whose path has a part
    starting with ``_`` (dunders aside)."""
    private = []
    for name, path in modules().items():
        for targets, _ in imports(name, path):
            for target in targets:
                if package_of(target) == package_of(name) or package_of(target) not in PACKAGES:
                    continue
                if any(piece.startswith("_") and not piece.startswith("__") for piece in target.split(".")):
                    private.append(f"{name} -> {target}")
    assert not private, "imports of another package's private names:\n" + "\n".join(sorted(private))


# Imports of a subpackage's private module or name that another part of activedb may still make, each with its
# reason ("importer -> target").  Empty: every subpackage offers what the others use among its public names.
SUBPACKAGE_PRIVATE_ALLOWED: frozenset[str] = frozenset()


def is_private(piece: str) -> bool:
    return piece.startswith("_") and not piece.startswith("__")


def test_no_subpackage_imports_a_private_name_of_another():
    """Subpackages of activedb meet at their public names too: no import (type-checking ones included) from a
    module of activedb reaches, in a subpackage other than its own part (``activedb.store`` for
    ``activedb.atomic._lineage``), a module or name below it whose path has a part starting with ``_``
    (``activedb.store._writeset.Key``; ``activedb.store.Key`` is the public one).  The top-level modules of
    activedb (``activedb._handle``, ``activedb._closedset``) are the package's own and stay out of it."""
    known = modules()
    subpackages = {part(name) for name, path in known.items()
                   if name.startswith("activedb.") and path.name == "__init__.py" and name.count(".") == 1}
    private = []
    for name, path in known.items():
        if package_of(name) != "activedb":
            continue
        for targets, _ in imports(name, path):
            for target in targets:
                owner = part(target)
                if package_of(target) != "activedb" or owner == part(name) or owner not in subpackages:
                    continue
                below = target.split(".")[2:]
                if any(is_private(piece) for piece in below) and f"{name} -> {target}" not in SUBPACKAGE_PRIVATE_ALLOWED:
                    private.append(f"{name} -> {target}")
    assert not private, "imports of another subpackage's private names:\n" + "\n".join(sorted(private))


def test_every_part_has_a_layer_in_the_readme():
    missing = {part(module) for module in modules()} - set(layers())
    assert not missing, f"parts missing from the README's layer drawing: {sorted(missing)}"


def test_no_import_runs_up_a_layer():
    rank = layers()
    upward = [data["via"] for a, b, data in import_graph().edges(data=True) if rank[b] > rank[a]]
    assert not upward, "imports that run back up:\n" + "\n".join(sorted(upward))


def test_no_circle_spans_two_parts():
    graph = import_graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    edges = [data["via"] for a, b, data in graph.edges(data=True) if any(a in c and b in c for c in circles)]
    assert not circles, f"circles {circles} through:\n" + "\n".join(sorted(edges))


def test_the_ingestion_core_imports_nothing_of_spark_and_pyarrow_only_when_it_meets_an_arrow_table():
    """``activedb.ingest`` is the core every connector uses: no import of pyspark anywhere in it, pyarrow only
    inside functions (an Arrow batch), and importing it loads neither."""
    import subprocess
    import sys

    for path in (ROOT / "activedb" / "ingest").rglob("*.py"):
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith(("pyspark", "spark_bridge")), f"{path.name} imports {name}"
                if name.startswith("pyarrow"):
                    assert id(node) not in top_level, f"{path.name} imports {name} at module level"
    done = subprocess.run([sys.executable, "-c", "import sys, activedb.ingest; "
                           "print(sorted(m for m in ('pyspark', 'pyarrow', 'spark_bridge') if m in sys.modules))"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
