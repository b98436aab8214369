"""Fast paths. Each backend is one package here that, when imported, describes itself to
``geomkern._dispatch`` (``register_backend``: usable here, or why not and how to get it) and
registers its implementations per op and device type (``register``). They are declared here and
imported on the first dispatch (importing Triton alone took 0.26 s here)."""
from .. import _dispatch

_dispatch.declare_backend("native", "geomkern.backends.native")
_dispatch.declare_backend("triton", "geomkern.backends.triton")
_dispatch.declare_backend("cupy", "geomkern.backends.cupy")
