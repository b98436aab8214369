"""Check that every figure README.md and docs/ quote from a result file equals that file.

A quoted figure is followed by a key, an HTML comment that Markdown (GitHub, PyPI, MkDocs) does
not render, and the page's sidecar binds the key to a result file and a template:

    README.md:          the library built in 16.9 s<!--abi-build--> (...)
                        | 0.5 | 62.37 ± 0.88 | 63.90 ± 0.31<!--v05--> |
    README.figs.toml:   ["packaging/abi-compare.json"]
                        abi-build = '{at("summary/after/build_wall_s"):.1f} s'
                        ["linear/beta0.5-3seeds-val.json"]
                        v05 = '{pm(acc("FedAvg"))} | {pm(acc("FedAvg+GGEUR"))}'

The sidecar is the page's path with `.md` replaced by `.figs.toml`; its tables are entries of
results/manifest.json (a file's path under results/), each key = a template whose `{...}` fields
are expressions over that file, each optionally with a format spec (`{x:.2f}`); its other text is
matched as written (a table row's figures share one key, their cells joined by " | "). A key is
letters, digits, `_` and `-` (a bare TOML key), at most 24 characters, and may be quoted more
than once in its page.
The check renders the template and fails unless the text just before the key ends with it; it
also fails on a key the sidecar lacks, on a sidecar key the page does not use, and on a key bound
twice. So a number copied by hand into the prose is pinned to its source: re-running a study
that changes it makes this check fail until the prose is updated.

The older inline form, the entry and template in the comment itself, is still read (until every
page is converted):

    63.42 ± 0.63<!-- fig linear/beta0.5-3seeds-algorithm1.json: {pm(acc("FedAvg+FedMC"))} -->

Expressions (no names besides these, no attribute access):
  at("a/b/*/c")   the value at a path: keys and list indices split by "/", "*" every element
                  (an array), "key^=prefix" the list element whose `key` starts with prefix
  acc("Method")   fedsim results.json: the method's final accuracy per seed, in %
  mean(x) sd(x) min(x) max(x) abs(x)   sd is the sample std (ddof 1), as fedsim reports it
  pm(x)           "mean ± sd" of x, 2 decimals
  paired(a, b)    "mean [min, max]" of a - b per seed, signed, 2 decimals
  + - * / and numbers; strings only as arguments

Run: python scripts/check_figures.py [FILE.md ...]   (default: README.md and docs/**/*.md)
     python scripts/check_figures.py --convert FILE.md   (inline markers -> keys + sidecar)
"""
from __future__ import annotations

import ast
import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
# A marker quoted in inline code (`<!-- fig ... -->`, as in docs/development.md) is not one.
MARKER = re.compile(r"(?<!`)<!--\s*fig\s+(?P<entry>[^:\s]+)\s*:\s*(?P<template>.*?)\s*-->", re.S)
KEY = re.compile(r"(?<!`)<!--(?P<key>[A-Za-z0-9][\w-]*)-->")
KEY_MAX = 24
SIDECAR = ".figs.toml"
# Code (fenced blocks, `spans`) shows markers and keys, as docs/development.md does; it quotes none.
CODE = re.compile(r"^[ \t]*(?P<fence>```|~~~).*?^[ \t]*(?P=fence)|`[^`\n]+`", re.S | re.M)
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


def sidecar_of(page: Path) -> Path:
    """README.md -> README.figs.toml, docs/results.md -> docs/results.figs.toml."""
    return page.with_name(page.name[:-len(".md")] + SIDECAR)


def load_sidecar(path: Path, where: str = "") -> tuple[dict[str, tuple[str, str]], list[str]]:
    """({key: (entry, template)}, one message per malformed binding) of a sidecar file."""
    where = where or path.name
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        return {}, [f"{where}: {e}"]
    bindings, errors = {}, []
    for entry, table in data.items():
        if not isinstance(table, dict):
            errors.append(f"{where}: {entry!r} is not a table [ENTRY] of key = 'TEMPLATE' lines")
            continue
        for key, template in table.items():
            if not isinstance(template, str):
                errors.append(f"{where}: [{entry}] {key} is not a template string")
            elif key in bindings:
                errors.append(f"{where}: {key!r} is bound twice ([{bindings[key][0]}] and [{entry}])")
            elif not re.fullmatch(r"[A-Za-z0-9][\w-]*", key) or len(key) > KEY_MAX:
                errors.append(f"{where}: {key!r} is not a key (letters, digits, _ and -; at most "
                              f"{KEY_MAX} characters, not starting with _ or -)")
            else:
                bindings[key] = (entry, template)
    return bindings, errors


def _check_one(text, at, entry, template, manifest, cache, where, line, label):
    try:
        want = render(entry, template, manifest, cache)
    except (FigureError, OSError, ValueError, IndexError, TypeError) as e:
        return [f"{where}:{line}: {label}{e}"]
    before = text[:at]
    if not _norm(before[-len(want) - 40:]).endswith(_norm(want)):
        shown = before[-len(want) - 10:].replace("\n", " ")
        return [f"{where}:{line}: {label}the text before it should end with {want!r} "
                f"(from results/{entry}), it ends with {shown!r}"]
    return []


def _figures(template: str) -> int:
    """The figures a template quotes: its fields (a table row's key binds several)."""
    return max(1, len(FIELD.findall(template)))


def check_text(text: str, manifest: dict, where: str = "",
               bindings: dict[str, tuple[str, str]] | None = None,
               sidecar: str = "the sidecar") -> tuple[int, list[str]]:
    """(figures checked (template fields), one message per key or marker whose text differs from its
    file, per key with no binding, and per binding the text does not use). `bindings` is the
    page's sidecar (key -> (entry, template)); None: the page has none, and a key in it is an
    error."""
    cache: dict = {}
    errors, n, used = [], 0, set()
    prose = CODE.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)
    for m in MARKER.finditer(prose):
        n += _figures(m["template"])
        line = text.count("\n", 0, m.start()) + 1
        errors += _check_one(text, m.start(), m["entry"], m["template"], manifest, cache, where,
                             line, "")
    for m in KEY.finditer(prose):
        n += 1
        line = text.count("\n", 0, m.start()) + 1
        key = m["key"]
        if bindings is None or key not in bindings:
            errors.append(f"{where}:{line}: key {key!r} has no binding in {sidecar}")
            continue
        n += _figures(bindings[key][1]) - 1
        used.add(key)
        errors += _check_one(text, m.start(), *bindings[key], manifest, cache, where, line,
                             f"{key}: ")
    for key in sorted(set(bindings or ()) - used):
        errors.append(f"{sidecar}: {key!r} ([{bindings[key][0]}]) is not used in {where or 'the page'}")
    return n, errors


def check_page(page: Path, manifest: dict) -> tuple[int, list[str]]:
    """check_text on a page with its sidecar, if it has one."""
    where = _shown(page)
    side = sidecar_of(page)
    bindings, errors = (load_sidecar(side, _shown(side)) if side.is_file() else (None, []))
    n, errs = check_text(page.read_text(), manifest, where, bindings, _shown(side))
    return n, errors + errs


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def default_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def orphan_sidecars() -> list[str]:
    """Sidecars under the repository's pages with no page beside them."""
    sides = [*ROOT.glob("*" + SIDECAR), *(ROOT / "docs").rglob("*" + SIDECAR)]
    return [f"{_shown(s)}: no page {s.name[:-len(SIDECAR)]}.md beside it" for s in sorted(sides)
            if not s.with_name(s.name[:-len(SIDECAR)] + ".md").is_file()]


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def convert(page: Path, prefix: dict[str, str] | None = None) -> int:
    """Rewrite a page's inline markers as keys and append their bindings to its sidecar; returns
    the number converted. Keys are PREFIX-N per entry (PREFIX: prefix[entry], or the entry's
    file name slugged), N counting from the entry's highest key already bound; a repeated
    (entry, template) reuses its key."""
    text = page.read_text()
    side = sidecar_of(page)
    bindings, errors = load_sidecar(side) if side.is_file() else ({}, [])
    if errors:
        raise FigureError("; ".join(errors))
    by_binding = {v: k for k, v in bindings.items()}
    new: dict[str, dict[str, str]] = {}
    counts: dict[str, int] = {}

    def key_for(entry, template):
        if (entry, template) in by_binding:
            return by_binding[(entry, template)]
        pre = (prefix or {}).get(entry) or _slug(Path(entry).stem)[:KEY_MAX - 4]
        n = counts.get(pre, 0)
        while True:
            n += 1
            key = f"{pre}-{n}"
            if key not in bindings:
                break
        counts[pre] = n
        bindings[key] = (entry, template)
        by_binding[(entry, template)] = key
        new.setdefault(entry, {})[key] = template
        return key

    n = len(MARKER.findall(text))
    out = MARKER.sub(lambda m: f"<!--{key_for(m['entry'], m['template'])}-->", text)
    if new:
        lines = [] if side.is_file() else [
            f"# The figures {page.name} quotes: [ENTRY] (a file under results/, as results/manifest.json",
            "# names it), then KEY = 'TEMPLATE'; the page writes the figure, then <!--KEY-->.",
            "# Checked by scripts/check_figures.py (docs/development.md)."]
        for entry, table in new.items():
            lines += ["", f'["{entry}"]']
            for key, template in table.items():
                lines.append(f"{key} = {_toml_str(template)}")
        with side.open("a") as f:
            f.write("\n".join(lines) + "\n")
    page.write_text(out)
    return n


def _toml_str(s: str) -> str:
    if "'" not in s and "\n" not in s:
        return f"'{s}'"
    return json.dumps(s, ensure_ascii=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Check every figure keyed (or marked) in the README "
                                                 "and docs (or the given files) against its file in "
                                                 "results/ (results/manifest.json names them).")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md, docs/**/*.md)")
    parser.add_argument("--convert", action="store_true",
                        help="rewrite the given pages' inline markers as keys bound in their sidecars")
    args = parser.parse_args(argv)
    files = args.files or default_files()
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if args.convert:
        if not args.files:
            parser.error("--convert needs the pages to convert")
        for f in files:
            print(f"{f}: {convert(f)} markers converted")
    manifest = json.loads((RESULTS / "manifest.json").read_text())
    total, errors = 0, [] if args.files else orphan_sidecars()
    for f in files:
        n, errs = check_page(f, manifest)
        total += n
        errors += errs
    for e in errors:
        print(e)
    print(f"{total} figures checked in {len(files)} files, {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
