"""The registered operators refuse what their public functions refuse, with the same words
(issue 44, item 1).

One table of bad inputs per ``torch.ops.geomkern.*`` operator; each case is a change to a good
call. Every case is refused by the public function and by the operator with the same exception
type and message, and a case that needs no tensor values (a name, a count, a rank, a dtype, a
device, a shape) is refused by the operator's fake implementation too, under fake tensors, as
torch.compile meets it while it traces. The ops are read from torch's registry at collection, so
a new operator without a table fails here. The checks themselves live once per op family
(``_check`` functions in geomkern/ops/<family>.py, over geomkern/_validate.py; geomkern/_library.py
runs them).
"""
from __future__ import annotations

import math
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import geomkern as gk
from _operator_specs import B, FIT, HUGE, OFF, PROJ, SPECS, Spec, T, X, Z0, with_value as _with

REGISTERED = sorted({n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                     if n.startswith("geomkern::")})

V, M = ValueError, TypeError
META, VALUES = True, False  # whether the fake refuses it too (no tensor values needed)
FP8 = r"precision='fp8' is not supported; choose one of \('tf32x3', 'ieee', 'tf32'\)"
GAMMA = r"gamma must be a finite number > 0"
WORK = r"multiply-adds, more than 9\.22e\+18 \(2\^63 - 1"

# (op, id, changes to the good call, exception, message pattern, META/VALUES)
CASES = [
    ("rbf_gram", "precision-fp8", dict(precision="fp8"), V, FP8, META),
    ("rbf_gram", "gamma-0", dict(gamma=0.0), V, GAMMA, META),
    ("rbf_gram", "gamma-negative", dict(gamma=-1.0), V, GAMMA, META),
    ("rbf_gram", "gamma-nan", dict(gamma=math.nan), V, GAMMA, META),
    ("rbf_gram", "gamma-inf", dict(gamma=math.inf), V, GAMMA, META),
    ("rbf_gram", "X-rank-1", dict(X=X[0]), V, r"X must have rank 2, got shape \(3,\)", META),
    ("rbf_gram", "X-int", dict(X=X.long()), M, r"X has dtype int64; expected one of", META),
    ("rbf_gram", "X-empty", dict(X=X[:0]), V, r"X is empty \(shape \(0, 3\)\)", META),
    ("rbf_gram", "Y-other-D", dict(Y=X[:, :2]), V, r"feature dimension mismatch: X has D=3 but Y has D=2", META),
    ("rbf_gram", "Y-other-dtype", dict(Y=B.float()), M, r"Y has dtype torch.float32 but X has torch.float64", META),
    ("rbf_gram", "Y-other-device", dict(Y=torch.empty(5, 3, dtype=torch.float64, device="meta")), V,
     r"Y is on meta but X is on cpu", META),
    ("rbf_gram", "center-with-Y", dict(Y=B, center=True), V, r"center=True double-centres a square Gram", META),
    ("rbf_gram", "X-requires-grad", dict(X=X.clone().requires_grad_()), V, r"X requires grad", META),
    ("rbf_gram", "X-nan", dict(X=_with(X, (3, 1), math.nan)), V, r"X contains 1 NaN/Inf value", VALUES),
    ("rbf_gram", "Y-inf", dict(Y=_with(B, (0, 0), math.inf)), V, r"Y contains 1 NaN/Inf value", VALUES),
    ("rbf_gram", "X-overflowing", dict(X=_with(X, (0, 0), 1e200)), V, r"X has values up to 1e\+200", VALUES),

    ("rbf_matmul", "precision-fp8", dict(precision="fp8"), V, FP8, META),
    ("rbf_matmul", "gamma-inf", dict(gamma=math.inf), V, GAMMA, META),
    ("rbf_matmul", "V-rows", dict(V=X[:, :2].contiguous()), V, r"V must have one row per row of Y \(5\)", META),
    ("rbf_matmul", "V-half", dict(V=B[:, :2].half()), M, r"V has dtype float16; expected one of float32, float64",
     META),
    ("rbf_matmul", "X-rank-3", dict(X=X[None]), V, r"X must have rank 2", META),
    ("rbf_matmul", "Y-other-D", dict(Y=B[:, :2]), V, r"feature dimension mismatch: X has D=3 but Y has D=2", META),
    ("rbf_matmul", "V-other-dtype", dict(V=B[:, :2].float()), M, r"V has dtype torch.float32 but X has", META),
    ("rbf_matmul", "Y-empty", dict(Y=B[:0], V=B[:0, :2]), V, r"Y is empty", META),
    ("rbf_matmul", "V-nan", dict(V=_with(B[:, :2], (1, 1), math.nan)), V, r"V contains 1 NaN/Inf", VALUES),

    ("kmeans", "n_init-0", dict(n_init=0), V, r"n_init must be >= 1, got 0", META),
    ("kmeans", "k-0", dict(k=0), V, r"k must be >= 1, got 0", META),
    ("kmeans", "k-above-N", dict(k=13), V, r"k=13 is larger than the number of points \(X has 12\); lower k", META),
    ("kmeans", "k-above-segment", dict(k=5, offsets=torch.tensor([0, 4, 12])), V,
     r"k=5 is larger than the number of points \(segment 0 has 4\)", VALUES),
    ("kmeans", "iters-negative", dict(iters=-1), V, r"iters must be >= 0, got -1", META),
    ("kmeans", "seed-negative", dict(seed=-1), V, r"seed must be >= 0, got -1", META),
    ("kmeans", "precision-fp8", dict(precision="fp8"), V, FP8, META),
    ("kmeans", "iters-beyond-any-run", dict(iters=HUGE), V, r"kmeans with k=2, iters=4611686018427387904.*" + WORK,
     META),
    ("kmeans", "n_init-beyond-any-run", dict(n_init=HUGE), V, r"lower iters or n_init", META),
    ("kmeans", "offsets-int32", dict(offsets=OFF.int()), M, r"offsets must have dtype int64", META),
    ("kmeans", "offsets-2d", dict(offsets=OFF[None]), V, r"offsets must be 1-D with m\+1 >= 2 entries", META),
    ("kmeans", "offsets-decreasing", dict(offsets=torch.tensor([0, 8, 4, 12])), V,
     r"offsets must be non-decreasing", VALUES),
    ("kmeans", "offsets-short", dict(offsets=torch.tensor([0, 6, 11])), V,
     r"offsets\[-1\] must equal the number of rows of X \(12\)", VALUES),
    ("kmeans", "X-half", dict(X=X.half()), M, r"X has dtype float16", META),
    ("kmeans", "X-nan", dict(X=_with(X, (0, 2), math.nan)), V, r"X contains 1 NaN/Inf", VALUES),

    ("kpca_transform", "gamma-not-fitted", dict(gamma=0.4), V,
     r"gamma=0.4 but fit was computed with gamma=0.5", META),
    ("kpca_transform", "gamma-0", dict(gamma=0.0), V, GAMMA, META),
    ("kpca_transform", "segment-int-out-of-range", dict(segment=2), V, r"segment ids must lie in \[0, 2\), got \[2, 2\]",
     META),
    ("kpca_transform", "segment-tensor-out-of-range", dict(segment=torch.tensor([0, 1, 2, 0, 1])), V,
     r"segment ids must lie in \[0, 2\), got \[0, 2\]", VALUES),
    ("kpca_transform", "segment-int32", dict(segment=torch.zeros(5, dtype=torch.int32)), V,
     r"segment must be an int or an int64 tensor of shape \(5,\)", META),
    ("kpca_transform", "segment-missing", dict(segment=None), V, r"segment is required: fit has 2 clusters", META),
    ("kpca_transform", "Z-other-D", dict(Z=B[:, :2]), V, r"feature dimension mismatch: Z has D=2 but X has D=3", META),
    ("kpca_transform", "Z-other-dtype", dict(Z=B.float()), M, r"X has dtype torch.float64 but Z has torch.float32",
     META),
    ("kpca_transform", "Z-int", dict(Z=B.long()), M, r"Z has dtype int64", META),
    ("kpca_transform", "X-not-fitted-rows", dict(X=X[:11]), V, r"X has 11 rows but fit was computed on 12", META),
    ("kpca_transform", "X-not-fitted-values", dict(X=X + 1.0), V, r"X differs from the X that gk.kpca was fitted on",
     VALUES),
    ("kpca_transform", "Z-nan", dict(Z=_with(B, (2, 0), math.nan)), V, r"Z contains 1 NaN/Inf", VALUES),

    ("preimage", "method-magic", dict(method="magic"), V,
     r"method='magic' is not supported; choose one of \('gd', 'fixed_point', 'coordinates'\)", META),
    ("preimage", "precision-fp8", dict(precision="fp8"), V, FP8, META),
    ("preimage", "steps-negative", dict(steps=-1), V, r"steps must be >= 0, got -1", META),
    ("preimage", "steps-beyond-any-run", dict(steps=HUGE), V, r"preimage with steps=4611686018427387904.*" + WORK,
     META),
    ("preimage", "gamma-0", dict(gamma=0.0), V, GAMMA, META),
    ("preimage", "lr-negative", dict(lr=-1.0), V, r"lr must be a finite number > 0, got -1.0", META),
    ("preimage", "lr-nan", dict(lr=math.nan), V, r"lr must be a finite number > 0, got nan", META),
    ("preimage", "lr-without-gd", dict(method="fixed_point", lr=0.1), V, r"lr is only used by method='gd'", META),
    ("preimage", "factor-without-fixed_point", dict(factor=torch.eye(5, dtype=torch.float64)), V,
     r"factor is only used by method='fixed_point', not 'gd'", META),
    ("preimage", "proj-without-coordinates", dict(proj=PROJ), V, r"proj is only used by method='coordinates'", META),
    ("preimage", "coordinates-without-proj", dict(method="coordinates", targets=T[:, :2].contiguous()), V,
     r"method='coordinates' needs proj", META),
    ("preimage", "proj-shape", dict(method="coordinates", targets=T[:, :2].contiguous(), proj=PROJ[:, :4]), V,
     r"proj must have shape \(2, 5\) or \(4, 2, 5\)", META),
    ("preimage", "targets-width", dict(targets=T[:, :4]), V, r"targets must have one column per basis point \(S=5\)",
     META),
    ("preimage", "targets-rows", dict(targets=T[:3]), V, r"targets must have one row per row of Z0 \(4\)", META),
    ("preimage", "Z0-other-D", dict(Z0=Z0[:, :2]), V, r"feature dimension mismatch: Z0 has D=2 but B has D=3", META),
    ("preimage", "B-other-device", dict(B=torch.empty(5, 3, dtype=torch.float64, device="meta")), V,
     r"B is on meta but Z0 is on cpu", META),
    ("preimage", "ridge-0", dict(method="fixed_point", ridge=0.0), V, r"ridge must be a finite number > 0, got 0.0",
     META),
    ("preimage", "factor-shape", dict(method="fixed_point", factor=torch.eye(4, dtype=torch.float64)), V,
     r"factor must be the float64 \(5, 5\) Cholesky factor", META),
    ("preimage", "factor-float32", dict(method="fixed_point", factor=torch.eye(5)), V,
     r"factor must be the float64 \(5, 5\) Cholesky factor", META),
    ("preimage", "lr-tensor-shape", dict(lr=torch.full((3,), 0.1, dtype=torch.float64)), V,
     r"lr must be a scalar or have shape \(4,\), got \(3,\)", META),
    ("preimage", "lr-tensor-negative", dict(lr=torch.tensor(-0.1, dtype=torch.float64)), V, r"lr must be > 0",
     VALUES),
    ("preimage", "lr-tensor-inf", dict(lr=torch.full((4,), math.inf, dtype=torch.float64)), V,
     r"lr contains 4 NaN/Inf", VALUES),
    ("preimage", "Z0-nan", dict(Z0=_with(Z0, (0, 0), math.nan)), V, r"Z0 contains 1 NaN/Inf", VALUES),
    ("preimage", "B-inf", dict(B=_with(B, (4, 2), -math.inf)), V, r"B contains 1 NaN/Inf", VALUES),
    ("preimage", "targets-overflowing", dict(targets=_with(T, (1, 1), 1e200)), V, r"targets has values up to 1e\+200",
     VALUES),
]


def _call(spec: Spec, changes: dict):
    kw = {**spec.good, **changes}
    return kw, (lambda: spec.public(kw)), spec.operator_args(kw)


def _refusal(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def test_every_registered_operator_has_a_table():
    """A new ``torch.ops.geomkern`` operator fails here until its bad inputs are tabled."""
    assert set(REGISTERED) == set(SPECS), "operators without a table (or tables without an operator)"
    assert {op for op, *_ in CASES} == set(SPECS)


@pytest.mark.parametrize("name", REGISTERED)
def test_good_call_agrees(name):
    """The table's good call runs through both and gives the same bits (the tables start from a
    call that is not refused)."""
    spec = SPECS[name]
    kw, public, args = _call(spec, {})
    out = public()
    out = list(out) if isinstance(out, tuple) else [out]
    got = getattr(torch.ops.geomkern, name)(*args)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    if name == "kmeans":  # the public function drops the segment axis without offsets
        got = [got[0], got[1][0]]
    for a, b in zip(out, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name,changes,exc,pattern,meta",
                         [pytest.param(op, ch, e, p, m, id=f"{op}-{cid}") for op, cid, ch, e, p, m in CASES])
def test_operator_refuses_as_the_function_does(name, changes, exc, pattern, meta):
    spec = SPECS[name]
    _, public, args = _call(spec, changes)
    by_function = _refusal(public)
    by_operator = _refusal(lambda: getattr(torch.ops.geomkern, name)(*args))
    assert type(by_function) is exc, f"the function raised {type(by_function).__name__}: {by_function}"
    assert type(by_operator) is exc, f"the operator raised {type(by_operator).__name__}: {by_operator}"
    assert str(by_operator) == str(by_function)
    assert re.search(pattern, str(by_function)), str(by_function)
    if meta:  # refused before any value is read: the fake implementation refuses it too
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            by_fake = _refusal(lambda: getattr(torch.ops.geomkern, name)(*fake_args))
        assert type(by_fake) is exc and str(by_fake) == str(by_function)


def test_the_issue_calls_are_refused_as_the_python_api_refuses_them():
    """The three operator calls of issue 44, word for word, against the public calls it names."""
    pairs = [
        (lambda: torch.ops.geomkern.rbf_gram(X, None, 0.5, False, "fp8"),
         lambda: gk.rbf_gram(X, gamma=0.5, precision="fp8")),
        (lambda: torch.ops.geomkern.kmeans(X, 3, None, 10, 0, 0, "tf32x3"),
         lambda: gk.kmeans(X, 2, n_init=0)),
        (lambda: torch.ops.geomkern.preimage(Z0, B, T, 0.5, "magic", 10, None, None, None, 0.0, None, False,
                                             "tf32x3"),
         lambda: gk.preimage(Z0, B, T, gamma=0.5, method="magic")),
    ]
    for operator, function in pairs:
        a, b = _refusal(operator), _refusal(function)
        assert type(a) is ValueError and type(b) is ValueError
        assert str(a) == str(b)


def test_compiled_call_refuses_a_bad_name_while_tracing():
    """Under torch.compile(fullgraph=True) the fake runs the same check: a bad precision stops
    the trace with the function's message (torch wraps it in its own error type)."""
    expected = str(_refusal(lambda: gk.rbf_gram(X, gamma=0.5, precision="fp8")))
    f = torch.compile(lambda X: gk.rbf_gram(X, gamma=0.5, precision="fp8"), fullgraph=True)
    assert expected in str(_refusal(lambda: f(X)))


_TRITON_TABLED = ("rbf_gram", "rbf_matmul")  # the triton operators with a public op of the same schema


@pytest.mark.parametrize("name,changes,exc,pattern",
                         [pytest.param(op, ch, e, p, id=f"{op}-{cid}") for op, cid, ch, e, p, m in CASES
                          if op in _TRITON_TABLED and m])
def test_triton_operator_refuses_as_the_function_does(name, changes, exc, pattern):
    """torch.ops.geomkern_triton.rbf_gram / rbf_matmul take the public op's arguments: each bad call
    that needs no values read is refused with the public function's exception and words, before a
    launch (so on any device; issue 44: they checked only the precision)."""
    pytest.importorskip("triton")
    import geomkern.backends.triton.operators  # noqa: F401  (registers torch.ops.geomkern_triton)

    spec = SPECS[name]
    _, public, args = _call(spec, changes)
    by_function = _refusal(public)
    by_operator = _refusal(lambda: getattr(torch.ops.geomkern_triton, name)(*args))
    assert type(by_operator) is exc and str(by_operator) == str(by_function), str(by_operator)


@pytest.mark.parametrize("call,pattern", [
    (lambda ops, a, o: ops.project_onto_basis(X, a, o, B, -1.0, "tf32x3"), r"gamma must be"),
    (lambda ops, a, o: ops.project_onto_basis(X, a, o, B, 0.5, "fp8"), r"precision='fp8' is not supported"),
    (lambda ops, a, o: ops.project_onto_basis(X, a[:5], o, B, 0.5, "tf32x3"), r"alphas must have one row per row"),
    (lambda ops, a, o: ops.project_onto_basis(X, a, o, B[:, :2], 0.5, "tf32x3"), r"feature dimension mismatch"),
    (lambda ops, a, o: ops.project_onto_basis(X, a, o.double(), B, 0.5, "tf32x3"), r"offsets"),
    (lambda ops, a, o: ops.kmeans_assign(X.reshape(3, 4, 3), B.reshape(1, 5, 3), "tf32x3"), r"must match X"),
    (lambda ops, a, o: ops.kmeans_assign(X.reshape(3, 4, 3), X[:6].reshape(3, 2, 3).float(), "tf32x3"), r"dtype"),
    (lambda ops, a, o: ops.kmeans_assign(X.reshape(3, 4, 3), X[:6].reshape(3, 2, 3), "magic"), r"precision='magic'"),
], ids=("proj-gamma", "proj-precision", "proj-alphas", "proj-dim", "proj-offsets", "assign-shape", "assign-dtype",
        "assign-precision"))
def test_triton_launcher_operators_check_their_arguments(call, pattern):
    """The two triton operators without a public twin (the projection's launcher, the K-Means
    assignment step) refuse bad names, shapes and dtypes by name before a launch."""
    pytest.importorskip("triton")
    import geomkern.backends.triton.operators  # noqa: F401

    alphas = FIT.alphas
    with pytest.raises((ValueError, TypeError), match=pattern):
        call(torch.ops.geomkern_triton, alphas, OFF)
