"""The manifold-fidelity benchmark at small size (scripts/fidelity.py runs the full one).

Goal from the FedMC claim: FedMC's default keeps samples closer to the data manifold than GGEUR
at matched mean displacement — its off-manifold ratio at most 0.7x GGEUR's."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "fidelity", Path(__file__).resolve().parents[1] / "scripts" / "fidelity.py")
fidelity = importlib.util.module_from_spec(_spec)
sys.modules["fidelity"] = fidelity  # its dataclasses look their module up there
_spec.loader.exec_module(fidelity)


@pytest.mark.parametrize("manifold", ["s_curve", "swiss_roll"])
def test_fedmc_default_beats_ggeur_at_matched_displacement(manifold):
    from geomkern import fedmc

    import inspect

    anchored = inspect.signature(fedmc.calibrate).parameters["anchored"].default
    default = ("fedmc default", "consistent", fedmc.DEFAULT_METHOD, anchored)
    rows = fidelity.run("small", manifolds=(manifold,), variants=(default, ("fedmc paper/gd", "paper", "gd", False)),
                        progress=False)
    ratio = {r["method"]: r["ratio"] for r in rows}
    for r in rows:  # displacement really was matched (2% bisection tolerance)
        if r["method"] != "fedmc paper/gd":
            assert abs(r["mean_displacement"] / r["target_displacement"] - 1) < 0.03, r
    print(fidelity.format_rows(rows))
    assert ratio["fedmc default"] <= 0.7 * ratio["ggeur"], ratio


def test_plot_writes_one_png_per_manifold(tmp_path, monkeypatch):
    """``--plot DIR`` reaches run(); run(plot_dir=...) at the tiny size writes one valid PNG per
    manifold (one FedMC variant here, to stay fast)."""
    import matplotlib.image as mpimg

    seen = {}
    monkeypatch.setattr(fidelity, "run", lambda *a, **k: seen.update(k) or [])
    monkeypatch.setattr(fidelity, "format_rows", lambda rows: "")
    assert fidelity.main(["--size", "tiny", "--plot", str(tmp_path / "x")]) == 0
    assert seen["plot_dir"] == str(tmp_path / "x")
    monkeypatch.undo()
    keep = ("fedmc default (fixed_point, anchored)",)
    rows = fidelity.run("tiny", variants=tuple(v for v in fidelity.FEDMC_VARIANTS if v[0] in keep),
                        plot_dir=tmp_path / "fig", progress=False)
    files = sorted(p.name for p in (tmp_path / "fig").iterdir())
    assert files == ["fidelity-scurve.png", "fidelity-swissroll.png"]
    for name in files:
        raw = (tmp_path / "fig" / name).read_bytes()
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(tmp_path / "fig" / name)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 600
        assert float(img[..., :3].std()) > 0.05  # something was drawn
    assert {r["method"] for r in rows} == {"ggeur", "local pca", *keep}
