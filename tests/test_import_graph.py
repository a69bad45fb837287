"""The packages' imports go one way and never round in a circle.

The layering (docs/architecture.md): lab -> dashboard -> collector -> the probe's wire format.
The probe imports none of the others (it ships alone, standard library only); the collector
takes only ``iwprobe.wire`` from the probe; the dashboard never imports the lab.  And no module
reaches itself through others -- counting imports inside functions, which hide a cycle from the
interpreter until the day the order of first use changes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pure code, no root, no services

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "iwprobe": ROOT / "probe" / "src" / "iwprobe",
    "iwscope": ROOT / "collector" / "src" / "iwscope",
    "iwscope_dashboard": ROOT / "dashboard" / "src" / "iwscope_dashboard",
    "iwscope_lab": ROOT / "lab" / "src" / "iwscope_lab",
}
#: What each package may import from the others (a package name: all of it; a module: that one).
ALLOWED = {
    "iwprobe": set(),
    "iwscope": {"iwprobe.wire"},
    "iwscope_dashboard": {"iwprobe.wire", "iwscope"},
    "iwscope_lab": {"iwprobe", "iwscope", "iwscope_dashboard"},
}


def modules_of(packages: Mapping[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages``."""
    found: dict[str, Path] = {}
    for top, path in packages.items():
        for file in sorted(path.rglob("*.py")):
            parts = [top, *file.relative_to(path).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return found


def _imported(module: str, file: Path, known: Mapping[str, Path]) -> Iterator[str]:
    """The known modules ``module`` imports anywhere in its file (the longest known prefix of each)."""
    package = module.split(".") if file.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                yield target


def import_graph(packages: Mapping[str, Path]) -> dict[str, set[str]]:
    known = modules_of(packages)
    return {module: set(_imported(module, file, known)) for module, file in known.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
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


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(import_graph(PACKAGES)) == []


def test_imports_between_packages_go_one_way() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph(PACKAGES).items()
        for target in targets
        if (source := module.split(".")[0]) != target.split(".")[0]
        and not any(target == allowed or target.startswith(f"{allowed}.") for allowed in ALLOWED[source])
    )
    assert wrong == []


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    """The check above can fail: the shape of the api/supervisor cycle this test replaced."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "api.py").write_text("def serve():\n    from pkg.supervisor import run\n    return run()\n")
    (package / "supervisor.py").write_text("def run():\n    from .api import Server\n    return Server\n")
    (package / "server.py").write_text("import pkg.api\n")
    assert cycles(import_graph({"pkg": package})) == [["pkg.api", "pkg.supervisor"]]
