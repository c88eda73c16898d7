"""The layering rules of GUIDE §1, checked on the import graph of the installed package (lazy imports included).

- `cairn.persistence` imports nothing from `cairn.app`, `cairn.widgets` or Textual;
- `cairn.widgets` imports nothing from `cairn.app`;
- `cairn.app.agent` (the loop and its checkpoint policy) imports no face: cli, tui, headless, api, compose, acp, screens;
- no two project modules import each other, directly or round a loop;
- no module is longer than MODULE_LINE_CAP lines: a room that grows past it does several jobs (issue 41 aims at ~500).

The graph is read from the source with `ast`, so an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cairn
import cairn.app
import cairn.persistence
import cairn.widgets

FACES = ("cairn.app.cli", "cairn.app.tui", "cairn.app.headless", "cairn.app.api", "cairn.app.compose",
         "cairn.app.acp", "cairn.app.screens")


def modules_under(package_dir: Path, package: str) -> dict[str, Path]:
    """Every module of the package at `package_dir`, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module → what it imports (anything, by dotted name: `x.y` for `from x import y` when `x.y` is a module)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    targets.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root] & graph.keys())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child] & graph.keys()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(graph: dict[str, set[str]], importer: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} imports {t}" for m, targets in graph.items() if within(m, importer)
                  for t in targets if within(t, forbidden))


def project_modules() -> dict[str, Path]:
    """From where each package really is: an editable install keeps app/, widgets/ and persistence/ beside cairn/."""
    modules: dict[str, Path] = {}
    for package in (cairn, cairn.app, cairn.widgets, cairn.persistence):
        modules.update(modules_under(Path(package.__file__).parent, package.__name__))
    return modules


def project_graph() -> dict[str, set[str]]:
    return import_graph(project_modules())


GRAPH = project_graph()


def test_the_graph_sees_relative_lazy_and_module_imports():
    # Without these edges the rules below would pass on a graph that saw nothing.
    assert "cairn.app.agent.loop" in GRAPH["cairn.app.compose"]  # relative, top level
    assert "cairn.persistence.ids" in GRAPH["cairn.persistence.jsonl"]  # relative, same package
    assert "cairn.app.commands.housekeeping" in GRAPH["cairn.app.cli"]  # relative, inside a function
    assert "cairn.app.quiet_gc" in GRAPH["cairn.app.screens.chat"]  # `from .. import quiet_gc`
    assert "textual.widget" in GRAPH["cairn.widgets.answer_text"]
    assert len(GRAPH) > 80


def test_persistence_imports_nothing_from_app_widgets_or_textual():
    assert violations(GRAPH, ("cairn.persistence",), ("cairn.app", "cairn.widgets", "textual", "rich")) == []


def test_widgets_import_nothing_from_app():
    assert violations(GRAPH, ("cairn.widgets",), ("cairn.app",)) == []


def test_the_agent_imports_no_face():
    assert violations(GRAPH, ("cairn.app.agent",), FACES) == []


def test_no_import_cycle_among_the_projects_modules():
    assert cycles(GRAPH) == []


def test_app_keeps_at_most_ten_modules_beside_its_rooms():
    app = Path(cairn.app.__file__).parent
    own = sorted(p.name for p in app.glob("*.py") if p.name != "__init__.py")
    assert len(own) <= 10, own


MODULE_LINE_CAP = 600


def oversized(modules: dict[str, Path], cap: int = MODULE_LINE_CAP) -> list[str]:
    """The modules longer than `cap` lines, each with its length."""
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules.items()}
    return sorted(f"{name}: {n} lines" for name, n in lengths.items() if n > cap)


def test_no_module_is_longer_than_the_cap():
    assert oversized(project_modules()) == []


def test_the_size_rule_names_a_module_over_the_cap(tmp_path):
    (tmp_path / "small.py").write_text("x = 1\n" * MODULE_LINE_CAP)
    (tmp_path / "big.py").write_text("x = 1\n" * (MODULE_LINE_CAP + 1))
    assert oversized(modules_under(tmp_path, "demo")) == [f"demo.big: {MODULE_LINE_CAP + 1} lines"]


def test_the_checks_catch_a_circle_and_a_layer_broken_in_a_package_made_for_it(tmp_path):
    pkg = tmp_path / "demo"
    (pkg / "persistence").mkdir(parents=True)
    (pkg / "app" / "agent").mkdir(parents=True)
    for init in (pkg, pkg / "persistence", pkg / "app", pkg / "app" / "agent"):
        (init / "__init__.py").write_text("")
    (pkg / "persistence" / "store.py").write_text("def f():\n    from .backend import x\n")
    (pkg / "persistence" / "backend.py").write_text("from . import store\nfrom ..app.widget import y\n")
    (pkg / "app" / "agent" / "loop.py").write_text("from ..cli import main\n")
    (pkg / "app" / "cli.py").write_text("")
    graph = import_graph(modules_under(pkg, "demo"))
    assert cycles(graph) == [["demo.persistence.backend", "demo.persistence.store"]]
    assert violations(graph, ("demo.persistence",), ("demo.app",)) == ["demo.persistence.backend imports demo.app.widget"]
    assert violations(graph, ("demo.app.agent",), ("demo.app.cli",)) == ["demo.app.agent.loop imports demo.app.cli"]
