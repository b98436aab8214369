"""Feature-calibration plug-ins for the round loop (fedsim/augmenters/base.py, moved from
fedsim/augmenters.py; split into one module per augmenter in the next commit)."""
from .base import (AUGMENTERS, FEDMC_PROTOCOLS, Augmenter, ClientData, FedMCAlgorithm1, FedMCAugmenter,  # noqa: F401
                   FedMCFixed, GGEURAugmenter, OversampleAugmenter, build_augmenter, fill_sources, register)
