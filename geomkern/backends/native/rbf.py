"""Native RBF kernels (csrc/cpu/rbf.cpp): K(X, Y) V in tiles, K never stored, and K(X, Y) itself."""
from __future__ import annotations

from ...ops.rbf import gram_on_shift, shift_rows
from ._common import fast_cpu


def kernels(C, C_cuda) -> dict[str, dict[str, object]]:
    """op -> {device type: implementation} for the extensions given (None: not built)."""
    if C is None:
        return {}
    return {
        # K(X, Y) V in row-block tiles, K never stored (csrc/cpu/rbf.cpp)
        # (on the common shift, as every backend's distances: math note 10)
        "rbf_matmul": {"cpu": lambda X, Y, V, gamma, precision=None:
                       C.rbf_matmul(*shift_rows(X, Y, by=Y), V, float(gamma))},
        # tiles in one parallel region (csrc/cpu/rbf.cpp), around them what every CPU Gram does
        "rbf_gram": {"cpu": lambda X, Y, gamma, center, precision=None: gram_on_shift(
            X, Y, float(gamma), center, lambda Xs, g: C.rbf_gram(Xs, None, g), C.rbf_gram)},
    }


def auto(C) -> dict[str, tuple[str, ...]]:
    """device type -> ops of this family auto prefers native for (measured wins only).

    rbf_matmul (tiles, K never stored): 1.33x the torch reference at 8,192^2 x 512 with memory
    O((n + m)(D + p)) plus a tile per thread; the matrix-free kpca it serves detects an
    all-identical cluster directly (its rows' sums run in tile order, so K V has no bit-equal rows
    to rely on). rbf_gram (tiles in one parallel region): 4,096 x 512 float32 against torch cdist
    + exp, interleaved, AVX-512: symmetric 0.72x torch's time at 2 threads (the reference's blocks
    0.81x), cross 4,096 x 2,048 0.97x (1.12x); beside a busy process 0.64x and 0.90x, where the
    reference's ~130 small parallel ops fell to 1.43x and 1.35x (one barrier each on a loaded
    machine). Both on AVX2+FMA or wider only (_common.fast_cpu)."""
    return {"cpu": ("rbf_matmul", "rbf_gram") if fast_cpu(C) else ()}
