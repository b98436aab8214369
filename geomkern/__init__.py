"""geomkern: kernel-geometry ops (RBF Grams, batched kernel PCA, basis projection, pre-images,
class moments, batched eigh and K-Means) with a float64-capable torch reference for each and
fused native / GPU fast paths. Tensors in, tensors out, same device.

Randomness: every ``generator`` argument (fedmc, ggeur, privacy) takes a torch.Generator, or None
(the default) for a fresh generator seeded secretly from the OS, never the global RNG; numbers are
drawn on the generator's device and moved to the data's (``geomkern/_random.py``).

Dispatch: ``resolve(op, device_type)`` says which backend an op runs on, ``registered_ops()``
lists the dispatched ops and their backends, ``why_not(backend, device_type=None)`` says why a
backend cannot run here, or on that device type ("" when it can): e.g. ``why_not("native", "cuda")``
where geomkern was not compiled with CUDA. A compiled extension that exists but does not load is
reported once, by a warning at the first op that ``auto`` would have run on it. ``cpu_isa()``
names the instruction-set variant of the native CPU kernels that runs (picked at load from the
CPU; ``GEOMKERN_CPU_ISA`` forces one).
"""
from ._dispatch import available_backends, get_backend, registered_ops, resolve, set_backend, why_not
from .ops.kmeans import KMeansResult, kmeans
from .ops.kpca import KPCAFit, kpca, kpca_transform, project_onto_basis
from . import backends  # noqa: F401  (declares the fast backends to the dispatcher)
from .backends.native import cpu_isa
from .ops.eigh import eigh
from .ops.gaussian_w2 import bures, gaussian_barycenter, gaussian_w2, sqrtm_psd
from .ops.moments import class_moments, pool_moments
from .ops.preimage import preimage, preimage_loss
from .ops.rbf import median_gamma, rbf_gram, rbf_matmul

__version__ = "0.1.0"

__all__ = [
    "KMeansResult", "KPCAFit", "available_backends", "bures", "class_moments", "cpu_isa", "eigh",
    "gaussian_barycenter", "gaussian_w2", "get_backend", "kmeans", "kpca", "sqrtm_psd",
    "kpca_transform", "median_gamma", "pool_moments", "registered_ops", "preimage", "preimage_loss",
    "project_onto_basis", "rbf_gram", "rbf_matmul", "resolve", "set_backend", "why_not",
]
