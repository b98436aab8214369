"""fedsim: a thin federated simulator for feature calibration on frozen embeddings."""
__version__ = "0.1.0"
