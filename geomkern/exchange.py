"""What clients and servers exchange: one container convention for FedMC and GGEUR.

Every object a federated method sends over the wire (``ggeur.ClassStatistics``,
``ggeur.GlobalGeometry``, ``fedmc.GAB``, ``fedmc.PrototypeRelease``, ``fedmc.LocalGeometry``,
``fedmc.GeometryDictionary``) is a dataclass derived from :class:`Exchanged`, and its methods are
the one way to serialise it (no module-level save/load beside them):

* it is validated on construction (shapes, dtypes, devices, finiteness), so an invalid one cannot
  exist, whether it was computed locally, rebuilt from a dict or read from a file;
* ``to_dict()`` gives its tensors and numbers by field name and ``from_dict(d)`` rebuilds it (the
  same checks), for a codebase that moves plain dicts over its own transport;
* ``save(path)`` / ``load(path)`` use one file format: safetensors (tensors only, never pickle)
  with JSON metadata ``{"format", "version", "kind", "scalars"}``; ``load`` checks all of it and
  then constructs the object, so a file gets the same validation as a local object;
* ``nbytes()`` is the size of its tensors as stored, the number the simulators account.

:func:`nbytes` is the one byte counter for tensors (containers, model updates, prototypes).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import ClassVar

import torch

FORMAT_VERSION = 1


def nbytes(*tensors: torch.Tensor) -> int:
    """Bytes of the tensors as stored (dense, element size x count), summed."""
    return sum(t.numel() * t.element_size() for t in tensors)


class Exchanged:
    """Base of the exchanged containers. A subclass is a ``@dataclass(eq=False)`` that sets

    ``_FORMAT``  the file format name ("geomkern.fedmc", "geomkern.ggeur"),
    ``_KIND``    its kind inside that format ("local_geometry", ...),
    ``_TENSORS`` its tensor fields, ``_SCALARS`` its number fields (floats; inf allowed),

    and implements ``_check()``: validate the fields (raising ``ValueError``/``TypeError`` that
    name them) and store normalised values back (e.g. contiguous tensors).
    """

    _FORMAT: ClassVar[str] = ""
    _KIND: ClassVar[str] = ""
    _TENSORS: ClassVar[tuple[str, ...]] = ()
    _SCALARS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        self._check()

    def _check(self) -> None:
        raise NotImplementedError

    def nbytes(self) -> int:
        """Size in bytes of the tensors as stored (dense: nothing is packed)."""
        return nbytes(*(getattr(self, k) for k in self._TENSORS))

    def to_dict(self) -> dict:
        """The fields by name: tensors (e.g. for ``safetensors.torch.save``) and numbers."""
        return {k: getattr(self, k) for k in self._TENSORS + self._SCALARS}

    @classmethod
    def from_dict(cls, d: dict):
        """Rebuild from ``to_dict()``'s output (validated like any construction)."""
        keys = cls._TENSORS + cls._SCALARS
        if not isinstance(d, dict):
            raise TypeError(f"{cls.__name__}.from_dict expects a dict of tensors, got {type(d).__name__}")
        missing = [k for k in keys if k not in d]
        extra = [k for k in d if k not in keys]
        if missing or extra:
            raise ValueError(f"{cls.__name__}.from_dict needs exactly the keys {keys}; "
                             f"missing {missing}, unexpected {extra}")
        return cls(**{k: d[k] for k in keys})

    def save(self, path) -> None:
        """Write to ``path``: safetensors holding the tensors, the numbers in its JSON metadata."""
        Path(path).write_bytes(self.to_bytes())

    def to_bytes(self) -> bytes:
        """The bytes ``save`` writes (for a transport that moves bytes, e.g. a Flower message):
        ``nbytes()`` of tensor data plus the safetensors header (JSON: names, dtypes, shapes, offsets
        and the metadata)."""
        from safetensors.torch import save

        scalars = {k: float(getattr(self, k)) for k in self._SCALARS}
        meta = {"format": self._FORMAT, "version": str(FORMAT_VERSION), "kind": self._KIND,
                "scalars": json.dumps({k: (v if math.isfinite(v) else str(v)) for k, v in scalars.items()})}
        return save({k: getattr(self, k).detach().contiguous().cpu() for k in self._TENSORS}, metadata=meta)

    @classmethod
    def load(cls, path, *, device: str | torch.device = "cpu"):
        """Read a file written by ``save`` of this class; ``ValueError`` naming the problem for a
        missing, malformed, corrupted or mismatched file (format, version, kind, keys, and every
        check the constructor makes)."""
        kind, d = read(path, cls._FORMAT)
        if kind != cls._KIND:
            raise ValueError(f"{path} holds a {kind}, expected a {cls._KIND}")
        return cls._build(path, d, device)

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "bytes", device: str | torch.device = "cpu"):
        """``load`` for the bytes of ``to_bytes`` (same checks); errors name ``source``."""
        kind, d = read_bytes(data, cls._FORMAT, source=source)
        if kind != cls._KIND:
            raise ValueError(f"{source} holds a {kind}, expected a {cls._KIND}")
        return cls._build(source, d, device)

    @classmethod
    def _build(cls, path, d: dict, device):
        d = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
        try:
            return cls.from_dict(d)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from None


def read(path, fmt: str) -> tuple[str, dict]:
    """(kind, fields) of a file in format ``fmt`` (the header checks; the fields are unchecked)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises several types for a bad header or truncation
        raise ValueError(f"{path} is not a readable safetensors file ({exc})") from None
    return _check_header(path, fmt, meta, tensors)


def read_bytes(data: bytes, fmt: str, *, source: str = "bytes") -> tuple[str, dict]:
    """:func:`read` for the bytes of ``to_bytes``; errors name ``source``."""
    import safetensors.torch

    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"{source} must be bytes, got {type(data).__name__}")
    try:
        tensors = safetensors.torch.load(bytes(data))
        n = int.from_bytes(data[:8], "little")  # the header: u64 length, then JSON
        meta = json.loads(bytes(data[8:8 + n])).get("__metadata__") or {}
    except Exception as exc:  # a bad header or truncation
        raise ValueError(f"{source} is not a readable safetensors blob ({exc})") from None
    return _check_header(source, fmt, meta, tensors)


def _check_header(path, fmt: str, meta: dict, tensors: dict) -> tuple[str, dict]:
    if meta.get("format") != fmt:
        raise ValueError(f"{path} is not a {fmt} file (metadata format={meta.get('format')!r})")
    if meta.get("version") != str(FORMAT_VERSION):
        raise ValueError(f"{path} has format version {meta.get('version')}, this geomkern reads {FORMAT_VERSION}")
    try:
        scalars = {k: float(v) for k, v in json.loads(meta.get("scalars", "{}")).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: malformed scalar metadata ({exc})") from None
    clash = set(scalars) & set(tensors)
    if clash:
        raise ValueError(f"{path}: {sorted(clash)} stored both as tensors and as numbers")
    return str(meta.get("kind")), {**tensors, **scalars}

