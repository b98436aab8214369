"""What fedsim's Flower apps put in messages, and the checks on what they take out.

* Model weights, algorithm state and uploaded extras travel as Flower ``ArrayRecord``s (one array
  per tensor, named as in the state dict).
* The geometry travels as the project's safetensors bytes (``Exchanged.to_bytes``: the same bytes
  ``save`` writes to a file) inside a ``ConfigRecord``; the receiver rebuilds it with
  ``from_bytes``, which checks format, version, kind, shapes and finiteness, so a malformed upload
  is refused with its reason.
* The run itself (RunConfig as JSON, which method, seed, round) goes in a ``ConfigRecord`` named
  ``job`` with every message, so a SuperNode needs nothing but its partition id.

Bytes: ``payload_bytes`` counts what a message carries on the wire in its records (tensor data
plus each array's .npy header, each safetensors blob with its JSON header); the run's
``bytes_up``/``bytes_down`` stay the tensor bytes the local engine counts (``geomkern.exchange.nbytes``).
"""
from __future__ import annotations

import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

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
