"""The package's layers: modules import one another in one direction, and only the page imports gradio.

Imports are read from the source with `ast`, those inside functions included, so a cycle shows
here before it shows as an ImportError at some first call. Imports under `if TYPE_CHECKING:`
never run and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rag_demo"

UPPER_LAYERS = ("rag_demo.engine", "rag_demo.serving", "rag_demo.ui", "rag_demo.cli")

# The folders and top-level modules, lowest first: each may import its own rank and those below.
LAYERS = (
    ("config", "errors", "options", "results", "text", "progress", "precision", "packaged", "marginalize", "memory", "questions",
     "question_kinds", "sureness"),
    ("retrieval",),
    ("generation",),  # reads retrieval's Passage
    ("training",),
    ("offline",),  # builds the default: KBs, the converted generator, the tuned parts
    ("engine", "evaluate", "plots"),
    ("serving",),
    ("cli", "terminal", "ui"),
    ("__main__",),
)


def module_name(path: Path) -> str:
    """rag_demo/offline/cache.py -> rag_demo.offline.cache; a package's __init__.py -> the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(path: Path) -> tuple[set[str], set[str]]:
    """(every dotted name the module imports, or imports from, that runs; the top-level packages of all its imports).

    `from .x import y` yields both "pkg.x" and "pkg.x.y", since y may be a submodule.
    """
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                 for statement in block.body for node in ast.walk(statement)}
    names, top_level = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found = {module} | {f"{module}.{alias.name}" for alias in node.names}
        else:
            continue
        top_level |= {n.split(".")[0] for n in found}
        if id(node) not in type_only:
            names |= found
    return names, top_level


def import_graph() -> dict[str, set[str]]:
    """{module: the package modules it imports}; a module also imports its parent packages (their __init__ runs first).

    A package naming its own submodules (`rag_demo.ui` loads its page on first use) is not an edge:
    the submodule already depends on the package, and the package holds it rather than sits above it."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        own = {other for other in paths if other.startswith(name + ".")} if path.name == "__init__.py" else set()
        graph[name] = ((imported_names(path)[0] | parents) & paths.keys()) - {name} - own
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None.

    >>> find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    True
    >>> find_cycle({"a": {"b"}, "b": {"a"}})
    ['a', 'b', 'a']
    """
    state: dict[str, str] = {}  # "open" while on the current path, "done" once all below it is checked

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [node])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [])
            if cycle:
                return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_modules_import_one_another_in_one_direction():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_offline_build_imports_no_upper_layer():
    graph = import_graph()
    for name in [n for n in graph if n.startswith("rag_demo.offline")]:
        upper = sorted(n for n in reachable(graph, name) if n.startswith(UPPER_LAYERS))
        assert not upper, f"{name} reaches {upper}"


def layer_of(module: str) -> int:
    """rag_demo.retrieval.index -> the rank of "retrieval"; the package itself ranks lowest."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0
    return next(rank for rank, names in enumerate(LAYERS) if parts[1] in names)


def test_every_module_has_a_layer():
    unplaced = []
    for name in import_graph():
        try:
            layer_of(name)
        except StopIteration:
            unplaced.append(name)
    assert not unplaced, f"add these to LAYERS: {unplaced}"


def test_folders_import_only_their_own_layer_and_those_below():
    graph = import_graph()
    upward = sorted(f"{a} -> {b}" for a, imports in graph.items() for b in imports if layer_of(b) > layer_of(a))
    assert not upward, "imports that go up a layer: " + "; ".join(upward)


def test_only_the_page_imports_gradio():
    importers = {module_name(path) for path in PACKAGE.rglob("*.py") if "gradio" in imported_names(path)[1]}
    assert {name for name in importers if not name.startswith("rag_demo.ui")} == set()
    assert "rag_demo.ui" in importers or any(name.startswith("rag_demo.ui.") for name in importers)


def test_layer_helpers_docstring_examples():
    import doctest
    import sys

    assert doctest.testmod(sys.modules[__name__]).failed == 0
