"""FedMC (Federated Manifold Calibration): client and server steps as pure tensor functions.

Pipeline (each step is one call; any FL codebase can move the results over its own transport):

1. client  ``client_prototypes``  K-Means prototypes released with differential privacy.
2. server  ``build_gab``          K-Means over all clients' prototypes -> the shared anonymous
                                   basis (GAB) B (S, D); ``resolve_gamma`` derives the kernel width
                                   from it (public data: every client and the server use one gamma).
3. client  ``local_geometry``     DP K-Means patches, kernel PCA of every patch in one call, and
                                   betas = <v_i, Phi(b_s)> -> a LocalGeometry (LGD batch).
4. server  ``fuse``               meta-clustering of the uploaded centres into L regions and the
                                   weighted fusion of paper Eq. 7 -> a GeometryDictionary.
5. client  ``prepare``            the dictionary's per-GAB constants (Cholesky factor of the GAB
                                   Gram, coefficient maps), once per dictionary;
           ``calibrate``          nearest entry, perturbation in kernel-PC coordinates, pre-image.

``setup`` runs steps 1-4 for all clients in one process with the one set of sizing rules (the
simulator, the benchmarks and the demo all call it); its halves ``setup_basis`` (steps 1-2) and
``setup_geometry`` (steps 3-4 for any subset of clients) serve a per-round protocol (the paper's
Algorithm 1: fresh LGDs from each round's clients). What is exchanged (``GAB``,
``PrototypeRelease``, ``LocalGeometry``, ``GeometryDictionary``) follows :mod:`geomkern.exchange`:
validated on construction, ``to_dict``/``from_dict``, and the containers' own
``save``/``load`` and ``to_bytes``/``from_bytes`` (one safetensors format, never pickle), e.g.
``GAB(B).save(path)``, ``GAB.load(path).basis``, ``LocalGeometry.load(path)``.
``generator`` follows the package rule (:mod:`geomkern._random`): None (the default) is a fresh,
secretly seeded generator, never the global RNG; draws happen on the generator's device.

Modules, by role: ``client`` (steps 1, 3), ``server`` (steps 2, 4), ``calibration`` (step 5),
``containers`` (what is exchanged), ``recipe`` (``setup`` and its halves). Every public name is
importable from ``geomkern.fedmc``.

Deviations from the paper's formulas (docs/design.md math notes, all deliberate):
* alphas are normalised (u / sqrt(mu)), so betas are exact inner products <v_i, Phi(b_s)>;
* the perturbation uses the feature-space variance lambda = mu / n (``formulation="paper"`` uses
  the Gram eigenvalue mu, as printed);
* ``formulation="consistent"`` treats betas as inner products: a_i = (G + rho I)^-1 beta_i gives
  p_i(z) ~ k(z, B) a_i and targets keep the part of Phi(x) outside the PC subspace;
  ``formulation="paper"`` is Eq. 10-13 literally: beta as expansion coefficients, the target built
  from the perturbed coordinates alone (T = sum_i p'_i beta_i G); ``formulation="hybrid"`` is the
  paper's perturbation added to k(x, B) (the part of Phi(x) outside the d components kept);
* at epsilon = inf the patches and prototypes are plain K-Means (k-means++, ``geomkern.kmeans``)
  on unclipped rows unless ``clip_norm`` is given; a finite epsilon needs ``clip_norm`` (the bound
  the DP release rests on);
* the LGD centre is a DP release, not a raw mean; spectra and betas are NOT protected (README).
"""
from __future__ import annotations

from .calibration import (DEFAULT_METHOD, DEFAULT_RIDGE, FORMULATIONS, PREIMAGE_METHODS,
                          PreparedDictionary, calibrate, nearest_entry, prepare, targets)
from .client import MAX_COMPONENTS, client_prototypes, local_geometry
from .containers import GAB, GeometryDictionary, LocalGeometry, PrototypeRelease, Prototypes
from .recipe import (Setup, setup, setup_basis, setup_client_geometry, setup_client_prototypes,
                     setup_geometry, setup_server_basis, setup_server_fuse, spent)
from .server import build_gab, fuse, resolve_gamma

__all__ = [
    "DEFAULT_METHOD", "DEFAULT_RIDGE", "FORMULATIONS", "GAB", "GeometryDictionary", "LocalGeometry",
    "MAX_COMPONENTS", "PREIMAGE_METHODS", "PreparedDictionary", "PrototypeRelease", "Prototypes", "Setup",
    "build_gab", "calibrate", "client_prototypes", "fuse", "local_geometry", "nearest_entry", "prepare",
    "resolve_gamma", "setup", "setup_basis", "setup_client_geometry", "setup_client_prototypes",
    "setup_geometry", "setup_server_basis", "setup_server_fuse", "spent", "targets",
]
