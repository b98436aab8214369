"""fedsim's methods as Flower apps (optional extra: ``pip install 'geomkern[flower]'``).

``client_app.app`` (a Flower ClientApp) and ``apps.app`` (a Flower ServerApp) run the same
algorithm hooks, augmenters and round loop as fedsim's local engine: ``fedsim run --engine flower``
runs a configuration in Flower's Simulation Engine (Ray backend), ``fedsim flower-demo`` under a
real ``flower-superlink`` with one ``flower-supernode`` per client (docs/flower.md).
"""
from __future__ import annotations

import importlib.util


def require_flower() -> None:
    """A clear error when Flower is not installed (it is an optional extra)."""
    if importlib.util.find_spec("flwr") is None:
        raise ValueError("the Flower engine needs Flower: pip install 'geomkern[flower]' "
                         "(flwr[simulation] >= 1.41, which brings Ray)")
