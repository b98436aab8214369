"""``oversample``: GGEUR's and fedmc-fixed's matched-compute control, copies of real rows."""
from __future__ import annotations

from ..config import Int
from ._registry import register
from .base import Augmenter, fill_sources


@register
class OversampleAugmenter(Augmenter):
    """The matched-compute control of GGEUR and fedmc-fixed (docs/design.md note 9): the same extra
    rows per round under the same budget rule (fill each held class up to ``target_per_class``),
    but copies of the client's own real samples instead of synthetic ones. An augmenter's gain over
    FedAvg that this control also shows comes from the extra local steps, not from geometry."""

    name = "oversample"
    summary = "copies of real rows: the matched-compute control of ggeur and fedmc-fixed (the same extra steps)"
    defaults = {"target_per_class": 100}
    params = {"target_per_class": Int(0)}

    def augment(self, cid, data, *, generator):
        rows = fill_sources(data.y, self.n_classes, self.p["target_per_class"])
        return data.x[rows], data.y[rows]
