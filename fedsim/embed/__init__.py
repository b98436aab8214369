"""Frozen foundation-model encoders that turn raw inputs into the embeddings fedsim trains on, the
dataset adapters that list those inputs, and the (cached, resumable) extraction pipeline."""
from .datasets import ADAPTERS, SourceDataset, Split, load_source
from .encoders import ImageEncoder, ImageTransform, MiniLMEncoder, OpenCLIPEncoder, TextEncoder
from .extract import EmbeddingCache, default_cache_dir, extract

__all__ = ["ADAPTERS", "EmbeddingCache", "ImageEncoder", "ImageTransform", "MiniLMEncoder", "OpenCLIPEncoder",
           "SourceDataset", "Split", "TextEncoder", "default_cache_dir", "extract", "load_source"]
