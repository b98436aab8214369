"""Heads trained on frozen embeddings.

Every model maps (b, D) embeddings to ``(logits (b, C), features (b, F))``: the features are what
representation-level algorithms (MOON's contrast, FedProto's prototypes) work on.
"""
from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .config import Bool, ConfigError, Int, Real


class CosineHead(nn.Module):
    """Linear head with cosine logits, as CLIP-style zero-shot heads use: s * <x/|x|, w_c/|w_c|>.

    The scale s is learnable (stored as log s) or fixed. Features are the normalised inputs.
    """

    params = {"scale": Real(0, lo_open=True), "learn_scale": Bool()}  # the kinds of model_params

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

    params = {"hidden": Int(1), "depth": Int(1)}

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

    params = {"embed_dim": Int(1), "embed_hidden": Int(1), "hidden": Int(0)}  # hidden 0: FLIC-Class

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


def model_defaults(model: str) -> dict:
    """The keyword parameters (model_params) of model ``model`` and their defaults: its constructor's."""
    sig = inspect.signature(MODELS[model].__init__)
    return {n: p.default for n, p in sig.parameters.items()
            if p.kind == p.KEYWORD_ONLY and p.default is not inspect.Parameter.empty}


# ------------------------------------------------------------------------------ memory
# Where the free memory cannot be read (no /proc/meminfo, no sysconf), a run's model may take at
# most this many bytes: a laptop's worth, so that an absurd --model is still refused by name.
MEMORY_CAP_UNKNOWN = 16 * 2 ** 30
# cgroup files that bound this process's memory (v2, then v1): (limit, usage)
_CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_memory(device: str) -> tuple[int, str]:
    """(bytes free for a run's tensors on ``device`` now, what that figure is): CUDA's free memory;
    on the CPU the kernel's MemAvailable, or less where a cgroup limits this process (a container's
    limit is what kills it, however much the host has free); MEMORY_CAP_UNKNOWN where neither can
    be read."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0]), f"free on {device}"
    free = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append((int(line.split()[1]) * 1024, "of memory available"))
    except (OSError, ValueError, IndexError):
        pass
    if not free:
        try:
            free.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "of memory free"))
        except (AttributeError, ValueError, OSError):
            pass
    for limit, usage in _CGROUP_MEMORY:
        try:
            cap, used = Path(limit).read_text().strip(), int(Path(usage).read_text())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2 ** 60:  # "max", or v1's huge number: no limit
            free.append((max(int(cap) - used, 0), f"left under this process's memory limit ({limit})"))
    if not free:
        return MEMORY_CAP_UNKNOWN, "that fedsim allows a model where the free memory cannot be read " \
                                   "(models.MEMORY_CAP_UNKNOWN)"
    return min(free)


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def check_model_memory(cfg, dim: int, n_classes: int) -> None:
    """Refuse an mlp head (``cfg.model_params`` hidden x depth, on ``dim`` inputs and ``n_classes``
    classes) whose training cannot fit in the memory free now, before anything is written: ``fedsim
    run --model mlp:64x100000`` would otherwise allocate for minutes, leave a run folder and be
    killed. The figure is a lower bound: the float32 copies of the parameters that a round holds at
    once (the global model, the server's weights, a client's copy of them, the gradients, SGD's
    momentum, the aggregate, one update per selected client) and the activations a batch keeps for
    the backward pass (before and after each ReLU); an algorithm's own state (SCAFFOLD's control
    variates, MOON's previous models) only adds to it."""
    if cfg.model != "mlp":  # the other heads have fixed small sizes (linear: C x D) or a frozen tower
        return

    p = {**model_defaults("mlp"), **cfg.model_params}
    hidden, depth = p["hidden"], p["depth"]
    n_selected = max(1, int(round(cfg.client_fraction * cfg.n_clients)))  # as the round loop selects
    copies = 5 + (cfg.momentum > 0) + n_selected

    def need(layers: int) -> int:
        return 4 * (copies * mlp_parameters(dim, n_classes, hidden=hidden, depth=layers)
                    + 2 * cfg.batch_size * hidden * layers)

    free, what = available_memory(cfg.device)
    if need(depth) <= free:
        return
    per_layer = need(2) - need(1)
    fits = 1 + (free - need(1)) // per_layer if need(1) <= free else 0
    hint = (f"at width {hidden} at most {fits} hidden layer(s) fit (mlp:{hidden}x{fits})" if fits
            else f"even one hidden layer of width {hidden} does not fit: give a smaller WIDTH")
    raise ConfigError(f"--model mlp:{hidden}x{depth}: this head has "
                      f"{mlp_parameters(dim, n_classes, hidden=hidden, depth=depth):,} parameters ({dim} inputs, "
                      f"{depth} hidden layer(s) of {hidden}, {n_classes} classes); training it holds at least "
                      f"{copies} float32 copies of them ({n_selected} of them the updates of the clients selected "
                      f"per round) and a batch's activations, {_gb(need(depth))}, more than the {_gb(free)} {what}. "
                      f"Give a smaller WIDTHxDEPTH ({hint}), select fewer clients per round (--fraction, "
                      "--clients), or run where more memory is free")


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
