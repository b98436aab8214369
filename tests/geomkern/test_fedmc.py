"""geomkern.fedmc: fusion (paper Eq. 7), calibration targets, serialisation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import geomkern as gk
from geomkern import fedmc
from geomkern.fedmc import GeometryDictionary, LocalGeometry


def _lgd(centers, counts, mu, betas, gamma=0.5):
    centers = torch.as_tensor(centers, dtype=torch.float64)
    counts = torch.as_tensor(counts, dtype=torch.float64)
    mu = torch.as_tensor(mu, dtype=torch.float64)
    return LocalGeometry(centers=centers, counts=counts, eigenvalues=mu, variances=mu / counts[:, None],
                         betas=torch.as_tensor(betas, dtype=torch.float64), gamma=gamma)


def _hand_made():
    rng = np.random.default_rng(0)
    d, S = 2, 5
    # two regions far apart (x ~ 0 and x ~ 100): meta-clustering must find them
    a = _lgd([[0.0, 0.0], [0.5, 0.0]], [10, 30], [[4.0, 1.0], [3.0, 2.0]], rng.random((2, d, S)))
    b = _lgd([[100.0, 0.0], [0.2, 0.1]], [20, 5], [[6.0, 3.0], [1.0, 0.5]], rng.random((2, d, S)))
    return [a, b]


def test_fuse_matches_eq7_on_hand_made_lgds():
    lgds = _hand_made()
    D = fedmc.fuse(lgds, n_entries=2, seed=0)
    region_of_far = int(torch.argmax(D.prototypes[:, 0]))
    near = [(lgds[0], 0), (lgds[0], 1), (lgds[1], 1)]
    far = [(lgds[1], 0)]
    for members, r in ((near, 1 - region_of_far), (far, region_of_far)):
        n = np.array([float(l.counts[j]) for l, j in members])
        lam = np.stack([l.variances[j].numpy() for l, j in members])
        mu = np.stack([l.eigenvalues[j].numpy() for l, j in members])
        beta = np.stack([l.betas[j].numpy() for l, j in members])
        w = n[:, None] * lam  # Eq. 7: betas weighted by n_j * lambda_j,i ...
        # ... variances (and, by this implementation's choice, eigenvalues) by n_j
        np.testing.assert_allclose(D.variances[r].numpy(), (n[:, None] * lam).sum(0) / n.sum(), rtol=1e-12)
        np.testing.assert_allclose(D.eigenvalues[r].numpy(), (n[:, None] * mu).sum(0) / n.sum(), rtol=1e-12)
        np.testing.assert_allclose(D.betas[r].numpy(), (w[:, :, None] * beta).sum(0) / w.sum(0)[:, None],
                                   rtol=1e-12)
        cen = np.stack([l.centers[j].numpy() for l, j in members])
        np.testing.assert_allclose(D.prototypes[r].numpy(), (n[:, None] * cen).sum(0) / n.sum(), rtol=1e-12)
        assert float(D.weights[r]) == pytest.approx(n.sum())


def test_fuse_variance_is_sample_weighted_eq7():
    # the example: n = (10, 30), lambda = (1, 3) fuse to 2.5 (Eq. 7), not 2.8 (n * lambda weights)
    S = 3
    a = _lgd([[0.0, 0.0]], [10], [[10.0 * 1.0]], np.ones((1, 1, S)))
    b = _lgd([[0.1, 0.0]], [30], [[30.0 * 3.0]], np.ones((1, 1, S)))
    D = fedmc.fuse([a, b], n_entries=1, seed=0)
    assert float(D.variances[0, 0]) == pytest.approx(2.5, rel=1e-12)
    assert float(D.eigenvalues[0, 0]) == pytest.approx((10 * 10.0 + 30 * 90.0) / 40, rel=1e-12)


def test_fuse_aligns_eigenvector_signs():
    lgds = _hand_made()
    ref = fedmc.fuse(lgds, n_entries=2, seed=0)
    flipped = _hand_made()
    flipped[1].betas[1, 0] *= -1  # the sign of a kernel PC is arbitrary per patch
    out = fedmc.fuse(flipped, n_entries=2, seed=0)
    torch.testing.assert_close(out.betas, ref.betas, rtol=1e-12, atol=1e-12)


def test_fuse_rejects_inconsistent_lgds():
    lgds = _hand_made()
    lgds[1].gamma = 0.7
    with pytest.raises(ValueError, match="gamma"):
        fedmc.fuse(lgds, n_entries=2)
    with pytest.raises(ValueError, match="n_entries"):
        fedmc.fuse(_hand_made(), n_entries=9)


@pytest.fixture(scope="module")
def pipeline():
    """Three clients on an S-curve in D=8, float64, no DP noise."""
    from sklearn.datasets import make_s_curve

    pts, t = make_s_curve(1500, noise=0.0, random_state=0)
    Q = np.linalg.qr(np.random.default_rng(0).standard_normal((8, 3)))[0]
    X = torch.from_numpy(pts @ Q.T + 0.01 * np.random.default_rng(1).standard_normal((1500, 8)))
    order = np.argsort(t)
    clients = [X[torch.from_numpy(idx)] for idx in np.array_split(order, 3)]
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    protos = [fedmc.client_prototypes(c, 12, epsilon=math.inf, delta=1e-5, clip_norm=100.0, generator=g)
              for c, g in zip(clients, gens)]
    B = fedmc.build_gab(protos, 32, seed=0)
    gamma = fedmc.resolve_gamma("median", B)
    lgds = [fedmc.local_geometry(c, B, n_clusters=4, n_components=2, gamma=gamma, clip_norm=100.0, generator=g)
            for c, g in zip(clients, gens)]
    return X, B, gamma, lgds, fedmc.fuse(lgds, n_entries=6, seed=0)


def test_local_geometry_shapes_and_variances(pipeline):
    X, B, gamma, lgds, D = pipeline
    for l in lgds:
        m = l.centers.shape[0]
        assert l.betas.shape == (m, 2, B.shape[0]) and l.variances.shape == (m, 2)
        assert bool((l.eigenvalues[:, 0] >= l.eigenvalues[:, 1]).all())
        assert bool((l.variances > 0).all()) and l.gamma == gamma
        assert math.isinf(l.epsilon)


def test_consistent_coordinates_target_is_reached(pipeline):
    """Stated bound: coordinate targets are met to 1e-10 (squared residual; kernel values <= 1)
    for >= 85% of the points at scale 0.25 and >= 50% at scale 1. The rest ask for a kernel-PC
    coordinate beyond what any z near the patch attains (more LM steps do not change them: the
    map saturates); LM is monotone, so those end no worse than |dp|^2, where they started."""
    X, B, gamma, lgds, D = pipeline
    x = X[::25]
    for scale, frac in ((0.25, 0.85), (1.0, 0.5)):
        Z, loss = fedmc.calibrate(x, D, B, scale=scale, method="coordinates",
                                  generator=torch.Generator().manual_seed(0), return_loss=True)
        assert Z.shape == x.shape and bool(torch.isfinite(Z).all())
        assert float((loss < 1e-10).double().mean()) >= frac, sorted(loss.tolist())
        # the starting residual is |P(x) - (P(x) + dp)|^2 = |dp|^2: recompute dp with the same draw
        entry = fedmc.nearest_entry(x, D)
        eps = torch.randn(x.shape[0], D.variances.shape[1], generator=torch.Generator().manual_seed(0),
                          dtype=x.dtype)
        start = ((scale * eps * D.variances[entry].sqrt()) ** 2).sum(1)
        assert bool((loss <= start * (1 + 1e-9)).all())
        assert float((Z - x).norm(dim=1).mean()) > 0


def test_paper_formulation_runs_and_reports_its_loss(pipeline):
    X, B, gamma, lgds, D = pipeline
    x = X[::50]
    Zc, lc = fedmc.calibrate(x, D, B, formulation="consistent", method="gd", generator=torch.Generator().manual_seed(0),
                             return_loss=True)
    Zp, lp = fedmc.calibrate(x, D, B, formulation="paper", method="gd", generator=torch.Generator().manual_seed(0),
                             return_loss=True)
    assert bool(torch.isfinite(lp).all()) and bool(torch.isfinite(Zp).all())
    # the literal targets (betas as expansion coefficients, Gram eigenvalues) sit far off what any
    # z can reach; the consistent ones do not
    assert float(lp.mean()) > 10 * float(lc.mean())


def test_calibrate_scale_zero_returns_inputs_and_is_reproducible(pipeline):
    X, B, gamma, lgds, D = pipeline
    x = X[:40]
    # coordinates: a zero perturbation is already met at z0 = x (fixed_point would move x towards
    # its weighted basis mean, gd towards the basis' kernel values)
    torch.testing.assert_close(fedmc.calibrate(x, D, B, scale=0.0, method="coordinates",
                                               generator=torch.Generator().manual_seed(0)), x, rtol=0, atol=0)
    x3 = x.repeat_interleave(3, dim=0)  # three samples per row
    a = fedmc.calibrate(x3, D, B, generator=torch.Generator().manual_seed(5))
    b = fedmc.calibrate(x3, D, B, generator=torch.Generator().manual_seed(5))
    c = fedmc.calibrate(x3, D, B, generator=torch.Generator().manual_seed(6))
    assert a.shape == (120, x.shape[1])
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)


def test_anchored_calibration_is_the_perturbation_only(pipeline):
    """anchored (default): x + z(T) - z(T0). With scale 0 that is x; in general it equals the
    unanchored sample minus the unanchored scale-0 sample (the fixed point's own pull), plus x."""
    X, B, gamma, lgds, D = pipeline
    x = X[::30]
    zero = fedmc.calibrate(x, D, B, scale=0.0, method="fixed_point", generator=None)
    torch.testing.assert_close(zero, x, rtol=0, atol=1e-12)
    pulled = fedmc.calibrate(x, D, B, scale=0.0, method="fixed_point", anchored=False, generator=None)
    assert float((pulled - x).norm(dim=1).mean()) > 1e-3  # the pull that anchoring removes
    a = fedmc.calibrate(x, D, B, method="fixed_point", generator=torch.Generator().manual_seed(3))
    u = fedmc.calibrate(x, D, B, method="fixed_point", anchored=False, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, x + (u - pulled), rtol=0, atol=1e-10)
    assert float((a - x).norm(dim=1).mean()) > 0


def test_calibrate_errors(pipeline):
    X, B, gamma, lgds, D = pipeline
    with pytest.raises(ValueError, match="S="):
        fedmc.calibrate(X[:5], D, B[:-1], generator=None)
    with pytest.raises(ValueError, match="formulation='paper'"):
        fedmc.calibrate(X[:5], D, B, formulation="paper", method="coordinates", generator=None)
    with pytest.raises(ValueError, match="method"):
        fedmc.calibrate(X[:5], D, B, method="newton", generator=None)
    with pytest.raises(ValueError, match="scale"):
        fedmc.calibrate(X[:5], D, B, scale=-1.0, generator=None)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        fedmc.calibrate(X[:5], D, B, generator=0)


def test_auto_components_by_explained_variance(pipeline):
    X, B, gamma, lgds, D = pipeline
    lo = fedmc.local_geometry(X[:500], B, n_clusters=3, n_components="auto", explained=0.5, gamma=gamma,
                              clip_norm=100.0, generator=torch.Generator().manual_seed(0))
    hi = fedmc.local_geometry(X[:500], B, n_clusters=3, n_components="auto", explained=0.95, gamma=gamma,
                              clip_norm=100.0, generator=torch.Generator().manual_seed(0))
    assert 1 <= lo.variances.shape[1] < hi.variances.shape[1] <= 16


def test_serialisation_round_trips_bit_exactly(tmp_path, pipeline):
    """The containers' own save/load (geomkern.exchange) is the one serialisation: a GAB goes as
    GAB(B) and comes back as GAB.load(path).basis."""
    X, B, gamma, lgds, D = pipeline
    released = fedmc.PrototypeRelease(*fedmc.client_prototypes(X[:100], 4, epsilon=math.inf,
                                                               generator=torch.Generator().manual_seed(0)))
    for obj in (fedmc.GAB(B), released, lgds[0], D):
        path = tmp_path / f"{obj._KIND}.safetensors"
        obj.save(path)
        back = type(obj).load(path)
        assert type(back) is type(obj)
        for name, v in obj.to_dict().items():  # tensors bit-exact, numbers (gamma, epsilon=inf) equal
            w = getattr(back, name)
            assert torch.equal(w, v) if isinstance(v, torch.Tensor) else w == v, name
    assert torch.equal(fedmc.GAB.load(tmp_path / "gab.safetensors").basis, B)
    assert fedmc.LocalGeometry.load(tmp_path / "local_geometry.safetensors").gamma == lgds[0].gamma


def test_serialisation_rejects_bad_files(tmp_path, pipeline):
    X, B, gamma, lgds, D = pipeline
    good = tmp_path / "d.safetensors"
    D.save(good)
    raw = good.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="not a readable safetensors"):
        GeometryDictionary.load(tmp_path / "trunc.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError):
        GeometryDictionary.load(tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="expected a local_geometry"):
        LocalGeometry.load(good)
    with pytest.raises(ValueError, match="does not exist"):
        GeometryDictionary.load(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    # a dictionary whose variances disagree with its betas in d
    meta = {"format": "geomkern.fedmc", "version": "1", "kind": "geometry_dictionary",
            "scalars": '{"gamma": 0.5}'}
    t = {k: v.clone() for k, v in D.to_dict().items() if isinstance(v, torch.Tensor)}
    t["variances"] = t["variances"][:, :1].contiguous()
    save_file(t, str(tmp_path / "shape.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="variances"):
        GeometryDictionary.load(tmp_path / "shape.safetensors")
    t = {k: v.clone() for k, v in D.to_dict().items() if isinstance(v, torch.Tensor)}
    t["betas"][0, 0, 0] = float("nan")
    save_file(t, str(tmp_path / "nan.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="NaN"):
        GeometryDictionary.load(tmp_path / "nan.safetensors")
    save_file({"basis": B.clone()}, str(tmp_path / "nometa.safetensors"))
    with pytest.raises(ValueError, match="not a geomkern.fedmc file"):
        fedmc.GAB.load(tmp_path / "nometa.safetensors")


def test_build_gab_and_gamma(pipeline):
    X, B, gamma, lgds, D = pipeline
    assert B.shape == (32, 8)
    assert gamma == pytest.approx(gk.median_gamma(B))
    assert fedmc.resolve_gamma("1/D", B) == pytest.approx(1 / 8)
    with pytest.raises(ValueError, match="n_base"):
        fedmc.build_gab([B[:3]], 5)


# ------------------------------------------------------------------ prepared dictionary, ridge, knobs

def test_prepared_dictionary_is_built_once_and_changes_nothing(pipeline, monkeypatch):
    """fedmc.prepare computes the GAB Gram's factor and the coefficient maps once; calibrate with
    it gives what the one-shot call gives, and builds neither again."""
    from geomkern.fedmc import calibration
    from geomkern.ops import preimage as pre

    X, B, gamma, lgds, D = pipeline
    x = X[::40]
    prep = fedmc.prepare(D, B)
    assert prep.factor.dtype == torch.float64 and prep.factor.shape == (B.shape[0],) * 2
    assert prep.coefficients.shape == D.betas.shape and prep.captured.shape == D.variances.shape
    for method in fedmc.PREIMAGE_METHODS:
        a = fedmc.calibrate(x, D, B, method=method, generator=torch.Generator().manual_seed(1))
        b = fedmc.calibrate(x, prep, method=method, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    calls = {"factor": 0, "gram_BB": 0}
    real_factor, real_gram = pre.fixed_point_factor, calibration.rbf_gram

    def factor(*a, **k):
        calls["factor"] += 1
        return real_factor(*a, **k)

    def gram(X, Y=None, **k):
        calls["gram_BB"] += Y is None or Y.shape[0] == X.shape[0] == B.shape[0]
        return real_gram(X, Y, **k)

    monkeypatch.setattr(pre, "fixed_point_factor", factor)
    monkeypatch.setattr(calibration, "fixed_point_factor", factor)
    monkeypatch.setattr(calibration, "rbf_gram", gram)
    for _ in range(3):
        fedmc.calibrate(x, prep, method="fixed_point", generator=None)
        fedmc.calibrate(x, prep, formulation="paper", method="fixed_point", generator=None)
    assert calls == {"factor": 0, "gram_BB": 0}
    fedmc.calibrate(x, D, B, generator=None)  # a plain dictionary is prepared on the fly
    assert calls["factor"] == 1


def test_prepared_dictionary_errors(pipeline):
    X, B, gamma, lgds, D = pipeline
    prep = fedmc.prepare(D, B, ridge=1e-2)
    with pytest.raises(ValueError, match="ridge=0.001 differs"):
        fedmc.calibrate(X[:5], prep, ridge=1e-3, generator=None)
    with pytest.raises(ValueError, match="B differs"):
        fedmc.calibrate(X[:5], prep, B + 1.0, generator=None)
    torch.testing.assert_close(fedmc.calibrate(X[:5], prep, B, generator=torch.Generator().manual_seed(0)),
                               fedmc.calibrate(X[:5], prep, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="needs the GAB"):
        fedmc.calibrate(X[:5], D, generator=None)
    with pytest.raises(ValueError, match="ridge"):
        fedmc.prepare(D, B, ridge=0.0)
    with pytest.raises(TypeError, match="GeometryDictionary"):
        fedmc.prepare(lgds[0], B)


def test_ridge_reaches_the_fixed_point_solve(pipeline):
    """calibrate's ridge is the rho of the fixed-point expansion too (it used to stop at the
    coefficient maps while the solve kept preimage's own 1e-6)."""
    X, B, gamma, lgds, D = pipeline
    x = X[::40]
    T0 = gk.rbf_gram(x, B, gamma=gamma)
    for ridge in (1e-3, 1e-1):
        # scale 0: the target is k(x, B) whatever the ridge; only the solve sees it
        z = fedmc.calibrate(x, D, B, scale=0.0, method="fixed_point", anchored=False, ridge=ridge, generator=None)
        ref = gk.preimage(x, B, T0, gamma=gamma, method="fixed_point", steps=10, ridge=ridge)
        torch.testing.assert_close(z, ref, rtol=1e-12, atol=1e-12)
    lo = fedmc.calibrate(x, D, B, scale=0.0, method="fixed_point", anchored=False, ridge=1e-3, generator=None)
    assert float((z - lo).norm(dim=1).max()) > 1e-6


def test_removed_knobs_are_gone(pipeline):
    X, B, gamma, lgds, D = pipeline
    # gamma always had to equal the dictionary's; several samples per row = repeated rows
    for knob in (dict(gamma=gamma), dict(n_per_sample=2)):
        with pytest.raises(TypeError, match=next(iter(knob))):
            fedmc.calibrate(X[:5], D, B, generator=None, **knob)
    assert not hasattr(fedmc, "gab_gamma")


def test_generator_none_is_a_fresh_secret_seed_not_the_global_rng(pipeline):
    X, B, gamma, lgds, D = pipeline
    x = X[:20]
    runs = []
    for _ in range(2):
        torch.manual_seed(0)  # the global RNG plays no part
        runs.append(fedmc.calibrate(x, D, B, method="coordinates", generator=None))
    assert not torch.equal(runs[0], runs[1])


# ------------------------------------------------------------------ containers (geomkern.exchange)

def test_the_role_modules_public_names_are_importable_from_fedmc():
    """geomkern.fedmc is a package split by role (client, server, calibration, containers,
    recipe); each module's public names are importable from geomkern.fedmc itself."""
    import importlib
    import pkgutil
    import types

    roles = {m.name for m in pkgutil.iter_modules(fedmc.__path__)}
    assert {"client", "server", "calibration", "containers"} <= roles
    for role in roles:
        mod = importlib.import_module(f"geomkern.fedmc.{role}")
        own = [n for n, v in vars(mod).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)
               and getattr(v, "__module__", mod.__name__) == mod.__name__]
        assert own, role
        for name in own:
            assert name in fedmc.__all__ and getattr(fedmc, name) is getattr(mod, name), f"{role}.{name}"


def test_containers_follow_the_exchange_convention(tmp_path, pipeline):
    from geomkern.exchange import Exchanged, nbytes

    X, B, gamma, lgds, D = pipeline
    for obj in (fedmc.GAB(B), lgds[0], D):
        assert isinstance(obj, Exchanged)
        assert obj.nbytes() == nbytes(*(v for v in obj.to_dict().values() if isinstance(v, torch.Tensor)))
        back = type(obj).from_dict(obj.to_dict())
        path = tmp_path / f"{type(obj).__name__}.safetensors"
        obj.save(path)
        for other in (back, type(obj).load(path)):
            for k, v in obj.to_dict().items():
                w = getattr(other, k)
                assert torch.equal(w, v) if isinstance(v, torch.Tensor) else w == v, k
    # one convention: the containers' methods, no module-level save/load beside them
    assert not hasattr(fedmc, "save") and not hasattr(fedmc, "load")
    D.save(tmp_path / "f.safetensors")
    assert type(fedmc.GeometryDictionary.load(tmp_path / "f.safetensors")) is fedmc.GeometryDictionary
    with pytest.raises(ValueError, match="holds a geometry_dictionary, expected a local_geometry"):
        fedmc.LocalGeometry.load(tmp_path / "f.safetensors")


def test_containers_validate_on_construction(pipeline):
    X, B, gamma, lgds, D = pipeline
    good = lgds[0].to_dict()
    with pytest.raises(ValueError, match="variances has shape"):
        fedmc.LocalGeometry.from_dict({**good, "variances": good["variances"][:, :1]})
    with pytest.raises(ValueError, match="NaN"):
        bad = good["betas"].clone()
        bad[0, 0, 0] = float("nan")
        fedmc.LocalGeometry(**{**good, "betas": bad})
    with pytest.raises(TypeError, match="dtype"):
        fedmc.GeometryDictionary(**{**D.to_dict(), "weights": D.weights.float()})
    with pytest.raises(ValueError, match="gamma"):
        fedmc.GeometryDictionary(**{**D.to_dict(), "gamma": -1.0})
    with pytest.raises(ValueError, match="missing \\['betas'\\]"):
        fedmc.GeometryDictionary.from_dict({k: v for k, v in D.to_dict().items() if k != "betas"})
    with pytest.raises(ValueError, match="rank 2"):
        fedmc.GAB(B[0])


# ------------------------------------------------------------------ the set-up recipe

def test_setup_recipe_sizing_and_privacy(pipeline):
    """fedmc.setup: the one recipe. Client k releases min(n_prototypes, n_k) prototypes and cuts
    max(1, min(n_clusters, n_k // 2d)) patches; S = min(n_base, all prototypes); L <= n_entries;
    epsilon is both releases composed."""
    from geomkern import privacy

    X, B, gamma, lgds, D = pipeline
    clients = [X[:400], X[400:430], X[430:436]]  # a large, a small and a tiny client
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    res = fedmc.setup(clients, generators=gens, n_prototypes=16, n_base=100, n_clusters=5, n_components=2,
                      n_entries=6, epsilon=4.0, clip_norm=100.0, seed=0)
    assert [p.centers.shape[0] for p in res.prototypes] == [16, 16, 6]
    assert res.basis.shape == (38, X.shape[1])  # fewer prototypes than n_base: all of them
    assert [l.centers.shape[0] for l in res.lgds] == [5, 5, 1]  # 30 // 4 = 7 -> 5; 6 // 4 = 1
    assert res.dictionary.betas.shape[0] <= 6 and res.gamma == pytest.approx(gk.median_gamma(res.basis))
    z = privacy.noise_multiplier(4.0, 1e-5, releases=5)
    total = privacy.compose_epsilon([(z, 5), (z, 5)], 1e-5)
    assert res.epsilon == [total] * 3
    assert max(res.prototypes[0].epsilon, res.lgds[0].epsilon) < total <= 8.0
    # the same generators give the same set-up; the recipe is what the steps give one by one
    again = fedmc.setup(clients, generators=[torch.Generator().manual_seed(i) for i in range(3)], n_prototypes=16,
                        n_base=100, n_clusters=5, n_components=2, n_entries=6, epsilon=4.0, clip_norm=100.0, seed=0)
    assert torch.equal(again.basis, res.basis) and torch.equal(again.dictionary.betas, res.dictionary.betas)
    with pytest.raises(ValueError, match="one entry per client"):
        fedmc.setup(clients, generators=gens[:2], n_prototypes=16, n_base=100, n_clusters=5, n_components=2,
                    n_entries=6)


def test_generator_defaults_to_none_everywhere_in_fedmc(pipeline):
    """generator may be left out: it then means None, the package rule (a fresh secret seed)."""
    import inspect

    for fn in (fedmc.client_prototypes, fedmc.local_geometry, fedmc.targets, fedmc.calibrate):
        assert inspect.signature(fn).parameters["generator"].default is None, fn.__name__
    X, B, gamma, lgds, D = pipeline
    runs = []
    for _ in range(2):
        torch.manual_seed(0)  # the global RNG plays no part
        runs.append(fedmc.calibrate(X[:20], D, B, method="coordinates"))
    assert not torch.equal(runs[0], runs[1])
    T, T0 = fedmc.targets(X[:20], D, B)
    assert T.shape == T0.shape == (20, B.shape[0])
    assert fedmc.client_prototypes(X[:100], 4, epsilon=math.inf).centers.shape == (4, X.shape[1])


def test_client_prototypes_needs_delta_only_at_finite_epsilon(pipeline):
    X = pipeline[0][:200]
    protos = fedmc.client_prototypes(X, 5, epsilon=math.inf, generator=torch.Generator().manual_seed(3))
    assert protos.epsilon == math.inf and protos.delta == 0.0  # no noise: nothing spent
    given = fedmc.client_prototypes(X, 5, epsilon=math.inf, delta=1e-5, generator=torch.Generator().manual_seed(3))
    assert given.delta == 1e-5 and torch.equal(given.centers, protos.centers)
    assert fedmc.PrototypeRelease(*protos).delta == 0.0  # what goes over the wire accepts it
    with pytest.raises(ValueError, match="delta must lie in"):  # a given delta is still checked
        fedmc.client_prototypes(X, 5, epsilon=math.inf, delta=2.0)
    with pytest.raises(ValueError, match=r"delta is required with a finite epsilon \(4\)"):
        fedmc.client_prototypes(X, 5, epsilon=4.0, clip_norm=100.0)
    with pytest.raises(ValueError, match="delta is required"):
        fedmc.local_geometry(X, pipeline[1], n_clusters=2, n_components=2, gamma=pipeline[2], epsilon=4.0,
                             delta=None, clip_norm=100.0)
    dp = fedmc.client_prototypes(X, 5, epsilon=4.0, delta=1e-5, clip_norm=100.0)
    assert math.isfinite(dp.epsilon) and dp.delta == 1e-5


def test_setup_gab_reads_as_basis_and_as_B(pipeline):
    X, B, gamma, lgds, D = pipeline
    res = fedmc.Setup(basis=B, gamma=gamma, prototypes=[], lgds=lgds, dictionary=D, epsilon=[], delta=1e-5)
    assert res.B is res.basis is B
    with pytest.raises(AttributeError):
        res.B = B  # read-only: one field, two names
