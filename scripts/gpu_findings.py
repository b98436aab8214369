"""Follow-up measurements for the failures a GPU session found (issue 28), in one short call.

    python scripts/gpu_findings.py --jsonl $OUT/findings.jsonl     # on the GPU machine

1. tf32 symmetric Gram: session 9's first call had rbf_gram(X, center=False, precision="tf32")
   at 2.5e-2 relative error (300 x D64) and 6.2e-3 (4096 x D512) where the cross Gram at tf32
   had 1.7e-4. Here: the symmetric and the cross kernel on the same X, every precision, against
   float64 and against what one TF32 pass should give (the shifted X rounded to TF32, the norms
   exact: the kernels' own math), with the error of every 128 x 128 tile of the symmetric result
   (the diagonal tiles are symmetrised in the kernel, the others mirrored), and the symmetric
   kernel with 64 x 64 tiles on 4 warps.
2. float32 kpca eigenvalues at 1.6e-5 of the float64 oracle on CUDA (bound 1e-5; on CPU in the
   interpreter they pass): the error split into the Gram's (Triton centred Gram against the
   float64 one) and the eigensolver's (torch.linalg.eigh of the same float32 matrix on CUDA
   and on CPU, against float64).

3. What solving float32 eigenproblems in float64 on CUDA costs (the fix for 2,
   geomkern.ops.eigh.full_eigh): torch.linalg.eigh on float32 against the float64 upcast, on
   batches of the sizes kpca's dense solver sees, medians of 5 timed runs after a warm-up.

4. Where the CUDA Jacobi eigh (geomkern._C_cuda, one block per matrix) beats the reference that
   ``auto`` runs on CUDA (float32 solved in float64, 3. above), over a grid of matrix sizes and
   batch sizes: ``gk.eigh`` under each backend, interleaved, with the eigenvalue difference between
   the two (session 12's benchmark suite had the kernel 57x torch's float32 eigh at 500 of 100 x 100
   and 0.38x at 64 of 512 x 512: a crossover ``auto`` could use, never measured between). Needs the
   build: the session runs it after the native step (``--only eigh_crossover``).

5. kpca's solver on CUDA: ``solver="auto"`` picks dense eigh or block Krylov by a rule measured on
   CPU (geomkern.ops.kpca.auto_top). Here ``gk.kpca`` with each solver on two sets of clusters,
   interleaved, with the eigenvalue difference from the dense solve: whether that rule is also
   the fast choice on a GPU (session 12's suite: the dense kpca of 30 clusters took 0.55 s, most of
   it the float64 eigh, while its Grams took 1.4 ms).

Every record goes to --jsonl as it is made; a summary line per case is printed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "geomkern"))


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.to("cpu", torch.float64)
    return float((out.detach().to("cpu", torch.float64) - ref).abs().max() / ref.abs().max())


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """float32 -> nearest TF32 (10 mantissa bits), as _common._tf32_split's hi."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_trunc(x: torch.Tensor) -> torch.Tensor:
    bits = x.float().contiguous().view(torch.int32)
    return (bits & ~0x1FFF).view(torch.float32)


def one_pass_model(Xs: torch.Tensor, gamma: float, rounder) -> torch.Tensor:
    """exp(-gamma (|x|^2 + |y|^2 - 2 <x~, y~>)) with exact norms and TF32 operands x~, in float64."""
    X64 = Xs.double().cpu()
    Xr = rounder(Xs.cpu()).double()
    nn = (X64 * X64).sum(1)
    d2 = (nn[:, None] + nn[None, :] - 2.0 * Xr @ Xr.T).clamp_min(0)
    return torch.exp(-gamma * d2)


def tile_errors(K: torch.Tensor, ref: torch.Tensor, block: int) -> list[list[float]]:
    K, ref = K.detach().double().cpu(), ref.double().cpu()
    n = K.shape[0]
    nt = -(-n // block)
    return [[round(float((K[i * block:(i + 1) * block, j * block:(j + 1) * block]
                          - ref[i * block:(i + 1) * block, j * block:(j + 1) * block]).abs().max()), 6)
             for j in range(nt)] for i in range(nt)]


def tf32_symmetric(emit) -> None:
    from geomkern.backends.triton import _common as C
    from geomkern.backends.triton import rbf as trbf
    from geomkern.ops import rbf as rrbf

    for n, D in ((300, 64), (300, 16), (300, 512), (4096, 512)):
        gen = torch.Generator().manual_seed(n * 1000 + D)
        X = torch.randn(n, D, generator=gen, dtype=torch.float64)
        gamma = 1.0 / (2.0 * D)
        ref = rrbf.gram_reference(X, None, gamma, False)
        Xc = X.float().cuda()
        Xs = C.shifted(Xc)[0]
        rec = {"finding": "tf32_symmetric", "n": n, "D": D, "gamma": gamma,
               "model_tf32_rna": rel(one_pass_model(Xs, gamma, tf32_round), ref),
               "model_tf32_rz": rel(one_pass_model(Xs, gamma, tf32_trunc), ref)}
        for prec in ("tf32", "tf32x3", "ieee"):
            Ks = trbf.rbf_gram(Xc, None, gamma, False, prec)
            Kx = trbf.rbf_gram(Xc, Xc.clone(), gamma, False, prec)
            rec[f"sym_{prec}"] = rel(Ks, ref)
            rec[f"cross_{prec}"] = rel(Kx, ref)
            rec[f"sym_vs_cross_{prec}"] = rel(Ks, Kx.double())
            if prec == "tf32" and n <= 300:
                rec["sym_tf32_tiles"] = tile_errors(Ks, ref, 128)
                rec["cross_tf32_tiles"] = tile_errors(Kx, ref, 128)
        orig = trbf._tiles
        try:
            trbf._tiles = lambda n_, D_, dtype, dot: (64, 32, 4)
            rec["sym_tf32_64x64_w4"] = rel(trbf.rbf_gram(Xc, None, gamma, False, "tf32"), ref)
            trbf._tiles = lambda n_, D_, dtype, dot: (128, 32, 4)
            rec["sym_tf32_128_w4"] = rel(trbf.rbf_gram(Xc, None, gamma, False, "tf32"), ref)
            trbf._tiles = lambda n_, D_, dtype, dot: (128, 16, 8)
            rec["sym_tf32_128_k16_w8"] = rel(trbf.rbf_gram(Xc, None, gamma, False, "tf32"), ref)
        finally:
            trbf._tiles = orig
        emit(rec)
        print(f"tf32 symmetric n={n} D={D}: " + ", ".join(
            f"{k} {v:.2e}" for k, v in rec.items() if isinstance(v, float) and k != "gamma"), flush=True)


def kpca_eigenvalues(emit, seeds) -> None:
    import geomkern as gk
    from _oracle import offsets_from_sizes
    from geomkern.backends.triton import kpca as tkpca
    from geomkern.ops import kpca as rkpca
    from test_kpca import separated_cluster

    sizes, D, d = [7, 70, 33, 4], 4, 3
    g = 1.0 / (2.0 * D)
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        X = torch.cat([separated_cluster(n, D, d, g, gen, torch.float32) for n in sizes])
        off = offsets_from_sizes(sizes)
        o = off.tolist()
        rec = {"finding": "kpca_eigenvalues", "seed": seed, "sizes": sizes, "D": D, "d": d}
        with gk.set_backend("triton"):
            fit = gk.kpca(X.cuda(), off.cuda(), n_components=d, gamma=g, solver="dense")
        with gk.set_backend("reference"):
            ref = gk.kpca(X.double(), off, n_components=d, gamma=g, solver="dense")
        rec["op_eigenvalues"] = rel(fit.eigenvalues, ref.eigenvalues)
        per = []
        for j, n in enumerate(sizes):
            Xj = X[o[j]:o[j + 1]]
            K64 = rkpca.centred_grams_reference(Xj.double(), [0, n], [0], g)[0][0]
            Kt = tkpca.centred_grams(Xj.cuda(), [0, n], [0], g)[0][0]
            mu64 = torch.linalg.eigvalsh(K64)
            row = {"n": n, "gram": rel(Kt, K64),
                   "eigh_cuda_f32_of_triton_gram": rel(torch.linalg.eigvalsh(Kt), mu64),
                   "eigh_cuda_f32_of_exact_gram": rel(torch.linalg.eigvalsh(K64.float().cuda()), mu64),
                   "eigh_cpu_f32_of_exact_gram": rel(torch.linalg.eigvalsh(K64.float()), mu64),
                   "eigh_cuda_f64_of_triton_gram": rel(torch.linalg.eigvalsh(Kt.double()), mu64)}
            per.append(row)
        rec["clusters"] = per
        emit(rec)
        print(f"kpca seed {seed}: op {rec['op_eigenvalues']:.2e}; " + "; ".join(
            f"n={r['n']} gram {r['gram']:.1e} eigh(cuda f32) {r['eigh_cuda_f32_of_triton_gram']:.1e} "
            f"exact->cuda f32 {r['eigh_cuda_f32_of_exact_gram']:.1e} cpu f32 "
            f"{r['eigh_cpu_f32_of_exact_gram']:.1e}" for r in per), flush=True)


def timed(fn, reps=5, warm=True, device: str = "cuda") -> float:
    """Median of ``reps`` timed calls in µs (CUDA events; on CPU, for the tests, a wall clock),
    after one untimed call."""
    if warm:
        fn()
    out = []
    for _ in range(reps):
        if device == "cpu":
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e6)
            continue
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return sorted(out)[len(out) // 2]


def interleaved_min(calls: dict, device: str = "cuda", rounds: int = 2) -> dict:
    """µs per call of each of ``calls`` (name -> function, already warmed up): each timed once per
    round, in turn, the minimum over ``rounds`` rounds."""
    us = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            us[name].append(timed(fn, reps=1, warm=False, device=device))
    return {name: min(t) for name, t in us.items()}


def eigh_upcast_cost(emit) -> None:
    for batch, n in ((500, 100), (30, 300), (8, 1000), (1, 2000)):
        X = torch.randn(batch, n, n, device="cuda", generator=torch.Generator("cuda").manual_seed(n))
        A = (X + X.transpose(1, 2)) / 2
        ref = torch.linalg.eigvalsh(A.double())
        f32 = timed(lambda: torch.linalg.eigh(A))
        f64 = timed(lambda: torch.linalg.eigh(A.double()))
        rec = {"finding": "eigh_upcast_cost", "batch": batch, "n": n, "float32_us": round(f32, 1),
               "float64_upcast_us": round(f64, 1), "ratio": round(f64 / f32, 3),
               "float32_err": rel(torch.linalg.eigvalsh(A), ref),
               "upcast_err": rel(torch.linalg.eigvalsh(A.double()).float(), ref)}
        emit(rec)
        print(f"eigh {batch} x {n}: float32 {f32:.0f} us, float64 upcast {f64:.0f} us "
              f"({rec['ratio']:.2f}x); errors {rec['float32_err']:.1e} / {rec['upcast_err']:.1e}",
              flush=True)


# (n, batch) cells of the eigh crossover, in the order they are measured (the cheap ones first:
# a cell past the deadline is recorded as skipped): the batch sizes straddle one block per SM
# (132 on an H100) and kpca's dense buckets (n up to a few hundred).
CROSSOVER_N = (32, 64, 100, 128, 192, 256, 384, 512)
CROSSOVER_B = (1, 16, 132, 400)


def eigh_crossover(emit, budget_s: float = 35.0, device: str = "cuda",
                   ns=CROSSOVER_N, batches=CROSSOVER_B) -> None:
    """``device="cpu"`` (the tests: native runs the reference there) checks the records' form."""
    import geomkern as gk
    why = gk.why_not("native", device)
    if why:
        emit({"finding": "eigh_crossover", "skipped": why})
        return
    t0 = time.monotonic()
    for B in batches:
        for n in ns:
            rec = {"finding": "eigh_crossover", "batch": B, "n": n}
            if time.monotonic() - t0 > budget_s or B * n ** 3 > 400 * 256 ** 3:
                emit({**rec, "skipped": "budget" if time.monotonic() - t0 > budget_s else "too costly"})
                continue
            X = torch.randn(B, n, n, device=device, generator=torch.Generator(device).manual_seed(n + B))
            A = (X + X.transpose(1, 2)) / 2

            def run(backend):
                with gk.set_backend(backend):
                    return gk.eigh(A)

            ref_w, nat_w = run("reference")[0], run("native")[0]  # the warm-up calls
            us = interleaved_min({b: (lambda b=b: run(b)) for b in ("reference", "native")}, device)
            rec.update(reference_us=round(us["reference"], 1), native_us=round(us["native"], 1),
                       native_speedup=round(us["reference"] / us["native"], 2),
                       eigenvalue_rel_diff=rel(nat_w.double(), ref_w.double()))
            emit(rec)
            print(f"eigh crossover {B} x {n}: reference {rec['reference_us']:.0f} us, native "
                  f"{rec['native_us']:.0f} us ({rec['native_speedup']:.2f}x)", flush=True)


# (name, cluster sizes, D): the benchmark suite's 30 clusters and many small ones
KPCA_CASES = (("30 clusters 100-2000 x D512", torch.linspace(100, 2000, 30).round().long().tolist(), 512),
              ("200 clusters 50-300 x D64", torch.linspace(50, 300, 200).round().long().tolist(), 64))


def kpca_solver(emit, budget_s: float = 30.0, device: str = "cuda", cases=KPCA_CASES, d: int = 8) -> None:
    """``device="cpu"`` (the tests) checks the records' form."""
    import geomkern as gk
    t0 = time.monotonic()
    for name, sizes, D in cases:
        if time.monotonic() - t0 > budget_s:
            emit({"finding": "kpca_solver", "case": name, "skipped": "budget"})
            continue
        gen = torch.Generator(device).manual_seed(len(sizes))
        X = torch.randn(sum(sizes), D, device=device, generator=gen) / D ** 0.5
        offsets = torch.tensor([0] + sizes, device=device).cumsum(0)
        gamma = gk.median_gamma(X)

        def run(solver):
            return gk.kpca(X, offsets, n_components=d, gamma=gamma, solver=solver).eigenvalues

        dense = run("dense")  # also the warm-up
        vals = {s: run(s) for s in ("subspace", "auto")}
        us = interleaved_min({s: (lambda s=s: run(s)) for s in ("dense", "subspace", "auto")}, device)
        rec = {"finding": "kpca_solver", "case": name, "clusters": len(sizes), "D": D, "d": d,
               **{f"{s}_us": round(t, 1) for s, t in us.items()},
               **{f"{s}_eigenvalue_rel_diff": rel(v.double(), dense.double()) for s, v in vals.items()}}
        rec["fastest"] = min(us, key=us.get)
        emit(rec)
        print(f"kpca {name}: dense {rec['dense_us']:.0f} us, subspace {rec['subspace_us']:.0f} us, "
              f"auto {rec['auto_us']:.0f} us (fastest: {rec['fastest']})", flush=True)


FINDINGS = ("tf32_symmetric", "kpca_eigenvalues", "eigh_upcast_cost", "kpca_solver", "eigh_crossover")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jsonl", type=Path, required=True)
    ap.add_argument("--seeds", default="424455771,29497708,1,2,3")
    ap.add_argument("--only", default=",".join(FINDINGS),
                    help=f"comma-separated findings to run, of {', '.join(FINDINGS)} (default: all)")
    args = ap.parse_args()
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(only) - set(FINDINGS))
    if unknown:
        ap.error(f"--only: unknown finding(s) {unknown}; choose from {', '.join(FINDINGS)}")
    if not torch.cuda.is_available():
        print("gpu_findings: no CUDA device here", file=sys.stderr)
        return 2
    t0 = time.monotonic()

    def emit(rec):
        rec = {"t_s": round(time.monotonic() - t0, 1), **rec}
        with args.jsonl.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")

    for name, fn in (("tf32_symmetric", lambda: tf32_symmetric(emit)),
                     ("kpca_eigenvalues", lambda: kpca_eigenvalues(
                         emit, [int(s) for s in args.seeds.split(",")])),
                     ("eigh_upcast_cost", lambda: eigh_upcast_cost(emit)),
                     ("kpca_solver", lambda: kpca_solver(emit)),
                     ("eigh_crossover", lambda: eigh_crossover(emit))):
        if name not in only:
            continue
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the next finding runs whatever happened
            import traceback
            traceback.print_exc()
            emit({"finding": name, "error": repr(exc)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
