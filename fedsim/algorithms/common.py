"""Helpers the algorithms share: frozen model copies, server arithmetic, flat state dicts.

Algorithm state is a flat ``dict[str, Tensor]`` (safetensors-compatible, no pickle needed):
server tensors are keyed ``"<slot>/<param>"`` and per-client tensors ``"<slot>/<cid>/<param>"``.
Parameter names never contain "/", so the keys parse back unambiguously.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .base import ClientUpdate, Params


def frozen_copy(model: nn.Module, params: Params | None = None) -> nn.Module:
    """A copy of ``model`` (optionally loaded with ``params``) in eval mode with no gradients."""
    out = copy.deepcopy(model)
    if params is not None:
        out.load_state_dict(params)
    out.eval()
    out.requires_grad_(False)
    return out


def float_keys(params: Params) -> list[str]:
    return [k for k, v in params.items() if v.is_floating_point()]


def mean_extra(updates: list[ClientUpdate], key: str) -> torch.Tensor:
    """Uniform mean over the updates of one uploaded extra, in float64."""
    return sum(u.extras[key].to(torch.float64) for u in updates) / len(updates)


def put(out: dict, slot: str, params: Params) -> None:
    for k, v in params.items():
        out[f"{slot}/{k}"] = v.detach().clone()


def put_clients(out: dict, slot: str, per_client: dict[int, Params]) -> None:
    for cid, params in per_client.items():
        put(out, f"{slot}/{cid}", params)


def take(state: dict, slot: str) -> Params:
    prefix = slot + "/"
    return {k[len(prefix):]: v.detach().clone() for k, v in state.items()
            if k.startswith(prefix) and "/" not in k[len(prefix):]}


def take_clients(state: dict, slot: str) -> dict[int, Params]:
    prefix = slot + "/"
    out: dict[int, Params] = {}
    for k, v in state.items():
        if k.startswith(prefix):
            cid, name = k[len(prefix):].split("/", 1)
            out.setdefault(int(cid), {})[name] = v.detach().clone()
    return out


def check_slots(state: dict, slots: tuple[str, ...], algo: str) -> None:
    bad = sorted(k for k in state if k.split("/", 1)[0] not in slots)
    if bad:
        raise ValueError(f"{algo}: state has unknown key(s) {bad[:5]}; expected slots {list(slots)}")
