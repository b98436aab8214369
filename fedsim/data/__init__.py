"""Datasets (embeddings + labels), partitioners and synthetic manifolds."""
from .dataset import Dataset, load_dataset, save_dataset

__all__ = ["Dataset", "load_dataset", "save_dataset"]
