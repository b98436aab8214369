"""Issue 44 item 2: a hostile-input harness over geomkern's scikit-learn estimators (KernelPCA,
KMeans, BatchedKernelPCA, BatchedKMeans), beyond scikit-learn's check_estimator: X as strings,
sparse, objects, complex, 1-D or 3-D, empty, one sample, with NaN / inf / overflowing values; the
parameters zero, negative, fractional, strings, huge; groups of the wrong length, mixed kinds, one
row per group.

Each case is valid or not by the rules below (written here, not read from geomkern). A valid case
must give a correct result, checked in float64: KernelPCA's training scores have column norms^2
equal to the top eigenvalues of the centred RBF Gram (sign- and tie-free); KMeans' labels are the
nearest centres, predict repeats them and inertia_ is their squared distances' sum. An invalid
case must raise ValueError or TypeError naming the bad argument (for X: "X" or scikit-learn's own
wording for the array's fault). Derandomized hypothesis (tests/conftest.py); ``--runslow``: 10x."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("sklearn")

from geomkern.sklearn import BatchedKernelPCA, BatchedKMeans, KernelPCA, KMeans  # noqa: E402

# scikit-learn's messages for a bad X (check_array): they name the array's fault, not always "X"
X_WORDS = ("X", "array", "sample", "dim", "Complex", "convert string", "Sparse", "sparse")
ROOT = Path(__file__).resolve().parents[2]
ESTIMATOR_CASES, GROUP_CASES = 80, 30  # per default run; ten times as many with --runslow
OVERFLOW = 1e200  # squared distances of such rows overflow float64: geomkern refuses them by name


@st.composite
def inputs(draw):
    n, D = draw(st.integers(1, 12)), draw(st.integers(1, 4))
    X = np.array(draw(st.lists(st.lists(st.floats(-100, 100), min_size=D, max_size=D), min_size=n, max_size=n)))
    bad_x = None
    form = draw(st.sampled_from(["dense"] * 2 + ["float32", "int", "bool", "list", "object", "strings", "sparse",
                                                 "complex", "1d", "3d", "empty", "nan", "inf", "huge"]))
    if form == "float32":
        X = X.astype(np.float32)
    elif form == "int":
        X = np.round(X).astype(np.int64)
    elif form == "bool":
        X = X > 0
    elif form == "list":
        X = X.tolist()
    elif form == "object":
        X = X.astype(object)
    elif form == "strings":
        X, bad_x = np.char.add("v", X.astype(str)), form  # numeric strings scikit-learn converts; these not
    elif form == "sparse":
        X, bad_x = sp.csr_matrix(X), form
    elif form == "complex":
        X, bad_x = X + 1j, form
    elif form == "1d":
        X, bad_x = X[:, 0], form
    elif form == "3d":
        X, bad_x = X[None], form
    elif form == "empty":
        X, bad_x = X[:0], form
    elif form in ("nan", "inf", "huge"):
        X = X.copy()
        X[draw(st.integers(0, n - 1)), draw(st.integers(0, D - 1))] = {"nan": np.nan, "inf": -np.inf,
                                                                       "huge": OVERFLOW}[form]
        bad_x = form
    return X, n, bad_x


def _count(draw, n: int):
    """(value, why it is bad or None) of n_components / n_clusters for n rows."""
    v = draw(st.one_of(st.integers(1, 4), st.sampled_from([0, -1, 10 ** 9, 2.5, "2", None, 2.0, True])))
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        return v, "type"
    return v, ("size" if v > n else None)


@st.composite
def cases(draw):
    X, n, bad_x = draw(inputs())
    est = draw(st.sampled_from(["kpca", "kmeans"]))
    bad = []
    if bad_x:
        bad.append("X")
    k, why = _count(draw, n)
    name = "n_components" if est == "kpca" else "n_clusters"
    if why:
        bad.append(name)
    params = {name: k}
    if est == "kpca":
        gamma = draw(st.sampled_from([None, None, 0.5, 2.0, -1.0, 0.0, float("nan"), float("inf"), "x"]))
        params["gamma"] = gamma
        if gamma is not None and (isinstance(gamma, str) or not 0 < gamma < float("inf")):
            bad.append("gamma")
        if gamma is None and not bad_x:  # the median heuristic needs two rows, most of them apart
            Xd = _dense64(X)
            d2 = ((Xd[:, None] - Xd[None]) ** 2).sum(-1)[np.triu_indices(n, 1)]
            zeros = int((d2 == 0).sum())
            if 2 * zeros == len(d2) and n > 1:  # exactly half coincide: the median's definition decides
                params["gamma"] = 0.5
            elif n < 2 or 2 * zeros > len(d2):
                bad.append("gamma")
    else:
        params["random_state"] = 0
        n_init = draw(st.sampled_from([1, 2, 0, -1]))
        params["n_init"] = n_init
        if n_init < 1:
            bad.append("n_init")
    return est, X, params, bad


def _dense64(X) -> np.ndarray:
    return np.asarray(X, dtype=np.float64)


def _check_kpca(Z, X, est, k):
    X = _dense64(X)
    sq = (X * X).sum(1)
    K = np.exp(-est.gamma_ * np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0))
    n = len(X)
    J = np.eye(n) - 1.0 / n
    mu = np.clip(np.linalg.eigvalsh(J @ K @ J)[::-1][:k], 0, None)
    got = (np.asarray(Z, dtype=np.float64) ** 2).sum(0)
    # the distances' rounding: |d^2 error| <~ 16 eps max|x|^2, each K entry off by gamma times it, the
    # eigenvalues by n times that (vacuous where gamma eps max|x|^2 nears 1; median_gamma now refuses
    # such a gamma: see the test below)
    eps = np.finfo(np.asarray(Z).dtype).eps
    cond = n * est.gamma_ * 16 * eps * max(sq.max(), 1e-300)
    tol = (1e-4 * max(1.0, mu.max(initial=0.0)) if np.asarray(Z).dtype == np.float32 else 1e-8 * max(1.0, n)) + cond
    assert Z.shape == (n, k) and np.isfinite(Z).all()
    assert np.allclose(got, mu, atol=tol, rtol=1e-5 if Z.dtype == np.float32 else 1e-7), f"{got} vs {mu}"


def _check_kmeans(est, X, k):
    X = _dense64(X)
    C = np.asarray(est.cluster_centers_, dtype=np.float64)
    labels = np.asarray(est.labels_)
    assert C.shape == (k, X.shape[1]) and labels.shape == (len(X),) and ((labels >= 0) & (labels < k)).all()
    d2 = ((X[:, None, :] - C[None]) ** 2).sum(-1)
    mine = d2[np.arange(len(X)), labels]
    assert (mine <= d2.min(1) + 1e-4 * (1 + d2.max())).all(), "a label is not its row's nearest centre"
    assert np.isclose(est.inertia_, mine.sum(), rtol=1e-4, atol=1e-6), f"inertia_ {est.inertia_} vs {mine.sum()}"
    assert (np.asarray(est.predict(X)) == labels).all() or np.allclose(
        d2[np.arange(len(X)), est.predict(X)], mine, rtol=1e-5, atol=1e-9)  # ties may pick another equal centre


def _run(case):
    est_name, X, params, bad = case
    cls = KernelPCA if est_name == "kpca" else KMeans
    est = cls(**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            Z = est.fit_transform(X)
        except (ValueError, TypeError) as exc:
            assert bad, f"{cls.__name__}({params}) refused a valid X {np.shape(X)}: {exc}"
            msg = str(exc)
            words = {b: (X_WORDS if b == "X" else (b,)) for b in bad}
            assert any(w in msg for ws in words.values() for w in ws), f"refusal names none of {bad}: {msg}"
            return
    assert not bad, f"{cls.__name__}({params}) accepted what it must refuse ({bad}) on X {np.shape(X)}"
    k = params["n_components" if est_name == "kpca" else "n_clusters"]
    if est_name == "kpca":
        _check_kpca(Z, X, est, k)
    else:
        _check_kmeans(est, X, k)


@given(case=cases())
@settings(max_examples=ESTIMATOR_CASES)
def test_an_estimator_gives_a_correct_result_or_a_named_refusal(case):
    _run(case)


@pytest.mark.slow
@given(case=cases())
@settings(max_examples=10 * ESTIMATOR_CASES)
def test_an_estimator_deep(case):
    _run(case)


@given(data=st.data())
@settings(max_examples=GROUP_CASES)
def test_batched_estimators_refuse_bad_groups_by_name_and_match_one_group(data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    n = data.draw(st.integers(4, 12))
    X = rng.normal(size=(n, 3))
    form = data.draw(st.sampled_from(["one", "two", "short", "mixed", "singleton", "none"]))
    groups = {"one": np.zeros(n, int), "two": np.arange(n) % 2, "short": np.zeros(n - 1, int),
              "mixed": np.array(["a"] + [1] * (n - 1), dtype=object),
              "singleton": np.array([0] * (n - 1) + [1]), "none": None}[form]
    for Batched, Plain, key in ((BatchedKernelPCA, KernelPCA, "n_components"), (BatchedKMeans, KMeans, "n_clusters")):
        params = {key: 2, **({"random_state": 0} if Batched is BatchedKMeans else {"gamma": 0.5})}
        if form in ("short", "mixed", "singleton"):
            with pytest.raises(ValueError, match="groups|group 1"):
                Batched(**params).fit_transform(X, groups=groups)
            continue
        Z = Batched(**params).fit_transform(X, groups=groups)
        if form in ("one", "none"):  # one group: the plain estimator's result
            assert np.allclose(Z, Plain(**params).fit_transform(X), atol=1e-9)
        else:
            for g in (0, 1):
                rows = groups == g
                ref = Plain(**params).fit(X[rows])
                if Batched is BatchedKernelPCA:
                    assert np.allclose((Z[rows] ** 2).sum(0), (ref.transform(X[rows]) ** 2).sum(0), atol=1e-8)
                else:
                    assert Z.shape == (n, 2)


def test_the_median_heuristic_never_picks_a_gamma_the_gram_cannot_resolve():
    # harness finding, fixed in geomkern/ops/rbf.py's median_gamma: this X took gamma 7e17 and the
    # result was 1.6 for 1.52, with no error
    X = np.array([[0.0], [0.0], [0.0], [1.0], [1.16052338e-09]])
    est = KernelPCA(n_components=1)
    try:
        Z = est.fit_transform(X)
    except ValueError as exc:  # a refusal naming gamma is a correct ending too
        assert "gamma" in str(exc) and "resolves" in str(exc)
        return
    sq = (X * X).sum(1)
    K = np.exp(-est.gamma_ * np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0))
    J = np.eye(5) - 0.2
    assert np.isclose((Z ** 2).sum(), np.linalg.eigvalsh(J @ K @ J)[-1], rtol=1e-6)  # 1.6 vs 1.5159


def _reliability_row(surface: str) -> str:
    """The row of docs/reliability.md's harness table for ``surface``: its counts are this file's."""
    rows = [ln for ln in (ROOT / "docs" / "reliability.md").read_text().splitlines() if ln.startswith(f"| {surface} |")]
    assert len(rows) == 1, f"docs/reliability.md has {len(rows)} rows for {surface!r}"
    return rows[0]


def test_the_reliability_page_states_these_cases():
    assert (f"| {ESTIMATOR_CASES} estimator cases + {GROUP_CASES} group cases |"
            in _reliability_row("scikit-learn estimators"))
    ops = int(re.search(r"^EXAMPLES = (\d+)", (ROOT / "tests/geomkern/test_hostile_ops.py").read_text(), re.M)[1])
    assert f"| {ops} per op |" in _reliability_row("geomkern ops")
