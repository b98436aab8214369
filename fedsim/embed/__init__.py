"""Frozen foundation-model encoders that turn raw inputs into the embeddings fedsim trains on."""
from .encoders import MiniLMEncoder, TextEncoder

__all__ = ["MiniLMEncoder", "TextEncoder"]
