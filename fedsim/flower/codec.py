"""What fedsim's Flower apps put in messages, and the checks on what they take out.

* Model weights, algorithm state and uploaded extras travel as Flower ``ArrayRecord``s (one array
  per tensor, named as in the state dict).
* The geometry travels as the project's safetensors bytes (``Exchanged.to_bytes``: the same bytes
  ``save`` writes to a file) inside a ``ConfigRecord``; the receiver rebuilds it with
  ``from_bytes``, which checks format, version, kind, shapes and finiteness, so a malformed upload
  is refused with its reason.
* The run itself (RunConfig as JSON, which method, seed, round) goes in a ``ConfigRecord`` named
  ``job`` with every message, so a SuperNode needs nothing but its partition id.
* An augmenter's exchange payloads (fedsim.augmenters.Augmenter: upload / download /
  client_state) travel as ``put`` writes them under a name N: ``N`` (a ConfigRecord: numbers,
  strings, lists of ints, and each container as its bytes), ``N.arrays`` (an ArrayRecord: the
  tensors) and ``N.schema`` (what each entry is: a tensor, a value, a container or a list of
  containers with its format and kind, an empty list, or None); ``take`` rebuilds it, each
  container through its own ``from_bytes`` (only the project's container classes are built, never
  arbitrary code).

Bytes: ``payload_bytes`` counts what a message carries on the wire in its records (tensor data
plus each array's .npy header, each safetensors blob with its JSON header); the run's
``bytes_up``/``bytes_down`` stay the tensor bytes the local engine counts (``geomkern.exchange.nbytes``).
"""
from __future__ import annotations

import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from geomkern.exchange import Exchanged

JOB = "job"


def arrays(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def tensors(record: ArrayRecord | None, *, device="cpu") -> dict[str, torch.Tensor]:
    if record is None:
        return {}
    return {k: v.to(device) for k, v in record.to_torch_state_dict().items()}


def job(cfg_json: str, method: int, seed: int, round: int = 0) -> ConfigRecord:
    return ConfigRecord({"config": cfg_json, "method": method, "seed": seed, "round": round})


def read_job(content: RecordDict) -> tuple[str, int, int, int]:
    j = content.config_records[JOB]
    return str(j["config"]), int(j["method"]), int(j["seed"]), int(j["round"])


def config_json(cfg) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True)


def payload_bytes(content: RecordDict) -> int:
    """Bytes the records of a message carry (arrays with their headers, blobs, strings and numbers
    as Flower counts them), the job record excluded (it is the same small table in every message)."""
    total = 0
    for name, rec in content.items():
        if name != JOB:
            total += rec.count_bytes()
    return total


def check_params(name: str, params: dict[str, torch.Tensor], template: dict[str, torch.Tensor]) -> None:
    """Uploaded weights must have the global model's entries, shapes and dtypes."""
    if set(params) != set(template):
        raise ValueError(f"{name}: entries {sorted(set(params) ^ set(template))[:5]} differ from the "
                         "global model's")
    for k, t in template.items():
        p = params[k]
        if p.shape != t.shape or p.dtype != t.dtype:
            raise ValueError(f"{name}: {k} is {p.dtype} {tuple(p.shape)}, expected {t.dtype} {tuple(t.shape)}")


# ---------------------------------------------------------------------- exchange payloads
def _containers() -> dict[tuple[str, str], type]:
    """(format, kind) -> container class, for every Exchanged subclass (geomkern.fedmc and
    geomkern.ggeur are imported by the augmenters)."""
    out, todo = {}, [Exchanged]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls._KIND:
            out[(cls._FORMAT, cls._KIND)] = cls
    return out


def put(records: RecordDict, name: str, payload: dict | None, *, blobs: dict | None = None) -> None:
    """Write ``payload`` (an exchange payload; None: nothing to send) into ``records`` under
    ``name`` (replacing what was there). ``blobs``: a cache id(container) -> bytes, so that one
    container sent to many clients is serialised once."""
    for key in (name, f"{name}.arrays", f"{name}.schema"):
        if key in records:
            del records[key]
    if payload is None:
        records[f"{name}.schema"] = ConfigRecord({"__none__": True})
        return
    blobs = {} if blobs is None else blobs

    def blob(c: Exchanged) -> bytes:
        if id(c) not in blobs:
            blobs[id(c)] = (c, c.to_bytes())  # the container is kept alive with its id
        return blobs[id(c)][1]

    config, arrays, schema = {}, {}, {}
    for k, v in payload.items():
        if isinstance(v, torch.Tensor):
            arrays[k], schema[k] = v.detach().cpu().contiguous(), "tensor"
        elif isinstance(v, Exchanged):
            config[k], schema[k] = blob(v), f"container:{v._FORMAT}/{v._KIND}"
        elif isinstance(v, (list, tuple)) and v and all(isinstance(e, Exchanged) for e in v):
            config[k] = [blob(e) for e in v]
            schema[k] = f"containers:{v[0]._FORMAT}/{v[0]._KIND}"
        elif v is None:
            schema[k] = "null"
        elif isinstance(v, (list, tuple)) and not v:  # Flower cannot count the bytes of an empty list
            schema[k] = "empty"
        else:
            config[k], schema[k] = (list(v) if isinstance(v, tuple) else v), "value"
    records[name] = ConfigRecord(config)
    records[f"{name}.arrays"] = ArrayRecord(arrays)
    records[f"{name}.schema"] = ConfigRecord(schema)


def take(records: RecordDict, name: str, *, source: str, device="cpu") -> dict | None:
    """The payload ``put`` wrote under ``name`` ({} if there is none; None if "nothing" was sent),
    every container checked by its ``from_bytes`` (errors name ``source`` and the entry)."""
    if f"{name}.schema" not in records:
        return {}
    schema = records.config_records[f"{name}.schema"]
    if schema.get("__none__"):
        return None
    config = records.config_records.get(name, ConfigRecord())
    arrays = tensors(records.array_records.get(f"{name}.arrays"), device=device)
    known = _containers()
    out = {}
    for k, tag in schema.items():
        tag = str(tag)
        if (tag == "tensor" and k not in arrays) or (tag not in ("tensor", "null", "empty") and k not in config):
            raise ValueError(f"{source}: entry {k!r} is listed ({tag}) but not sent")
        if tag == "tensor":
            out[k] = arrays[k]
        elif tag == "null":
            out[k] = None
        elif tag == "empty":
            out[k] = []
        elif tag == "value":
            out[k] = config[k]
        else:
            many, _, fk = tag.partition(":")
            cls = known.get(tuple(fk.split("/", 1)))
            if cls is None or many not in ("container", "containers"):
                raise ValueError(f"{source}: entry {k!r} is of an unknown kind {tag!r}")
            if many == "container":
                out[k] = cls.from_bytes(config[k], source=f"{source} ({k})", device=device)
            elif not isinstance(config[k], list):
                raise ValueError(f"{source}: entry {k!r} is listed as a list of containers ({tag}) but holds "
                                 f"a {type(config[k]).__name__}")
            else:
                out[k] = [cls.from_bytes(b, source=f"{source} ({k}[{i}])", device=device)
                          for i, b in enumerate(config[k])]
    return out


def exchange(step: str, round: int | None) -> ConfigRecord:
    """Which exchange step a message belongs to (round None: the one-time exchange)."""
    return ConfigRecord({"step": step, "round": -1 if round is None else round})


def read_exchange(content: RecordDict) -> tuple[str, int | None]:
    e = content.config_records["exchange"]
    r = int(e["round"])
    return str(e["step"]), None if r < 0 else r
