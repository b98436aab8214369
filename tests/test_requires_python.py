"""pyproject's requires-python tells the truth: the installed packages (geomkern, fedsim) and
setup.py parse under the oldest Python it claims, import no standard-library module or name that
Python lacks except behind a fallback, and fedsim's fallback (tomli for tomllib) is declared for
exactly the Pythons that need it. With that Python's interpreter on the machine (pyenv's, or
python3.X on PATH), the sources are compiled by it and every standard-library import is resolved
in it; without one, the check is the table below (the standard library's additions after 3.10
that a project like this reaches for)."""
from __future__ import annotations

import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OLDEST = tuple(int(x) for x in re.fullmatch(r">=\s*(\d+)\.(\d+)", PROJECT["requires-python"]).groups())
SOURCES = sorted([*ROOT.glob("geomkern/**/*.py"), *ROOT.glob("fedsim/**/*.py"), ROOT / "setup.py"])

# Standard-library modules and names added after 3.10 (3.11-3.13), by the version that added them.
NEW_MODULES = {"tomllib": (3, 11), "wsgiref.types": (3, 11)}
NEW_NAMES = {
    ("typing", "Self"): (3, 11), ("typing", "LiteralString"): (3, 11), ("typing", "Never"): (3, 11),
    ("typing", "assert_never"): (3, 11), ("typing", "reveal_type"): (3, 11),
    ("typing", "Required"): (3, 11), ("typing", "NotRequired"): (3, 11),
    ("typing", "TypeVarTuple"): (3, 11), ("typing", "Unpack"): (3, 11),
    ("typing", "dataclass_transform"): (3, 11), ("typing", "override"): (3, 12),
    ("typing", "TypeAliasType"): (3, 12), ("typing", "ReadOnly"): (3, 13),
    ("typing", "TypeIs"): (3, 13), ("enum", "StrEnum"): (3, 11), ("enum", "ReprEnum"): (3, 11),
    ("enum", "verify"): (3, 11), ("datetime", "UTC"): (3, 11), ("asyncio", "TaskGroup"): (3, 11),
    ("asyncio", "timeout"): (3, 11), ("hashlib", "file_digest"): (3, 11),
    ("operator", "call"): (3, 11), ("contextlib", "chdir"): (3, 11), ("math", "cbrt"): (3, 11),
    ("math", "exp2"): (3, 11), ("itertools", "batched"): (3, 12), ("warnings", "deprecated"): (3, 13),
    ("copy", "replace"): (3, 13),
}
NEW_BUILTINS = {"ExceptionGroup": (3, 11), "BaseExceptionGroup": (3, 11)}


def _guarded(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside `try: ... except (ModuleNotFoundError|ImportError)`."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in {"ModuleNotFoundError", "ImportError"}
                for h in node.handlers):
            lines |= {n.lineno for stmt in node.body for n in ast.walk(stmt)
                      if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def _uses(path: Path) -> list[tuple[int, str, tuple[int, int]]]:
    """(line, what, the Python that added it) for each use of a post-OLDEST feature in the table."""
    tree = ast.parse(path.read_text(), feature_version=OLDEST)
    guarded, out = _guarded(tree), []
    modules = {}  # local name -> standard-library module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name in NEW_MODULES and node.lineno not in guarded:
                    out.append((node.lineno, f"import {a.name}", NEW_MODULES[a.name]))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module in NEW_MODULES and node.lineno not in guarded:
                out.append((node.lineno, f"from {node.module} import ...", NEW_MODULES[node.module]))
            for a in node.names:
                added = NEW_NAMES.get((node.module, a.name))
                if added and node.lineno not in guarded:
                    out.append((node.lineno, f"from {node.module} import {a.name}", added))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            added = NEW_NAMES.get((modules.get(node.value.id), node.attr))
            if added:
                out.append((node.lineno, f"{node.value.id}.{node.attr}", added))
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS:
            out.append((node.lineno, node.id, NEW_BUILTINS[node.id]))
        elif isinstance(node, ast.TryStar):
            out.append((node.lineno, "except*", (3, 11)))
    return [u for u in out if u[2] > OLDEST]


def test_requires_python_names_a_floor():
    assert OLDEST >= (3, 10), PROJECT["requires-python"]  # torch's own floor


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_sources_use_nothing_newer_than_the_oldest_claimed_python(path):
    uses = _uses(path)
    assert not uses, (f"{path.relative_to(ROOT)} needs a newer Python than requires-python's "
                      f"{OLDEST}: " + "; ".join(f"line {n}: {w} ({'.'.join(map(str, v))})" for n, w, v in uses))


def test_the_table_sees_what_it_checks():
    src = ("import tomllib\nfrom typing import Self\nimport datetime\nx = datetime.UTC\n"
           "try:\n    import tomllib\nexcept ModuleNotFoundError:\n    import tomli as tomllib\n")
    p = Path(os.environ.get("TMPDIR", "/tmp")) / "_requires_python_probe.py"
    p.write_text(src)
    try:
        assert [u[:2] for u in _uses(p)] == [(1, "import tomllib"), (2, "from typing import Self"),
                                             (4, "datetime.UTC")]
    finally:
        p.unlink()


def test_tomli_is_declared_where_tomllib_is_missing():
    """fedsim reads TOML with tomllib, tomli on the Pythons before 3.11: the fedsim extra installs it there."""
    if OLDEST >= (3, 11):
        return
    extra = PROJECT["optional-dependencies"]["fedsim"]
    assert any(re.fullmatch(r"tomli\b[^;]*;\s*python_version\s*<\s*['\"]3\.11['\"]", r) for r in extra), extra
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name == "tomllib" for a in node.names):
                assert node.lineno in _guarded(tree), f"{path.relative_to(ROOT)}:{node.lineno}: tomllib unguarded"


def _oldest_interpreter() -> str | None:
    """That Python's interpreter: pyenv's, else python3.X on PATH (a pyenv shim may not run it)."""
    name = f"python{OLDEST[0]}.{OLDEST[1]}"
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [*sorted(glob.glob(os.path.join(pyenv, "versions", f"{OLDEST[0]}.{OLDEST[1]}.*", "bin", name))),
                  shutil.which(name)]
    for exe in filter(None, candidates):
        res = subprocess.run([exe, "-I", "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
        if res.returncode == 0 and tuple(map(int, res.stdout.split())) == OLDEST:
            return exe
    return None


_PROBE = r"""
import importlib, json, sys
wanted = json.loads(sys.stdin.read())
missing = []
for module, names in wanted.items():
    try:
        m = importlib.import_module(module)
    except ImportError as e:
        missing.append(f"{module} ({e})")
        continue
    missing += [f"{module}.{n}" for n in names if not hasattr(m, n)]
print(json.dumps([sys.version_info[:2], missing]))
"""


def test_the_oldest_python_compiles_the_sources_and_has_their_stdlib_imports(tmp_path):
    exe = _oldest_interpreter()
    if exe is None:
        pytest.skip(f"no Python {OLDEST[0]}.{OLDEST[1]} here (python{OLDEST[0]}.{OLDEST[1]} on PATH or pyenv)")
    # its own compiler: the grammar as that Python has it
    res = subprocess.run([exe, "-c", "import sys\nfor p in sys.argv[1:]: compile(open(p, encoding='utf-8').read(), p, 'exec')",
                          *map(str, SOURCES)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    # every unguarded standard-library import, resolved there (its names too)
    stdlib = sys.stdlib_module_names
    wanted: dict[str, set[str]] = {}
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        guarded = _guarded(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in guarded:
                continue
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in stdlib:
                        wanted.setdefault(a.name, set())
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if node.module.split(".")[0] in stdlib and node.module != "__future__":
                    wanted.setdefault(node.module, set()).update(a.name for a in node.names)
    res = subprocess.run([exe, "-I", "-c", _PROBE], input=json.dumps({k: sorted(v) for k, v in wanted.items()}),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    version, missing = json.loads(res.stdout)
    assert tuple(version) == OLDEST
    # a submodule imported as a name (from concurrent import futures) is a module, not an attribute
    missing = [m for m in missing if not _is_submodule(exe, m)]
    assert not missing, f"Python {OLDEST[0]}.{OLDEST[1]} lacks: {missing}"


def _is_submodule(exe: str, dotted: str) -> bool:
    if " (" in dotted:
        return False
    res = subprocess.run([exe, "-I", "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({dotted!r}) is None)"],
                         capture_output=True, timeout=60)
    return res.returncode == 0
