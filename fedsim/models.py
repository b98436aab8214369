"""Heads trained on frozen embeddings.

Every model maps (b, D) embeddings to ``(logits (b, C), features (b, F))``: the features are what
representation-level algorithms (MOON's contrast, FedProto's prototypes) work on.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CosineHead(nn.Module):
    """Linear head with cosine logits, as CLIP-style zero-shot heads use: s * <x/|x|, w_c/|w_c|>.

    The scale s is learnable (stored as log s) or fixed. Features are the normalised inputs.
    """

    def __init__(self, dim: int, n_classes: int, *, scale: float = 10.0, learn_scale: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_classes, dim) / dim ** 0.5)
        log_s = torch.tensor(float(scale)).log()
        if learn_scale:
            self.log_scale = nn.Parameter(log_s)
        else:
            self.register_buffer("log_scale", log_s)

    def forward(self, x):
        f = F.normalize(x, dim=1)
        return self.log_scale.exp() * f @ F.normalize(self.weight, dim=1).T, f

    @torch.no_grad()
    def init_from_text(self, class_embeddings: torch.Tensor) -> None:
        """Zero-shot initialisation: class weights = class-name text embeddings (C, D)."""
        if class_embeddings.shape != self.weight.shape:
            raise ValueError(f"class_embeddings must have shape {tuple(self.weight.shape)}, "
                             f"got {tuple(class_embeddings.shape)}")
        self.weight.copy_(class_embeddings)


class MLPHead(nn.Module):
    """One hidden layer (ReLU); features are the hidden activations.

    It is a trunk f (``trunk``: fc1 + ReLU, (b, D) -> (b, hidden)) and a classifier g
    (``classify``: fc2, (b, hidden) -> (b, C)): methods that train g on features computed
    elsewhere (FedMP's feature bank) call ``classify`` directly. A model without these two
    methods has no trunk.
    """

    def __init__(self, dim: int, n_classes: int, *, hidden: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)

    def trunk(self, x):
        return F.relu(self.fc1(x))

    def classify(self, h):
        return self.fc2(h)

    def forward(self, x):
        h = self.trunk(x)
        return self.classify(h), h


def has_trunk(model_or_class) -> bool:
    """Whether a model splits into a trunk f and a classifier g (``trunk`` and ``classify``)."""
    return callable(getattr(model_or_class, "trunk", None)) and callable(getattr(model_or_class, "classify", None))


class PersonalNet(nn.Module):
    """The personalised path's model (FLIC, FedRep, local; fedsim/personal.py): an embedding
    phi_i (``embed``: D_i -> embed_hidden -> embed_dim, a small MLP, the client's own), a
    representation (``body``: embed_dim -> hidden, ReLU) and a head (``head``: hidden -> C).
    Features are phi_i(x), the point in the common space that FLIC aligns."""

    def __init__(self, dim: int, n_classes: int, *, embed_dim: int = 16, embed_hidden: int = 32, hidden: int = 32):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(dim, embed_hidden), nn.ReLU(), nn.Linear(embed_hidden, embed_dim))
        self.body = nn.Sequential(nn.Linear(embed_dim, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        z = self.embed(x)
        return self.head(self.body(z)), z


MODELS = {"linear": CosineHead, "mlp": MLPHead, "personal": PersonalNet}


def build_model(name: str, dim: int, n_classes: int, **kwargs) -> nn.Module:
    if name not in MODELS:
        raise ValueError(f"model={name!r} is not known; choose one of {sorted(MODELS)}")
    return MODELS[name](dim, n_classes, **kwargs)
