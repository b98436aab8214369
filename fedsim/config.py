"""A run's configuration and everything that reads it: ``RunConfig`` and its methods
(``MethodSpec``), the kinds of a value (``Int``, ``Real``, ``Choice``, ...) and the error a bad one
raises (``ConfigError``), the TOML config files and a run folder's config.json, ``--set`` flags and
``[params.PLUGIN]`` tables.

A leaf: it imports no other fedsim module and no registry (tests/test_structure.py), so every
plug-in declares its ``params`` with these kinds beside its ``defaults``. What needs the registries
takes them as an argument: ``lookup`` (a plug-in name -> its kind and class, fedsim/plugins.py's
``plugin_class``) and ``choices`` (the registries' names for ``partition`` and ``model``);
fedsim/plugins.py checks a whole RunConfig against them (``validate``).

A rejected value raises :class:`ConfigError` (a ``ValueError``; the CLI prints it as one
``fedsim: error:`` line and exits with 2) naming the key, the flag that sets it, the value and what
is allowed, e.g. ``config: beta (--beta) must be a finite number > 0, got inf``. A plug-in
parameter without a declared kind is still checked against its default's type.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, packaged as tomli
    import tomli as tomllib


class ConfigError(ValueError):
    """A configuration value fedsim cannot run with."""


# the largest seed: torch.manual_seed takes 64-bit seeds, numpy's SeedSequence any non-negative int
MAX_SEED = 2 ** 63 - 1
# Upper bounds that catch a mistake before a run starts what it cannot finish (issue 44's harness:
# rounds = 2**70 in a TOML file, or 1e11 seeds, were accepted): far above any run in the docs, and a
# learning rate must be a float32 (the optimisers' dtype; 1e308 failed in the first step naming no
# argument).
MAX_ROUNDS = 10 ** 6
MAX_EPOCHS = 10 ** 5
MAX_SEEDS = 10 ** 4
MAX_LR = 3.4e38  # float32's largest finite value, rounded down
# The largest finite DP epsilon (per release or in total): a bound of e^100 on the likelihood ratio
# protects nothing, and the PLD accountant that calibrates the noise grows with epsilon (2.6 s at
# 100, 30 s at 1000; at 1e4 it ran out of memory and --epsilon-total 1e308 had the run killed).
# inf, not a huge number, is how a run asks for no noise.
MAX_EPSILON = 100.0


def _show(v) -> str:
    if isinstance(v, str):
        return f"{v!r} (a string)"
    if isinstance(v, bool):
        return f"{v} (true/false)"
    if isinstance(v, (dict, list, tuple)):
        return f"{v!r} (a {'table' if isinstance(v, dict) else 'list'})"
    if v is None:
        return "nothing (None)"
    return repr(v) if isinstance(v, numbers.Number) else f"{v!r} (a {type(v).__name__})"


def fail(where: str, what: str, v) -> None:
    raise ConfigError(f"config: {where} must be {what}, got {_show(v)}")


# ------------------------------------------------------------------------------ value kinds
class _Kind:
    """What every kind shares: a value that passes ``ok`` is kept as it is, unless the kind says
    otherwise (``norm``)."""

    def norm(self, v):
        return v


class Int(_Kind):
    def __init__(self, minimum: int | None = None, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum

    def describe(self) -> str:
        lo, hi = self.minimum, self.maximum
        return "an integer" + (f" in [{lo}, {hi}]" if lo is not None and hi is not None
                               else f" >= {lo}" if lo is not None else f" <= {hi}" if hi is not None else "")

    def ok(self, v) -> bool:
        return (isinstance(v, numbers.Integral) and not isinstance(v, bool)
                and (self.minimum is None or v >= self.minimum) and (self.maximum is None or v <= self.maximum))

    def norm(self, v):
        return int(v)


class Real(_Kind):
    """A real number in a range; finite unless ``inf_ok`` (then +inf is allowed too)."""

    def __init__(self, lo=None, hi=None, *, lo_open=False, hi_open=False, inf_ok=False, note=""):
        self.lo, self.hi, self.lo_open, self.hi_open, self.inf_ok, self.note = lo, hi, lo_open, hi_open, inf_ok, note

    def describe(self) -> str:
        if self.lo is not None and self.hi is not None:
            rng = f" in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            rng = f" {'>' if self.lo_open else '>='} {self.lo:g}"
        elif self.hi is not None:
            rng = f" {'<' if self.hi_open else '<='} {self.hi:g}"
        else:
            rng = ""
        kind = "a number" + rng + " (inf allowed)" if self.inf_ok else "a finite number" + rng
        return kind + (f" ({self.note})" if self.note else "")

    def ok(self, v) -> bool:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            return False
        v = float(v)
        if math.isnan(v) or (math.isinf(v) and not (self.inf_ok and v > 0)):
            return False
        if math.isinf(v):  # inf_ok: +inf stands apart from the finite range (an epsilon's "no noise")
            return True
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)

    def norm(self, v):
        return v if isinstance(v, (int, float)) else float(v)


class Bool(_Kind):
    def describe(self) -> str:
        return "true or false"

    def ok(self, v) -> bool:
        return isinstance(v, bool)


class Choice(_Kind):
    def __init__(self, *values):
        self.values = values

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)

    def ok(self, v) -> bool:
        return isinstance(v, str) and v in self.values


class Str(_Kind):
    def describe(self) -> str:
        return "a non-empty string"

    def ok(self, v) -> bool:
        return isinstance(v, str) and v.strip() != ""


class Either(_Kind):
    def __init__(self, *kinds):
        self.kinds = kinds

    def describe(self) -> str:
        return " or ".join(k.describe() for k in self.kinds)

    def ok(self, v) -> bool:
        return any(k.ok(v) for k in self.kinds)

    def norm(self, v):
        return next(k for k in self.kinds if k.ok(v)).norm(v)


class ListOf(_Kind):
    """A list (possibly empty) of values of one kind."""

    def __init__(self, kind):
        self.kind = kind

    def describe(self) -> str:
        return f"a list of values each {self.kind.describe()}"

    def ok(self, v) -> bool:
        return isinstance(v, list) and all(self.kind.ok(x) for x in v)

    def norm(self, v):
        return [self.kind.norm(x) for x in v]


class Nothing(_Kind):
    """None (a Python caller's "not set"; TOML has no null, so a file leaves the key out)."""

    def describe(self) -> str:
        return "unset"

    def ok(self, v) -> bool:
        return v is None


def check(where: str, kind, v):
    if not kind.ok(v):
        fail(where, kind.describe(), v)
    return kind.norm(v)


def _kind_of_default(default):
    """What a parameter without a table entry must be: its default's type."""
    if isinstance(default, bool):
        return Bool()
    if isinstance(default, numbers.Integral):
        return Int()
    if isinstance(default, numbers.Real):
        return Real(inf_ok=math.isinf(default))
    if isinstance(default, str):
        return Str()
    return None  # None, containers: nothing to infer


def check_table(where: str, v) -> dict:
    """``v`` is a table (dict) with string keys."""
    if not isinstance(v, dict):
        fail(where, "a table of parameters", v)
    for k in v:
        if not isinstance(k, str):
            fail(f"{where} keys", "strings", k)
    return v


def check_params(where: str, given: dict, defaults: dict, params: dict, owner: str) -> None:
    """A plug-in's (or model's) parameters ``given``, in place: only keys of its ``defaults``, each
    of the kind its ``params`` declares (else its default's type)."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"config: {where} has unknown key(s) {unknown}; {owner} takes "
                          f"{sorted(defaults) or 'none'}")
    for k, v in given.items():
        kind = params.get(k) or _kind_of_default(defaults[k])
        if kind is not None:
            given[k] = check(f"{where}.{k}", kind, v)


# ------------------------------------------------------------------------------ methods
@dataclass
class MethodSpec:
    name: str
    algorithm: str = "fedavg"
    augmenter: str = "none"
    algorithm_params: dict = field(default_factory=dict)
    augmenter_params: dict = field(default_factory=dict)


def default_methods() -> list[MethodSpec]:
    # the matched-compute controls (docs/design.md note 9): FedAvg+oversample for GGEUR (extra rows),
    # FedAvg itself for FedMC under its default Algorithm 1 (one calibrated row per real row)
    return [MethodSpec("FedAvg"), MethodSpec("FedAvg+oversample", augmenter="oversample"),
            MethodSpec("FedAvg+GGEUR", augmenter="ggeur"), MethodSpec("FedAvg+FedMC", augmenter="fedmc")]


# the name of the ceiling row RunConfig.centralised adds (fedsim run --centralised)
CENTRALISED = "Centralised"


def slug(name: str) -> str:
    """A method's name as a folder name (runs/<slug>-seed<N>)."""
    return "".join(ch if ch.isalnum() else "-" for ch in name).strip("-").lower()


def merge_params(owner: str, noun: str, defaults: dict, given: dict) -> dict:
    """``defaults`` overridden by ``given``; a key ``defaults`` lacks is an error naming ``owner``."""
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"{owner} has no {noun}(s) {sorted(unknown)}; it takes {sorted(defaults) or 'none'}")
    return {**defaults, **given}


# ------------------------------------------------------------------------------ the run
@dataclass
class RunConfig:
    dataset: str = "default"
    partition: str = "dirichlet"
    beta: float = 0.1
    n_clients: int = 10
    min_size: int = 10
    feature_shift: float = 0.0  # per-client rotation strength (partition.feature_shift); 0 = none
    feature_noise: float = 0.0  # norm of the fixed per-row noise of that option
    client_fraction: float = 1.0
    # rounds, batch_size, lr: None = the model's default (models.RUN_DEFAULTS), filled in by
    # plugins.validate (which checks a RunConfig against the registries this leaf cannot import)
    rounds: int | None = None
    local_epochs: int = 1
    batch_size: int | None = None
    lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 0.0
    model: str = "linear"
    model_params: dict = field(default_factory=dict)
    zero_shot: bool = False  # initialise the linear head from the dataset's class_text embeddings
    # also train the ceiling row CENTRALISED: one client holding every client's training rows as that
    # client sees them (its view under a feature shift; FedAvg, no augmenter, the same head, rounds x
    # local_epochs epochs over the pooled rows), tested like the federated methods
    centralised: bool = False
    # share of each client's training rows held out as its validation rows (seeded, stratified per
    # class: data/split.validation_split): the convergence check and --tune read them, training and
    # the augmenters never see them; 0 = none (no convergence check, no tuning)
    val_fraction: float = 0.1
    # --tune: the grids each method's lr / local_epochs is chosen from, on the validation rows
    # (tune_method); [] = that value is not tuned
    tune_lr: list = field(default_factory=list)
    tune_epochs: list = field(default_factory=list)
    methods: list[MethodSpec] = field(default_factory=default_methods)
    seed: int = 0
    seeds: int = 1
    device: str = "cpu"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"config: must be a table of RunConfig keys, got a {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        if "methods" in d:
            if not isinstance(d["methods"], list):
                raise ConfigError(f"config: methods must be a list of [[methods]] tables (name, algorithm, "
                                  f"augmenter, ...), got {d['methods']!r}")
            mk = {f.name for f in fields(MethodSpec)}
            methods = []
            for i, m in enumerate(d["methods"]):
                if not isinstance(m, dict) or "name" not in m or set(m) - mk:
                    raise ValueError(f"config: methods[{i}] must be a table with 'name' and only {sorted(mk)}")
                methods.append(MethodSpec(**m))
            d["methods"] = methods
        return cls(**d)


# RunConfig field -> the `fedsim run` flag that sets it (fields without one are config-file keys only)
FLAGS = {"dataset": "--dataset", "partition": "--partition", "beta": "--beta", "n_clients": "--clients",
         "min_size": "--min-size", "feature_shift": "--feature-shift", "feature_noise": "--feature-noise",
         "client_fraction": "--fraction", "rounds": "--rounds", "local_epochs": "--epochs",
         "batch_size": "--batch-size", "lr": "--lr", "model": "--model", "zero_shot": "--zero-shot",
         "seed": "--seed", "seeds": "--seeds", "device": "--device",
         "centralised": "--centralised", "val_fraction": "--val-fraction", "tune_lr": "--tune-lr",
         "tune_epochs": "--tune-epochs"}


def field_label(field_name: str) -> str:
    """A RunConfig field as an error names it: with its flag, e.g. 'beta (--beta)'."""
    return f"{field_name} ({FLAGS[field_name]})" if field_name in FLAGS else field_name


def run_fields(choices: dict) -> dict:
    """The kind of each RunConfig field; ``choices``: the kinds of the fields a registry names
    (partition: the partition schemes, model: the models)."""
    return {
        "dataset": Str(),
        "partition": choices["partition"],
        "beta": Real(0, lo_open=True, note="the Dirichlet concentration; smaller = more skewed"),
        "n_clients": Int(1),
        "min_size": Int(1),
        # the views are unrelated from about 2 on (partition.client_rotation); far beyond, expm(angle * A)
        # is no rotation any more (1e-3 off orthogonal at 1e12) and then NaN, which training reported as
        # a divergence blamed on the learning rate
        "feature_shift": Real(0, 1000, note="the rotation's strength; views are unrelated from about 2 on"),
        "feature_noise": Real(0),
        "client_fraction": Real(0, 1, lo_open=True),
        "rounds": Int(1, MAX_ROUNDS),
        "local_epochs": Int(1, MAX_EPOCHS),
        "batch_size": Int(1),
        "lr": Real(0, MAX_LR, lo_open=True),
        "momentum": Real(0, 1, hi_open=True),
        "weight_decay": Real(0),
        "model": choices["model"],
        "zero_shot": Bool(),
        "seed": Int(0, MAX_SEED),
        "seeds": Int(1, MAX_SEEDS),
        # at most half: the rest trains
        "val_fraction": Real(0, 0.5, note="the share of each client's training rows held out for validation"),
        "tune_lr": ListOf(Real(0, MAX_LR, lo_open=True)),
        "tune_epochs": ListOf(Int(1, MAX_EPOCHS)),
    }


def check_device(where: str, v) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", v):
        fail(where, "'cpu', 'cuda' or 'cuda:N'", v)
    if v.startswith("cuda"):
        import torch  # here only: `fedsim presets` and `fedsim --help` read this module without torch

        if not torch.cuda.is_available():
            raise ConfigError(f"config: {where} is {v!r} but CUDA is not available here; use 'cpu'")
        index = int(v.split(":")[1]) if ":" in v else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"config: {where} is {v!r} but this machine has {torch.cuda.device_count()} "
                              f"CUDA device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return v


def check_fields(cfg: RunConfig, choices: dict) -> None:
    """Type, range and finiteness of every field of ``cfg`` but its methods and model_params, in
    place (numpy integers become ints); raises :class:`ConfigError` naming the first bad one."""
    kinds = run_fields(choices)
    for f in fields(cfg):
        if f.name in ("methods", "model_params", "device"):
            continue
        kind = kinds.get(f.name)
        if kind is None and f.default is not dataclasses.MISSING:
            kind = _kind_of_default(f.default)
        if kind is not None:
            setattr(cfg, f.name, check(field_label(f.name), kind, getattr(cfg, f.name)))
    if cfg.seed + cfg.seeds - 1 > MAX_SEED:
        raise ConfigError(f"config: seed (--seed) + seeds (--seeds) - 1 must be <= {MAX_SEED}, "
                          f"got {cfg.seed} + {cfg.seeds} - 1")
    check_device(field_label("device"), cfg.device)


# ------------------------------------------------------------------------------ files
def read_config_toml(path) -> dict:
    """A TOML config file's tables as a dict (a clear error for a missing or malformed file)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} {'is not a file' if path.exists() else 'does not exist'}")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None


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
    # anything malformed is left as it is, for check_fields and plugins.validate to name
    if isinstance(data.get("model_params"), dict):
        data["model_params"] = number(data["model_params"])
    for m in data.get("methods") if isinstance(data.get("methods"), list) else ():
        for key in ("algorithm_params", "augmenter_params"):
            if isinstance(m, dict) and isinstance(m.get(key), dict):
                m[key] = number(m[key])
    return data, engine


# ------------------------------------------------------------------------------ --set and [params]
# a plug-in name -> ("algorithm" | "augmenter", its class: ``defaults`` and ``params``); unknown names
# raise ValueError listing the known ones (fedsim/plugins.py's plugin_class)
Lookup = Callable[[str], tuple]


def _scalar(text: str):
    """A --set value as a TOML scalar (512, 0.01, 1e-5, inf, true, "1/D"); text that is no TOML
    value (an unquoted string such as 1/D or median) is taken as that string."""
    try:
        v = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if isinstance(v, (dict, list)):
        raise ValueError(f"--set takes one value (number, true/false or string), got {text!r}")
    return v


def parse_set(items: list[str] | None, lookup: Lookup) -> dict[str, dict]:
    """``--set PLUGIN.KEY=VALUE`` flags -> {plugin: {key: value}}. The plug-in is an algorithm or
    augmenter name and the key one of its ``defaults``; anything else is an error naming the flag
    and the known names."""
    out: dict[str, dict] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        plugin, dot, key = name.strip().partition(".")
        if not eq or not dot or not plugin or not key or not value.strip():
            raise ValueError(f"--set {item!r}: expected PLUGIN.KEY=VALUE, e.g. --set fedmc.n_base=512 or "
                             "--set fedprox.mu=0.01")
        plugin, key = plugin.lower(), key.strip()
        try:
            kind, cls = lookup(plugin)
        except ValueError as exc:
            raise ValueError(f"--set {item}: {exc}") from None
        defaults = cls.defaults
        if key not in defaults:
            raise ValueError(f"--set {item}: {kind} {plugin!r} has no parameter {key!r}; it takes "
                             f"{', '.join(sorted(defaults)) or 'none'}")
        out.setdefault(plugin, {})[key] = _scalar(value.strip())
    for plugin, table in out.items():  # type and range of each value, naming the flag
        kind, cls = lookup(plugin)
        check_params(f"--set {plugin}", table, cls.defaults, cls.params, f"{kind} {plugin!r}")
    return out


def check_params_table(params, where: str, lookup: Lookup) -> dict[str, dict]:
    """A ``[params.PLUGIN]`` table of a preset or config file: known plug-ins and keys only."""
    if not isinstance(params, dict):
        raise ValueError(f"{where}: params must be a table of [params.PLUGIN] tables, got {params!r}")
    for plugin, table in params.items():
        try:
            kind, cls = lookup(plugin)
        except ValueError as exc:
            raise ValueError(f"{where}: [params.{plugin}]: {exc}") from None
        defaults = cls.defaults
        if not isinstance(table, dict):
            raise ValueError(f"{where}: params.{plugin} must be a table of {kind} parameters, got {table!r}")
        unknown = sorted(set(table) - set(defaults))
        if unknown:
            raise ValueError(f"{where}: [params.{plugin}] has unknown key(s) {unknown}; {kind} {plugin!r} takes "
                             f"{', '.join(sorted(defaults)) or 'none'}")
        # each value against its kind here, as --set does: a table no method uses is never checked later
        check_params(f"{where} [params.{plugin}]", table, defaults, cls.params, f"{kind} {plugin!r}")
    return params


def apply_params(methods, params: dict[str, dict], lookup: Lookup, *, override: bool, source: str = "") -> None:
    """Give every method that uses plug-in P the parameters ``params[P]`` (in place).
    ``override``: they replace the method's own values (``--set``); otherwise a method's own
    ``algorithm_params`` / ``augmenter_params`` win (a preset's or config file's [params]).
    With ``source`` (the flag), a plug-in no method uses is an error naming it."""
    for plugin, table in params.items():
        kind, _ = lookup(plugin)
        users = [m for m in methods if (m.algorithm.lower() if kind == "algorithm" else m.augmenter) == plugin]
        if not users and source:
            key, value = next(iter(table.items()))
            raise ValueError(f"{source} {plugin}.{key}={value}: no method uses the {kind} {plugin!r} "
                             f"(methods: {', '.join(m.name for m in methods)}); add it with "
                             f"--{'algorithms' if kind == 'algorithm' else 'augmenters'}")
        for m in users:
            attr = f"{kind}_params"
            own = getattr(m, attr)
            setattr(m, attr, {**own, **table} if override else {**table, **own})


def config_from_tables(*tables: dict, lookup: Lookup, where: str = "config") -> RunConfig:
    """A RunConfig from config tables (a preset's, then a config file's): later tables override
    earlier ones key by key ([[methods]] as a whole, [params.PLUGIN] per key), and each
    [params.PLUGIN] table is given to every method using that plug-in, under the method's own
    algorithm_params / augmenter_params (fedsim/presets/__init__.py)."""
    merged: dict = {}
    params: dict = {}
    for t in tables:
        t = dict(t)
        for plugin, kv in check_params_table(t.pop("params", {}), where, lookup).items():
            params.setdefault(plugin, {}).update(kv)
        merged.update(t)
    cfg = RunConfig.from_dict(merged)
    apply_params(cfg.methods, params, lookup, override=False)
    return cfg


# ------------------------------------------------------------------------------ other subcommands' flags
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
