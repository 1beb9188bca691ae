"""The house's import rules this layout keeps, read from the code's own imports (every import
statement, those under ``if TYPE_CHECKING:`` and inside functions included):

- the bottom floor (states, points, retry) imports nothing of dbcluster;
- no module of the engine imports the test package (``dbcluster.testing``);
- no two modules of the package import each other in a circle (farm-studio's "0 circles"), and
  no module below ``cluster/node.py`` imports it.

The layers themselves (cli above cluster above batch above dialects above schema, states and
points) are import-linter's contract in pyproject.toml, which ``.ci/run`` checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dbcluster

ROOT = Path(dbcluster.__file__).parent
BOTTOM = ("dbcluster.states", "dbcluster.points", "dbcluster.retry")
#: Modules outside the engine: the test package itself and the benchmarks, which may use it.
NOT_ENGINE = ("dbcluster.testing", "dbcluster.bench")


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the dbcluster modules it imports (``from a import b`` is ``a.b`` when that is
    a module, else ``a``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in modules else node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _circles(graph: dict[str, set[str]], within: tuple[str, ...]) -> list[list[str]]:
    """Strongly connected groups of more than one module among those under ``within``."""
    nodes = [n for n in graph if n.startswith(within)]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(n: str) -> None:
        index[n] = low[n] = len(index)
        stack.append(n)
        on_stack.add(n)
        for m in graph[n]:
            if not m.startswith(within):
                continue
            if m not in index:
                visit(m)
                low[n] = min(low[n], low[m])
            elif m in on_stack:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            group = []
            while True:
                m = stack.pop()
                on_stack.discard(m)
                group.append(m)
                if m == n:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for n in nodes:
        if n not in index:
            visit(n)
    return found


GRAPH = _imports(_modules())


def test_the_bottom_floor_imports_nothing_of_dbcluster() -> None:
    assert {name: sorted(GRAPH[name]) for name in BOTTOM} == {name: [] for name in BOTTOM}


def test_no_module_of_the_engine_imports_the_test_package() -> None:
    offenders = {
        name: sorted(t for t in targets if t.startswith("dbcluster.testing"))
        for name, targets in GRAPH.items()
        if not name.startswith(NOT_ENGINE)
    }
    assert {n: t for n, t in offenders.items() if t} == {}


def test_no_import_circle_anywhere_in_the_package() -> None:
    assert _circles(GRAPH, ("dbcluster",)) == []


def test_only_the_wiring_imports_the_node() -> None:
    importers = sorted(n for n, targets in GRAPH.items() if "dbcluster.cluster.node" in targets)
    # The cluster builds a node, the package hands it on, and tools and test seams above the
    # engine take one; no service of the engine does.
    assert [n for n in importers if n.startswith("dbcluster.cluster")] == [
        "dbcluster.cluster",
        "dbcluster.cluster.app",
    ]
