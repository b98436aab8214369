"""Every value of a run's configuration checked for type, range and finiteness before anything is
written: the RunConfig fields (from the CLI, a TOML file or a resumed run's config.json), the
model's parameters, each method's algorithm and augmenter parameters, the device string and the
output folder.

A rejected value raises :class:`ConfigError` (a ``ValueError``; the CLI prints it as one
``fedsim: error:`` line and exits with 2) naming the key, the flag that sets it, the value and
what is allowed, e.g. ``config: beta (--beta) must be a finite number > 0, got inf``.

Each algorithm and augmenter declares the kind of each of its parameters (``params``, beside its
``defaults``; the kinds are fedsim/config.py's); a parameter without one is still checked against
its default's type: a number must be a finite number, an integer an integer, a flag true or false.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
from pathlib import Path

import torch

from ._io import check_can_create
# the value kinds and ConfigError live in config.py (a leaf the plug-ins import); named here for the checks below
from .config import (MAX_EPSILON, MAX_SEED, Bool, Choice, ConfigError, Either, Int, ListOf,  # noqa: F401
                     Nothing, Real, Str, _kind_of_default, _show, check, fail)
from ._specs import MethodSpec, slug
from .algorithms import ALGORITHMS
from .augmenters import AUGMENTERS
from .data.partition import SCHEMES
from .models import MODELS, mlp_parameters


# RunConfig field -> the `fedsim run` flag that sets it (fields without one are config-file keys only)
FLAGS = {"dataset": "--dataset", "partition": "--partition", "beta": "--beta", "n_clients": "--clients",
         "min_size": "--min-size", "feature_shift": "--feature-shift", "feature_noise": "--feature-noise",
         "client_fraction": "--fraction", "rounds": "--rounds", "local_epochs": "--epochs",
         "batch_size": "--batch-size", "lr": "--lr", "model": "--model", "zero_shot": "--zero-shot",
         "seed": "--seed", "seeds": "--seeds", "device": "--device",
         "centralised": "--centralised", "val_fraction": "--val-fraction", "tune_lr": "--tune-lr",
         "tune_epochs": "--tune-epochs"}

# ------------------------------------------------------------------------------ the tables
def _run_fields():
    return {
        "dataset": Str(),
        "partition": Choice(*SCHEMES),
        "beta": Real(0, lo_open=True, note="the Dirichlet concentration; smaller = more skewed"),
        "n_clients": Int(1),
        "min_size": Int(1),
        # the views are unrelated from about 2 on (partition.client_rotation); far beyond, expm(angle * A)
        # is no rotation any more (1e-3 off orthogonal at 1e12) and then NaN, which training reported as
        # a divergence blamed on the learning rate
        "feature_shift": Real(0, 1000, note="the rotation's strength; views are unrelated from about 2 on"),
        "feature_noise": Real(0),
        "client_fraction": Real(0, 1, lo_open=True),
        "rounds": Int(1),
        "local_epochs": Int(1),
        "batch_size": Int(1),
        "lr": Real(0, lo_open=True),
        "momentum": Real(0, 1, hi_open=True),
        "weight_decay": Real(0),
        "model": Choice(*sorted(MODELS)),
        "zero_shot": Bool(),
        "seed": Int(0, MAX_SEED),
        "seeds": Int(1),
        # at most half: the rest trains
        "val_fraction": Real(0, 0.5, note="the share of each client's training rows held out for validation"),
        "tune_lr": ListOf(Real(0, lo_open=True)),
        "tune_epochs": ListOf(Int(1)),
    }


# model parameters, per model: the keyword arguments of its constructor
MODEL_PARAMS = {("linear", "scale"): Real(0, lo_open=True), ("linear", "learn_scale"): Bool(),
                ("mlp", "hidden"): Int(1), ("mlp", "depth"): Int(1),
                # the prompt head (fedsim/prompt.py)
                ("prompt", "n_ctx"): Either(Nothing(), Int(0)), ("prompt", "ctx_init"): Either(Nothing(), Str()),
                ("prompt", "class_text"): Choice("word", "lexnames", "name"), ("prompt", "csc"): Bool(),
                ("prompt", "scale"): Real(0, lo_open=True), ("prompt", "learn_scale"): Bool(),
                ("prompt", "tower"): Choice("minilm", "clip"), ("prompt", "allow_other_encoder"): Bool(),
                ("prompt", "tower_model"): Either(Nothing(), Str()),
                ("prompt", "tower_pretrained"): Either(Nothing(), Str())}

# ------------------------------------------------------------------------------ checks
def _where(field: str) -> str:
    return f"{field} ({FLAGS[field]})" if field in FLAGS else field


def check_device(where: str, v) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", v):
        fail(where, "'cpu', 'cuda' or 'cuda:N'", v)
    if v.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"config: {where} is {v!r} but CUDA is not available here; use 'cpu'")
        index = int(v.split(":")[1]) if ":" in v else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"config: {where} is {v!r} but this machine has {torch.cuda.device_count()} "
                              f"CUDA device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return v


def _table(where: str, v) -> dict:
    if not isinstance(v, dict):
        fail(where, "a table of parameters", v)
    for k in v:
        if not isinstance(k, str):
            fail(f"{where} keys", "strings", k)
    return v


def _params(where: str, given: dict, defaults: dict, table: dict, owner: str) -> None:
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"config: {where} has unknown key(s) {unknown}; {owner} takes "
                          f"{sorted(defaults) or 'none'}")
    for k, v in given.items():
        kind = table.get(k) or _kind_of_default(defaults[k])
        if kind is not None:
            given[k] = check(f"{where}.{k}", kind, v)


def _model_defaults(model: str) -> dict:
    sig = inspect.signature(MODELS[model].__init__)
    return {n: p.default for n, p in sig.parameters.items()
            if p.kind == p.KEYWORD_ONLY and p.default is not inspect.Parameter.empty}


def check_config(cfg) -> None:
    """Type, range and finiteness of every value of ``cfg`` (a RunConfig), in place (numpy
    integers become ints); raises :class:`ConfigError` naming the first bad one."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    kinds = _run_fields()
    for name, f in fields.items():
        if name in ("methods", "model_params", "device"):
            continue
        v = getattr(cfg, name)
        kind = kinds.get(name)
        if kind is None and f.default is not dataclasses.MISSING:
            kind = _kind_of_default(f.default)
        if kind is not None:
            setattr(cfg, name, check(_where(name), kind, v))
    if cfg.seed + cfg.seeds - 1 > MAX_SEED:
        raise ConfigError(f"config: seed (--seed) + seeds (--seeds) - 1 must be <= {MAX_SEED}, "
                          f"got {cfg.seed} + {cfg.seeds} - 1")
    check_device(_where("device"), cfg.device)
    params = _table("model_params", cfg.model_params)
    _params("model_params", params, _model_defaults(cfg.model),
            {k: v for (m, k), v in MODEL_PARAMS.items() if m == cfg.model}, f"model {cfg.model!r}")
    _check_methods(cfg.methods)


def _check_methods(methods) -> None:
    if not isinstance(methods, list) or not methods:
        fail("methods", "a non-empty list of methods ([[methods]] tables with name, algorithm, augmenter)",
             methods)
    runs = {}
    for i, m in enumerate(methods):
        if not isinstance(m, MethodSpec):
            fail(f"methods[{i}]", "a method (a [[methods]] table)", m)
        m.name = check(f"methods[{i}].name", Str(), m.name)
        where = f"methods[{m.name}]"
        s = slug(m.name)
        if not s:
            fail(f"{where}.name", "a name with at least one letter or digit (it names the run folder)", m.name)
        if m.name in runs.values():
            raise ConfigError(f"config: methods have the duplicate name {m.name!r}; every method needs its own")
        if s in runs:
            raise ConfigError(f"config: methods {runs[s]!r} and {m.name!r} would share the run folder "
                              f"runs/{s}-seed*; give them names that differ in letters or digits")
        runs[s] = m.name
        algo = check(f"{where}.algorithm", Choice(*sorted(ALGORITHMS)), m.algorithm.lower()
                     if isinstance(m.algorithm, str) else m.algorithm)
        aug = check(f"{where}.augmenter", Choice(*sorted(AUGMENTERS)), m.augmenter)
        ap = _table(f"{where}.algorithm_params", m.algorithm_params)
        _params(f"{where}.algorithm_params", ap, ALGORITHMS[algo].defaults, ALGORITHMS[algo].params,
                f"algorithm {algo!r}")
        gp = _table(f"{where}.augmenter_params", m.augmenter_params)
        _params(f"{where}.augmenter_params", gp, AUGMENTERS[aug].defaults, AUGMENTERS[aug].params,
                f"augmenter {aug!r}")
        p = {**AUGMENTERS[aug].defaults, **gp}
        if p.get("formulation") == "paper" and p.get("method") == "coordinates":
            raise ConfigError(f"config: {where}.augmenter_params: formulation 'paper' defines kernel-value "
                              "targets: use method 'gd' or 'fixed_point' with it (or formulation 'consistent')")
        if "epsilon" in gp and gp.get("epsilon_total") is not None:
            raise ConfigError(f"config: {where}.augmenter_params sets both epsilon (per release) and "
                              "epsilon_total (--epsilon-total, the whole budget split over the releases); "
                              "give one of them")


# ------------------------------------------------------------------------------ memory
# Where the free memory cannot be read (no /proc/meminfo, no sysconf), a run's model may take at
# most this many bytes: a laptop's worth, so that an absurd --model is still refused by name.
MEMORY_CAP_UNKNOWN = 16 * 2 ** 30
# cgroup files that bound this process's memory (v2, then v1): (limit, usage)
_CGROUP_MEMORY = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_memory(device: str) -> tuple[int, str]:
    """(bytes free for a run's tensors on ``device`` now, what that figure is): CUDA's free memory;
    on the CPU the kernel's MemAvailable, or less where a cgroup limits this process (a container's
    limit is what kills it, however much the host has free); MEMORY_CAP_UNKNOWN where neither can
    be read."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0]), f"free on {device}"
    free = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append((int(line.split()[1]) * 1024, "of memory available"))
    except (OSError, ValueError, IndexError):
        pass
    if not free:
        try:
            free.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "of memory free"))
        except (AttributeError, ValueError, OSError):
            pass
    for limit, usage in _CGROUP_MEMORY:
        try:
            cap, used = Path(limit).read_text().strip(), int(Path(usage).read_text())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2 ** 60:  # "max", or v1's huge number: no limit
            free.append((max(int(cap) - used, 0), f"left under this process's memory limit ({limit})"))
    if not free:
        return MEMORY_CAP_UNKNOWN, "that fedsim allows a model where the free memory cannot be read " \
                                   "(_validate_config.MEMORY_CAP_UNKNOWN)"
    return min(free)


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB"


def check_model_memory(cfg, dim: int, n_classes: int) -> None:
    """Refuse an mlp head (``cfg.model_params`` hidden x depth, on ``dim`` inputs and ``n_classes``
    classes) whose training cannot fit in the memory free now, before anything is written: ``fedsim
    run --model mlp:64x100000`` would otherwise allocate for minutes, leave a run folder and be
    killed. The figure is a lower bound: the float32 copies of the parameters that a round holds at
    once (the global model, the server's weights, a client's copy of them, the gradients, SGD's
    momentum, the aggregate, one update per selected client) and the activations a batch keeps for
    the backward pass (before and after each ReLU); an algorithm's own state (SCAFFOLD's control
    variates, MOON's previous models) only adds to it."""
    if cfg.model != "mlp":  # the other heads have fixed small sizes (linear: C x D) or a frozen tower
        return

    p = {**_model_defaults("mlp"), **cfg.model_params}
    hidden, depth = p["hidden"], p["depth"]
    n_selected = max(1, int(round(cfg.client_fraction * cfg.n_clients)))  # as the round loop selects
    copies = 5 + (cfg.momentum > 0) + n_selected

    def need(layers: int) -> int:
        return 4 * (copies * mlp_parameters(dim, n_classes, hidden=hidden, depth=layers)
                    + 2 * cfg.batch_size * hidden * layers)

    free, what = available_memory(cfg.device)
    if need(depth) <= free:
        return
    per_layer = need(2) - need(1)
    fits = 1 + (free - need(1)) // per_layer if need(1) <= free else 0
    hint = (f"at width {hidden} at most {fits} hidden layer(s) fit (mlp:{hidden}x{fits})" if fits
            else f"even one hidden layer of width {hidden} does not fit: give a smaller WIDTH")
    raise ConfigError(f"--model mlp:{hidden}x{depth}: this head has "
                      f"{mlp_parameters(dim, n_classes, hidden=hidden, depth=depth):,} parameters ({dim} inputs, "
                      f"{depth} hidden layer(s) of {hidden}, {n_classes} classes); training it holds at least "
                      f"{copies} float32 copies of them ({n_selected} of them the updates of the clients selected "
                      f"per round) and a batch's activations, {_gb(need(depth))}, more than the {_gb(free)} {what}. "
                      f"Give a smaller WIDTHxDEPTH ({hint}), select fewer clients per round (--fraction, "
                      "--clients), or run where more memory is free")


# ------------------------------------------------------------------------------ files and folders
def check_out(out, *, resume: bool) -> Path:
    """``--out`` (or ``--resume``'s folder) can hold a run: a folder, or a path whose nearest
    existing ancestor is a writable folder."""
    flag = "--resume" if resume else "--out"
    out = Path(out)
    if resume:
        if not out.is_dir():
            raise ConfigError(f"{flag} {out}: {'it is a file, not' if out.exists() else 'there is no'} "
                              "run folder there")
        return out
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {out} is an existing file; name a folder (new or holding no run)")
    if out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {out}: the folder is not writable")
    try:
        check_can_create(out, flag)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return out


# what config.json records as the engine a run was started on (runner.write_config_json): --engine's choices
RECORDED_ENGINES = ("local", "flower")


def read_config_json(path: Path) -> tuple[dict, str | None]:
    """A run's config.json (runner.write_config_json) as (its RunConfig keys, the engine it records:
    "local", "flower", or None in a run folder written before the engine was recorded), with a
    clear error for a damaged file. The string "inf" (or "-inf") in a params table is the infinite
    float it stands for (_io.json_text writes infinities so): the params tables are the only place a
    value may be infinite (fedmc's epsilon and epsilon_total), and a string "inf" means nothing else
    there; elsewhere (a method or dataset named "inf") it stays a string."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); it is the run's configuration, so the "
                          "run cannot be resumed: start it again with another --out") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object of configuration keys, got {_show(data)}")
    engine = data.pop("engine", None)
    if engine not in (None, *RECORDED_ENGINES):
        raise ConfigError(f"{path}: engine must be one of {list(RECORDED_ENGINES)} (the engine the run was "
                          f"started on), got {_show(engine)}")

    def number(v):
        if v in ("inf", "-inf"):
            return float(v)
        if isinstance(v, list):
            return [number(x) for x in v]
        if isinstance(v, dict):
            return {k: number(x) for k, x in v.items()}
        return v

    # a run folder written before the validation split holds no val_fraction: it resumes as it ran, without one
    data.setdefault("val_fraction", 0.0)
    # anything malformed is left as it is, for check_config to name
    if isinstance(data.get("model_params"), dict):
        data["model_params"] = number(data["model_params"])
    for m in data.get("methods") if isinstance(data.get("methods"), list) else ():
        for key in ("algorithm_params", "augmenter_params"):
            if isinstance(m, dict) and isinstance(m.get(key), dict):
                m[key] = number(m[key])
    return data, engine


# What `--resume DIR` may change: only the number of rounds, upwards (the first rounds are the same
# whatever the total, so a longer run continues exactly as one started with the larger number).
RESUMABLE = ("rounds",)


def apply_resume_changes(cfg, changes: dict, out) -> list[str]:
    """Apply ``changes`` (RunConfig field -> value given with ``--resume``) to the resumed ``cfg``:
    the safe ones (more rounds) are applied, a value equal to the run's is accepted, anything
    else is refused naming the flag. Returns the descriptions of what changed."""
    applied = []
    for key, value in changes.items():
        old = getattr(cfg, key)
        if key == "methods":
            same = [dataclasses.asdict(m) for m in value] == [dataclasses.asdict(m) for m in old]
            if not same:
                raise ConfigError(f"--resume {out}: --algorithms/--augmenters/--epsilon-total would change the "
                                  "run's methods; a resumed run keeps its configuration (only --rounds may grow): "
                                  "start a new run with another --out to change them")
            continue
        flag = FLAGS.get(key, key)
        if value == old and type(value) is type(old):
            continue
        if key in RESUMABLE:
            value = check(_where(key), Int(1), value)
            if value < old:
                raise ConfigError(f"--resume {out}: {flag} {value} is fewer than the {old} rounds the run "
                                  "was started with; a resumed run can only grow")
            split = [m.name for m in cfg.methods if m.augmenter == "fedmc"
                     and m.augmenter_params.get("protocol") == "algorithm1"
                     and m.augmenter_params.get("epsilon_total") not in (None, math.inf)]
            if split:
                raise ConfigError(f"--resume {out}: {flag} {value}: methods {split} split epsilon_total "
                                  f"(--epsilon-total) over the run's {old} rounds (FedMC algorithm1: one DP release "
                                  "per round), so more rounds would overspend it; start a new run with another --out")
            setattr(cfg, key, value)
            applied.append(f"{key} {old} -> {value}")
            continue
        raise ConfigError(f"--resume {out}: {flag} {value!r} differs from the run's {key} = {old!r}; a resumed "
                          "run keeps its configuration (only --rounds may grow): drop the flag, or start a "
                          "new run with another --out")
    return applied


def check_cli_numbers(args) -> None:
    """The numeric flags of every subcommand that are not configuration keys of a run (those are
    checked with the RunConfig): range and finiteness, naming the flag."""
    cores = os.cpu_count() or 1
    kinds = {
        "threads": Int(0, cores), "n": Int(1), "dim": Int(1), "clusters": Int(1), "components": Int(1),
        "basis": Int(1), "holdout": Int(1), "steps": Int(1), "chunk_size": Int(1), "workers": Int(0),
        "test_fraction": Real(0, 1, lo_open=True, hi_open=True),
        "epsilon_total": Real(0, MAX_EPSILON, lo_open=True, inf_ok=True,
                              note="a larger one protects nothing: inf = no noise"),
    }
    if args.command != "run":  # fedsim run's --seed and --batch-size are RunConfig keys
        kinds.update(seed=Int(0, MAX_SEED), batch_size=Int(1))
    for dest, kind in kinds.items():
        v = getattr(args, dest, None)
        if v is not None and not kind.ok(v):
            what = kind.describe() + (" (0: torch's choice; at most this machine's cores)" if dest == "threads" else "")
            raise ConfigError(f"--{dest.replace('_', '-')} must be {what}, got {_show(v)}")
