"""The results store and the figures quoted from it: every file under results/ has a manifest entry
(command, commit, machine, date), docs/ holds no result data, and every figure README.md and
docs/ quote through a key (bound in the page's sidecar) or an inline marker equals its result
file (scripts/check_figures.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_figures as cf  # noqa: E402

MANIFEST = json.loads((ROOT / "results" / "manifest.json").read_text())
ENTRY = "linear/beta0.5-3seeds-algorithm1.json"


def test_every_result_file_has_a_manifest_entry_and_every_entry_a_file():
    on_disk = {str(p.relative_to(ROOT / "results")) for p in (ROOT / "results").rglob("*")
               if p.is_file() and p.name != "manifest.json"}
    assert on_disk == set(MANIFEST["files"]), (
        f"not in the manifest: {sorted(on_disk - set(MANIFEST['files']))}; "
        f"in the manifest, missing on disk: {sorted(set(MANIFEST['files']) - on_disk)}")
    for name, e in MANIFEST["files"].items():
        for key in ("what", "command", "commit", "date", "machine"):
            assert e.get(key), f"results/manifest.json: {name} has no {key!r}"
        if e.get("kind") != "config":
            assert {"cpu", "threads", "torch"} <= set(e["machine"]), f"{name}: machine {e['machine']}"


def test_docs_hold_prose_and_pictures_only():
    data = [p for p in (ROOT / "docs").rglob("*")
            if p.is_file() and p.suffix in {".json", ".jsonl", ".toml", ".txt", ".csv", ".log"}
            and not p.name.endswith(cf.SIDECAR)]
    assert not data, f"result data under docs/ (it belongs in results/<study>/): {data}"


def test_every_quoted_figure_matches_its_result_file():
    total, errors = 0, cf.orphan_sidecars()
    for f in cf.default_files():
        n, errs = cf.check_page(f, MANIFEST)
        total += n
        errors += errs
    assert not errors, "\n".join(errors)
    readme, _ = cf.check_page(ROOT / "README.md", MANIFEST)
    assert readme >= 10 and total >= 60, f"only {readme} figures in README, {total} in all checked"


def test_a_figure_that_differs_from_its_file_is_reported():
    right = f'63.42 ± 0.63<!-- fig {ENTRY}: {{pm(acc("FedAvg+FedMC"))}} -->'
    assert cf.check_text(right, MANIFEST) == (1, [])
    n, errors = cf.check_text(right.replace("63.42", "63.43"), MANIFEST, "x.md")
    assert n == 1 and len(errors) == 1 and "'63.42 ± 0.63'" in errors[0] and "x.md:1" in errors[0]


def test_typography_of_signs_is_not_a_difference():
    paired = f'{{paired(acc("FedAvg+FedMC"), acc("FedAvg"))}}'
    beta005 = "linear/beta0.05-3seeds-algorithm1.json"
    text = f"\u22120.36 [\u22120.83, +0.21]<!-- fig {beta005}: {paired} -->"
    assert cf.check_text(text, MANIFEST) == (1, [])


@pytest.mark.parametrize("marker, message", [
    ('<!-- fig linear/nope.json: {pm(acc("FedAvg"))} -->', "no entry in results/manifest.json"),
    (f'<!-- fig {ENTRY}: {{pm(acc("NoSuchMethod"))}} -->', "'NoSuchMethod'"),
    (f'<!-- fig {ENTRY}: {{__import__("os")}} -->', "not allowed in a figure marker"),
    (f'<!-- fig {ENTRY}: {{at("methods").keys()}} -->', "not allowed in a figure marker"),
])
def test_bad_markers_are_named(marker, message):
    n, errors = cf.check_text("1.00" + marker, MANIFEST, "x.md")
    assert n == 1 and len(errors) == 1 and message in errors[0], errors


def test_list_selection_by_prefix():
    got = cf.render("cpu-bench/cpu_floor-cpu.json",
                    '{at("ratios/label^=kmeans separated: gk native/speedup"):.1f}', MANIFEST)
    ratios = json.loads((ROOT / "results/cpu-bench/cpu_floor-cpu.json").read_text())["ratios"]
    want = next(r["speedup"] for r in ratios if r["label"].startswith("kmeans separated: gk native"))
    assert got == f"{want:.1f}"


def test_a_marker_quoted_as_code_is_not_checked():
    assert cf.check_text("write `<!-- fig ENTRY: TEMPLATE -->` after the number", MANIFEST) == (0, [])


BINDINGS = {"avg": (ENTRY, '{pm(acc("FedAvg+FedMC"))}'), "gain": (ENTRY, '{paired(acc("FedAvg+FedMC"), acc("FedAvg"))}')}


def test_a_keyed_figure_is_checked_against_its_binding():
    text = "FedMC 63.42 ± 0.63<!--avg-->, paired +0.36 [+0.10, +0.52]<!--gain-->."
    assert cf.check_text(text, MANIFEST, "x.md", BINDINGS, "x.figs.toml") == (2, [])
    n, errors = cf.check_text(text.replace("63.42", "63.43"), MANIFEST, "x.md", BINDINGS)
    assert n == 2 and len(errors) == 1 and "x.md:1: avg:" in errors[0] and "'63.42 ± 0.63'" in errors[0]


def test_a_key_without_binding_and_a_binding_without_use_are_errors():
    text = "63.42 ± 0.63<!--avg--> and 1.00<!--nope-->"
    n, errors = cf.check_text(text, MANIFEST, "x.md", BINDINGS, "x.figs.toml")
    assert n == 2 and sorted(errors) == sorted([
        "x.md:1: key 'nope' has no binding in x.figs.toml",
        "x.figs.toml: 'gain' ([linear/beta0.5-3seeds-algorithm1.json]) is not used in x.md"])
    # a page without a sidecar: every key is unbound
    assert cf.check_text("63.42 ± 0.63<!--avg-->", MANIFEST, "x.md")[1] == [
        "x.md:1: key 'avg' has no binding in the sidecar"]


def test_keys_in_code_are_not_figures():
    text = "write `1.00<!--avg-->`, or\n\n  ```\n  1.00<!--gain-->\n  ```\n"
    assert cf.check_text(text, MANIFEST, "x.md", {}) == (0, [])
    # an ordinary comment (with a space) is not a key
    assert cf.check_text("<!-- a note -->", MANIFEST, "x.md", {}) == (0, [])


def test_sidecar_bindings_are_checked_for_shape(tmp_path):
    side = tmp_path / "x.figs.toml"
    side.write_text(f'["{ENTRY}"]\na = "{{pm(acc(\\"FedAvg\\"))}}"\n\n["other.json"]\na = "1"\n'
                    '"-bad" = "1"\nnum = 3\n')
    bindings, errors = cf.load_sidecar(side)
    assert set(bindings) == {"a"} and len(errors) == 3, errors
    assert any("bound twice" in e for e in errors) and any("'-bad' is not a key" in e for e in errors)


def test_convert_turns_markers_into_keys_that_check(tmp_path):
    page = tmp_path / "x.md"
    page.write_text(f'63.42 ± 0.63<!-- fig {ENTRY}: {{pm(acc("FedAvg+FedMC"))}} --> and again '
                    f'63.42 ± 0.63<!-- fig {ENTRY}: {{pm(acc("FedAvg+FedMC"))}} -->\n')
    assert cf.convert(page, {ENTRY: "a05"}) == 2
    assert page.read_text() == "63.42 ± 0.63<!--a05-1--> and again 63.42 ± 0.63<!--a05-1-->\n"
    assert cf.load_sidecar(tmp_path / "x.figs.toml")[0] == {"a05-1": (ENTRY, '{pm(acc("FedAvg+FedMC"))}')}
    assert cf.check_page(page, MANIFEST) == (2, [])


def test_sidecar_without_page_is_reported(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "gone.figs.toml").write_text("")
    (tmp_path / "README.md").write_text("")
    (tmp_path / "README.figs.toml").write_text("")
    monkeypatch.setattr(cf, "ROOT", tmp_path)
    assert cf.orphan_sidecars() == ["docs/gone.figs.toml: no page gone.md beside it"]
