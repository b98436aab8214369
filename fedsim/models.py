"""Heads trained on frozen embeddings.

Every model maps (b, D) embeddings to ``(logits (b, C), features (b, F))``: the features are what
representation-level algorithms (MOON's contrast, FedProto's prototypes) work on.
"""
from __future__ import annotations

import re

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
    """``depth`` hidden layers of width ``hidden`` (ReLU); features are the last hidden activations.

    It is a trunk f (``trunk``: fc1 + ReLU, then depth - 1 more Linear + ReLU in ``deep``,
    (b, D) -> (b, hidden)) and a classifier g (``classify``: fc2, (b, hidden) -> (b, C)): methods
    that train g on features computed elsewhere (FedMP's feature bank) call ``classify`` directly.
    A model without these two methods has no trunk. ``depth=1`` is the one-hidden-layer head
    (same parameters, names and initialisation as before ``depth`` existed). On the command line:
    ``--model mlp:512x2`` (``parse_model``).
    """

    def __init__(self, dim: int, n_classes: int, *, hidden: int = 256, depth: int = 1):
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"model mlp: depth must be an integer >= 1 (hidden layers), got {depth!r}")
        self.fc1 = nn.Linear(dim, hidden)
        if depth > 1:
            self.deep = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(depth - 1))
        self.fc2 = nn.Linear(hidden, n_classes)

    def trunk(self, x):
        h = F.relu(self.fc1(x))
        for layer in getattr(self, "deep", ()):
            h = F.relu(layer(h))
        return h

    def classify(self, h):
        return self.fc2(h)

    def forward(self, x):
        h = self.trunk(x)
        return self.classify(h), h


def parse_model(spec: str) -> tuple[str, dict]:
    """``--model`` with sizes: ``"mlp:512x2"`` -> ("mlp", {"hidden": 512, "depth": 2}), ``"mlp:512"``
    -> ("mlp", {"hidden": 512}); a name without ":" -> (name, {}). The trunk of FedMP is the MLP's
    hidden layers, so this is also its width and depth."""
    name, sep, size = spec.partition(":")
    if not sep:
        return spec, {}
    width, x, depth = size.partition("x")
    # ASCII digits only: str.isdigit() also accepts "²", which int() then refuses with a message
    # that names neither the flag nor the format
    if name != "mlp" or not re.fullmatch(r"[0-9]+", width) or (x and not re.fullmatch(r"[0-9]+", depth)):
        raise ValueError(f"--model {spec!r}: sizes are written mlp:WIDTH or mlp:WIDTHxDEPTH (e.g. mlp:512x2: two "
                         "hidden layers of 512), for model mlp only")
    if int(width) < 1:
        raise ValueError(f"--model {spec!r}: WIDTH {width} gives hidden layers of no units, so nothing reaches "
                         "the classifier; give a WIDTH >= 1 (e.g. mlp:512x2: two hidden layers of 512)")
    if x and int(depth) < 1:
        raise ValueError(f"--model {spec!r}: DEPTH {depth} is no hidden layer; give a DEPTH >= 1 (mlp:{width} is "
                         "one hidden layer), or --model linear for a head without hidden layers")
    return name, {"hidden": int(width), **({"depth": int(depth)} if x else {})}


def mlp_parameters(dim: int, n_classes: int, *, hidden: int, depth: int = 1) -> int:
    """The number of parameters of ``MLPHead(dim, n_classes, hidden=hidden, depth=depth)``: fc1
    (dim -> hidden), depth - 1 layers hidden -> hidden, fc2 (hidden -> n_classes), with biases."""
    return (dim + 1) * hidden + (depth - 1) * (hidden + 1) * hidden + (hidden + 1) * n_classes


def has_trunk(model_or_class) -> bool:
    """Whether a model splits into a trunk f and a classifier g (``trunk`` and ``classify``)."""
    return callable(getattr(model_or_class, "trunk", None)) and callable(getattr(model_or_class, "classify", None))


class PersonalNet(nn.Module):
    """The personalised path's model (FLIC, FedRep, local; fedsim/personal.py): an embedding
    phi_i (``embed``: D_i -> embed_hidden -> embed_dim, a small MLP, the client's own), a
    representation (``body``: embed_dim -> hidden, ReLU) and a head (``head``: hidden -> C).
    Features are phi_i(x), the point in the common space that FLIC aligns. ``hidden = 0``: no
    representation layer, the head reads phi_i(x) (the FLIC authors' "classif" model, FLIC-Class:
    nothing but the anchors is shared)."""

    def __init__(self, dim: int, n_classes: int, *, embed_dim: int = 16, embed_hidden: int = 32, hidden: int = 32):
        super().__init__()
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 0:
            raise ValueError(f"model_params: hidden must be an integer >= 0 (0: no representation layer), got {hidden!r}")
        for key, v in (("embed_dim", embed_dim), ("embed_hidden", embed_hidden)):
            # 0 built empty layers that failed later, inside training ("m1 is empty")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model_params: {key} must be an integer >= 1 (the width of phi_i's "
                                 f"{'output' if key == 'embed_dim' else 'hidden layer'}), got {v!r}")
        self.embed = nn.Sequential(nn.Linear(dim, embed_hidden), nn.ReLU(), nn.Linear(embed_hidden, embed_dim))
        self.body = nn.Sequential(nn.Linear(embed_dim, hidden), nn.ReLU()) if hidden else nn.Identity()
        self.head = nn.Linear(hidden or embed_dim, n_classes)

    def forward(self, x):
        z = self.embed(x)
        return self.head(self.body(z)), z


from .prompt import PromptHead  # noqa: E402  (prompt learning on a frozen text tower: fedsim/prompt.py)

MODELS = {"linear": CosineHead, "mlp": MLPHead, "personal": PersonalNet, "prompt": PromptHead}


# The RunConfig values each model runs with where nothing sets them (RunConfig keeps None for
# "the model's default", and RunConfig.validate fills them in from here, so the Python API and
# `fedsim run` agree). linear and mlp: measured on the embedded data, docs/history.md §13
# "mlp learning rate" (FedAvg, beta 0.1, 30 rounds: the cosine head is flat from lr 0.01 to 0.5 and
# breaks at 1.0; the mlp reaches 19.6 % at 0.05, 55.8 % at 0.5, 57.5 % at 1.0). The prompt head pays
# a forward and backward pass of the frozen tower over every class prompt per local step, whatever
# the batch size, so its rounds are few; batch 256 keeps several local steps per client (with one
# full-batch step per client FedAvg is centralised gradient descent, blind to the partition).
# Measured: docs/prompt.md. A model not named here takes the linear head's values.
RUN_DEFAULTS = {"linear": {"rounds": 30, "batch_size": 64, "lr": 0.05},
                "mlp": {"rounds": 30, "batch_size": 64, "lr": 0.5},
                "prompt": {"rounds": 5, "batch_size": 256, "lr": 0.5}}


def run_defaults(model: str) -> dict:
    """The rounds, batch_size and lr ``model`` runs with where nothing sets them."""
    return RUN_DEFAULTS.get(model, RUN_DEFAULTS["linear"])


def apply_run_defaults(cfg) -> dict:
    """Fill the fields of ``cfg`` (a RunConfig) that are None with ``cfg.model``'s RUN_DEFAULTS.
    Returns what it set."""
    changed = {k: v for k, v in run_defaults(cfg.model).items() if getattr(cfg, k) is None}
    for k, v in changed.items():
        setattr(cfg, k, v)
    return changed


def build_model(name: str, dim: int, n_classes: int, *, class_names=None, **kwargs) -> nn.Module:
    """``class_names`` (the dataset's) go to the models that read them (``needs_class_names``: the
    prompt head builds its class weights from them); the others ignore them."""
    if name not in MODELS:
        raise ValueError(f"model={name!r} is not known; choose one of {sorted(MODELS)}")
    cls = MODELS[name]
    if getattr(cls, "needs_class_names", False):
        if class_names is None:
            raise ValueError(f"model={name!r} builds its class weights from the class names: pass class_names")
        return cls(dim, n_classes, list(class_names), **kwargs)
    return cls(dim, n_classes, **kwargs)
