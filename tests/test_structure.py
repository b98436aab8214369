"""The layering of geomkern (docs/design.md): its modules import each other without a cycle, and
no import of a geomkern module hides inside a function (the trick that keeps a circle alive).
Read from the source with ast, so a new import shows up here before it can bite at run time.
The helpers take the package name so that fedsim can be held to the same rules (issue 30)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: str = "geomkern") -> dict[str, Path]:
    return {_module_name(p): p for p in (ROOT / package).rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]):
    """(target module, lineno, inside a function?) for every import of a module in `modules`."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def in_function(node) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return True
        return False

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # "from pkg import sub" imports the module pkg.sub when there is one; the compiled
            # extensions geomkern._C / _C_cuda import nothing back
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names
                       if not (mod == "geomkern" and a.name.startswith("_C"))]
        else:
            continue
        for t in targets:
            if t in modules:
                yield t, node.lineno, in_function(node)


def _graph(package: str = "geomkern", top_level_only: bool = False):
    modules = _modules(package)
    return {name: {t for t, _, inside in _imports(path, modules) if not (top_level_only and inside)} - {name}
            for name, path in modules.items()}


def _find_cycle(graph):
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_checker_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_relative_imports():
    graph = _graph()
    assert "geomkern._dispatch" in graph["geomkern.ops.kpca"]
    assert "geomkern.ops.eigh" in graph["geomkern.backends.native"]
    assert len(graph) > 15


def test_the_graph_reads_fedsim_too():
    graph = _graph("fedsim")
    assert "fedsim.algorithms.base" in graph["fedsim.algorithms.fedopt"]
    assert not any(name.startswith("geomkern") for name in graph)


def test_geomkern_imports_without_a_cycle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_dispatch_imports_nothing_from_geomkern():
    assert _graph()["geomkern._dispatch"] == set()


def test_no_geomkern_import_inside_a_function():
    modules = _modules()
    hidden = [f"{path.relative_to(ROOT)}:{line} imports {t}"
              for path in modules.values() for t, line, inside in _imports(path, modules) if inside]
    assert not hidden, hidden


def test_fedsim_top_level_imports_without_a_cycle():
    """A first step for fedsim (issue 30): its top-level imports form no cycle (the algorithm
    registry lives in algorithms/_registry.py, not the package __init__ that imports the
    algorithms). The imports inside functions still close a circle; they are not checked yet."""
    cycle = _find_cycle(_graph("fedsim", top_level_only=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
