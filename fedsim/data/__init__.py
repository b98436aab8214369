"""Datasets: the embeddings + labels format with its loader and writer (``dataset``, which also
serves the embedded default data, ``load_dataset("default")``), client partitioners
(``partition``) and the import of your own embedding files (``importer``, ``fedsim import``)."""
from .dataset import Dataset, load_dataset, save_dataset

__all__ = ["Dataset", "load_dataset", "save_dataset"]
