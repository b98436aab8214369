"""Fast paths. Each backend is one package here that, when imported, describes itself to
``geomkern._dispatch`` (``register_backend``: usable here, or why not and how to get it) and
registers its implementations per op and device type (``register``). They are declared here and
imported on the first dispatch (importing Triton alone took 0.26 s here)."""
import importlib
import pkgutil

from .. import _dispatch

_dispatch.declare_backend("native", "geomkern.backends.native")
_dispatch.declare_backend("triton", "geomkern.backends.triton")
_dispatch.declare_backend("cupy", "geomkern.backends.cupy")


def families(package: str, path, skip: tuple[str, ...] = ()) -> tuple:
    """The op-family modules of backend package ``package`` (its ``__name__`` and ``__path__``),
    imported, in name order: every module whose name does not start with "_", but those in
    ``skip``. A backend finds its families here, so a new family is its module and nothing else
    (docs/development.md, "Add an op with a native and a Triton backend")."""
    return tuple(importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(path)
                 if not m.name.startswith("_") and m.name not in skip)
