"""Check that every figure README.md and docs/ quote from a result file equals that file.

A quoted figure is followed by a marker, an HTML comment that Markdown (GitHub, MkDocs) does not
render:

    63.42 ± 0.63<!-- fig linear/beta0.5-3seeds-algorithm1.json: {pm(acc("FedAvg+FedMC"))} -->

`linear/beta0.5-3seeds-algorithm1.json` is the file's entry in results/manifest.json (its path
under results/); the text after the colon is a template whose `{...}` fields are expressions over
that file, each optionally with a format spec (`{x:.2f}`). The check renders the template and
fails unless the text just before the marker ends with it. So a number copied by hand into the
prose is pinned to its source: re-running a study that changes it makes this check fail until
the prose is updated.

Expressions (no names besides these, no attribute access):
  at("a/b/*/c")   the value at a path: keys and list indices split by "/", "*" every element
                  (an array), "key^=prefix" the list element whose `key` starts with prefix
  acc("Method")   fedsim results.json: the method's final accuracy per seed, in %
  mean(x) sd(x) min(x) max(x) abs(x)   sd is the sample std (ddof 1), as fedsim reports it
  pm(x)           "mean ± sd" of x, 2 decimals
  paired(a, b)    "mean [min, max]" of a - b per seed, signed, 2 decimals
  + - * / and numbers; strings only as arguments

Run: python scripts/check_figures.py [FILE.md ...]   (default: README.md and docs/**/*.md)
"""
from __future__ import annotations

import ast
import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
# A marker quoted in inline code (`<!-- fig ... -->`, as in docs/development.md) is not one.
MARKER = re.compile(r"(?<!`)<!--\s*fig\s+(?P<entry>[^:\s]+)\s*:\s*(?P<template>.*?)\s*-->", re.S)
FIELD = re.compile(r"\{(?P<expr>[^{}]*?)(?::(?P<spec>[^{}:]*))?\}")


class FigureError(ValueError):
    pass


def _load(entry: str, manifest: dict, cache: dict):
    if entry not in manifest["files"]:
        raise FigureError(f"{entry!r} has no entry in results/manifest.json; name a file listed "
                          f"there (its path under results/)")
    if entry not in cache:
        path = RESULTS / entry
        text = path.read_text()
        cache[entry] = ([json.loads(line) for line in text.splitlines() if line.strip()]
                        if path.suffix == ".jsonl" else json.loads(text))
    return cache[entry]


def _at(data, path: str):
    cur = [data]
    many = False
    for seg in path.split("/"):
        nxt = []
        for node in cur:
            if seg == "*":
                nxt.extend(node.values() if isinstance(node, dict) else node)
                many = True
            elif "^=" in seg:
                key, prefix = seg.split("^=", 1)
                hits = [x for x in node if str(x.get(key, "")).startswith(prefix)]
                if len(hits) != 1:
                    raise FigureError(f"{seg!r} in {path!r} matches {len(hits)} elements, not one")
                nxt.append(hits[0])
            elif isinstance(node, list):
                nxt.append(node[int(seg)])
            elif isinstance(node, dict) and seg in node:
                nxt.append(node[seg])
            else:
                raise FigureError(f"{seg!r} of {path!r} is not in the file "
                                  f"(there: {sorted(node)[:12] if isinstance(node, dict) else type(node).__name__})")
        cur = nxt
    return np.asarray(cur, dtype=float) if many else cur[0]


def _signed(x: float) -> str:
    return f"{x:+.2f}"


def _functions(data):
    def acc(method):
        return 100 * _at(data, f"methods/{method}/seeds/*/final_accuracy")

    def sd(x):
        return float(np.std(np.asarray(x, dtype=float), ddof=1))

    def paired(a, b):
        d = np.asarray(a) - np.asarray(b)
        return f"{_signed(d.mean())} [{_signed(d.min())}, {_signed(d.max())}]"

    return {"at": lambda p: _at(data, p), "acc": acc, "sd": sd, "paired": paired, "abs": abs,
            "mean": lambda x: float(np.mean(x)), "min": lambda x: float(np.min(x)),
            "max": lambda x: float(np.max(x)),
            "pm": lambda x: f"{float(np.mean(x)):.2f} ± {sd(x):.2f}"}


_OPS = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide}


def _eval(node, funcs):
    if isinstance(node, ast.Expression):
        return _eval(node.body, funcs)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left, funcs), _eval(node.right, funcs))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, funcs)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs
            and not node.keywords):
        return funcs[node.func.id](*(_eval(a, funcs) for a in node.args))
    raise FigureError(f"{ast.unparse(node)!r} is not allowed in a figure marker; use numbers, "
                      f"+ - * /, and {', '.join(sorted(funcs))}")


def render(entry: str, template: str, manifest: dict, cache: dict | None = None) -> str:
    """The text a marker's template stands for, computed from its result file."""
    funcs = _functions(_load(entry, manifest, {} if cache is None else cache))

    def field(m):
        try:
            tree = ast.parse(m["expr"].strip(), mode="eval")
        except SyntaxError as e:
            raise FigureError(f"cannot parse {m['expr']!r}: {e.msg}") from None
        value = _eval(tree, funcs)
        return format(value, m["spec"]) if m["spec"] else str(value)

    return FIELD.sub(field, template)


def _norm(s: str) -> str:
    """Typography that does not change a number: the minus sign, the sign of zero, spaces."""
    s = s.replace("\u2212", "-").replace("\u00a0", " ")
    s = re.sub(r"[+-](0\.0+)(?!\d)", r"\1", s)
    return re.sub(r"\s+", " ", s).strip()


def check_text(text: str, manifest: dict, where: str = "") -> tuple[int, list[str]]:
    """(markers checked, one message per marker whose figure differs from its file)."""
    cache: dict = {}
    errors, n = [], 0
    for m in MARKER.finditer(text):
        n += 1
        line = text.count("\n", 0, m.start()) + 1
        try:
            want = render(m["entry"], m["template"], manifest, cache)
        except (FigureError, OSError, ValueError, IndexError, TypeError) as e:
            errors.append(f"{where}:{line}: {e}")
            continue
        before = text[:m.start()]
        if not _norm(before[-len(want) - 40:]).endswith(_norm(want)):
            shown = before[-len(want) - 10:].replace("\n", " ")
            errors.append(f"{where}:{line}: the text before the marker should end with "
                          f"{want!r} (from results/{m['entry']}), it ends with {shown!r}")
    return n, errors


def default_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Check every figure marked with a fig marker in the "
                                                 "README and docs (or the given files) against its file "
                                                 "in results/ (results/manifest.json names them).")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md, docs/**/*.md)")
    files = parser.parse_args(argv).files or default_files()
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    manifest = json.loads((RESULTS / "manifest.json").read_text())
    total, errors = 0, []
    for f in files:
        n, errs = check_text(f.read_text(), manifest, str(f.resolve().relative_to(ROOT)))
        total += n
        errors += errs
    for e in errors:
        print(e)
    print(f"{total} figures checked in {len(files)} files, {len(errors)} differ from their result files")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
