"""The plug-in registries together (algorithms, augmenters, models, partition schemes), and what
needs all of them: a plug-in's name looked up (``plugin_class``, the ``lookup`` of fedsim/config.py's
``--set`` and ``[params]`` parsing), a RunConfig checked against them (``validate``), a TOML config
file read (``load_config``) and what ``--resume`` may change (``apply_resume_changes``).

fedsim/config.py holds the configuration and its value kinds but imports no registry (the plug-ins
import it to declare their ``params``); this module is the one place that checks a configuration
against the registries, before anything is written. runner.plan adds only the checks that need the
dataset and the engine.
"""
from __future__ import annotations

import math
from dataclasses import asdict

from . import config
from .algorithms import ALGORITHMS, build_algorithm
from .augmenters import AUGMENTERS, build_augmenter
from .config import CENTRALISED, Choice, ConfigError, MethodSpec, RunConfig, Str, check, check_params, fail, slug
from .data.partition import SCHEMES
from .models import MODELS, apply_run_defaults, has_trunk, model_defaults


def plugin_class(plugin: str) -> tuple[str, type]:
    """("algorithm" | "augmenter", that plug-in's class: its ``defaults`` and ``params``) of a
    plug-in name; unknown names raise, listing the known ones."""
    if plugin in ALGORITHMS:
        return "algorithm", ALGORITHMS[plugin]
    if plugin in AUGMENTERS:
        return "augmenter", AUGMENTERS[plugin]
    raise ValueError(f"{plugin!r} is neither an algorithm nor an augmenter; algorithms: "
                     f"{', '.join(sorted(ALGORITHMS))}; augmenters: {', '.join(sorted(AUGMENTERS))}")


def load_config(path) -> RunConfig:
    """A TOML config file (top-level keys = RunConfig fields; [[methods]] tables; [params.PLUGIN]
    tables of hyper-parameters for every method using that algorithm or augmenter)."""
    return config.config_from_tables(config.read_config_toml(path), lookup=plugin_class,
                                     where=f"config file {path}")


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
        ap = config.check_table(f"{where}.algorithm_params", m.algorithm_params)
        check_params(f"{where}.algorithm_params", ap, ALGORITHMS[algo].defaults, ALGORITHMS[algo].params,
                     f"algorithm {algo!r}")
        gp = config.check_table(f"{where}.augmenter_params", m.augmenter_params)
        check_params(f"{where}.augmenter_params", gp, AUGMENTERS[aug].defaults, AUGMENTERS[aug].params,
                     f"augmenter {aug!r}")
        p = {**AUGMENTERS[aug].defaults, **gp}
        if p.get("formulation") == "paper" and p.get("method") == "coordinates":
            raise ConfigError(f"config: {where}.augmenter_params: formulation 'paper' defines kernel-value "
                              "targets: use method 'gd' or 'fixed_point' with it (or formulation 'consistent')")
        if "epsilon" in gp and gp.get("epsilon_total") is not None:
            raise ConfigError(f"config: {where}.augmenter_params sets both epsilon (per release) and "
                              "epsilon_total (--epsilon-total, the whole budget split over the releases); "
                              "give one of them")


def _choices() -> dict:
    """The kinds of the RunConfig fields a registry names (config.run_fields' ``choices``)."""
    return {"partition": Choice(*SCHEMES), "model": Choice(*sorted(MODELS))}


def check_config(cfg: RunConfig) -> None:
    """Type, range and finiteness of every value of ``cfg``, in place (numpy integers become ints);
    raises :class:`ConfigError` naming the first bad one."""
    config.check_fields(cfg, _choices())
    params = config.check_table("model_params", cfg.model_params)
    check_params("model_params", params, model_defaults(cfg.model), MODELS[cfg.model].params,
                 f"model {cfg.model!r}")
    _check_methods(cfg.methods)


def validate(cfg: RunConfig) -> RunConfig:
    """``cfg`` checked, in place, before anything is written: the model's rounds / batch_size / lr
    where they are None, every value against its kind (check_config), then what the value tables
    cannot see: the plug-ins' own checks and how they combine. Returns ``cfg``."""
    apply_run_defaults(cfg)
    check_config(cfg)

    def bad(name, why):
        raise ValueError(f"config: {name} {why}")

    if cfg.centralised and any(slug(m.name) == slug(CENTRALISED) for m in cfg.methods):
        bad("methods", f"has a method named like {CENTRALISED!r}, the row centralised adds: rename it")
    if (cfg.tune_lr or cfg.tune_epochs) and cfg.val_fraction == 0:
        bad("val_fraction (--val-fraction)", "is 0, but tuning (--tune, --tune-lr, --tune-epochs) chooses on "
            "the validation rows: give a fraction > 0 (default 0.1)")
    cfg.tune_lr, cfg.tune_epochs = sorted(set(cfg.tune_lr)), sorted(set(cfg.tune_epochs))
    for m in cfg.methods:
        algo = build_algorithm(m.algorithm, **m.algorithm_params)  # unknown hyper-parameters raise here
        try:
            algo.check_run(cfg.local_epochs)
        except ValueError as exc:
            bad(f"methods[{m.name}].algorithm_params", f"do not fit the run: {exc}")
        if getattr(algo, "needs_trunk", False) and not has_trunk(MODELS[cfg.model]):
            bad("model", f"is {cfg.model!r}, which has no trunk, but methods[{m.name}].algorithm "
                f"{m.algorithm!r} trains a classifier on trunk features: use model='mlp'")
        augmenter = build_augmenter(m.augmenter, **m.augmenter_params)
        if m.augmenter_params.get("epsilon_total") not in (None, math.inf):  # fedmc's budget
            augmenter.rounds = cfg.rounds
            augmenter.release_epsilon()  # a budget too small to split is refused here, not in round 1
    return cfg


def _budget_split_over_rounds(m: MethodSpec, old: int, new: int) -> bool:
    """Whether method ``m`` spends a finite epsilon_total in releases sized by the number of rounds,
    so ``new`` rounds instead of ``old`` would change what each release spends (FedMC's Algorithm 1:
    one release per round). Asked of the augmenter itself; it was a test of augmenter "fedmc" with
    protocol "algorithm1" written out, which missed the default protocol left unset."""
    if m.augmenter_params.get("epsilon_total") in (None, math.inf):
        return False
    augmenter = build_augmenter(m.augmenter, **m.augmenter_params)
    augmenter.rounds = old
    before = augmenter.release_epsilon()
    augmenter.rounds = new
    return augmenter.release_epsilon() != before


# What `--resume DIR` may change: only the number of rounds, upwards (the first rounds are the same
# whatever the total, so a longer run continues exactly as one started with the larger number).
RESUMABLE = ("rounds",)


def apply_resume_changes(cfg: RunConfig, changes: dict, out) -> list[str]:
    """Apply ``changes`` (RunConfig field -> value given with ``--resume``) to the resumed ``cfg``:
    the safe ones (more rounds) are applied, a value equal to the run's is accepted, anything
    else is refused naming the flag. Returns the descriptions of what changed."""
    applied = []
    for key, value in changes.items():
        old = getattr(cfg, key)
        if key == "methods":
            same = [asdict(m) for m in value] == [asdict(m) for m in old]
            if not same:
                raise ConfigError(f"--resume {out}: --algorithms/--augmenters/--epsilon-total would change the "
                                  "run's methods; a resumed run keeps its configuration (only --rounds may grow): "
                                  "start a new run with another --out to change them")
            continue
        flag = config.FLAGS.get(key, key)
        if value == old and type(value) is type(old):
            continue
        if key in RESUMABLE:
            # the field's own kind, as a new run checks it (rounds' upper bound included)
            value = check(config.field_label(key), config.run_fields(_choices())[key], value)
            if value < old:
                raise ConfigError(f"--resume {out}: {flag} {value} is fewer than the {old} rounds the run "
                                  "was started with; a resumed run can only grow")
            split = [m.name for m in cfg.methods if _budget_split_over_rounds(m, old, value)]
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
