"""FedRep (Collins et al. 2021): a shared representation averaged over the clients, personal heads.

The representation is everything below the head (``embed`` and ``body`` of PersonalNet), so it
needs one input dimension: the clients are grouped by feature space and each group is its own
federation ("FedRep restricted to the clients that share a feature space"). On homogeneous data
there is one space and this is plain FedRep. Local schedule: ``head_epochs`` on the head, then
``local_epochs`` on the representation; or, with ``schedule = "personal-first"``, ``local_epochs -
rep_epochs`` on the head, then ``rep_epochs`` on the representation (fedsim/algorithms/local.py).
"""
from __future__ import annotations

from ._registry import register
from .local import PersonalAlgorithm


@register
class FedRep(PersonalAlgorithm):
    name = "fedrep"
    shared_prefixes = ("embed.", "body.")

    def group(self, cid, space):
        return f"space:{space}"
