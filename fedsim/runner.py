"""A run: a validated ``RunConfig`` (config.py; checked against the registries by plugins.validate)
with the checks that need its dataset and engine (``plan``), every (method, seed) through the one round loop
(loop.run_rounds; ``GlobalFederation`` here, personal.PersonalFederation for the personalised
methods), its clients reached through an engine (engine.py: ``LocalEngine`` by default, the Flower
engine in fedsim/flower, which imports this module), and its outputs.

Determinism: all randomness is derived from (seed, round, client) — client sampling, shuffling,
augmentation, the augmenters' set-up (one derivation, ``_seeds.py``) — so a run resumed from its
last checkpoint continues exactly as an uninterrupted one. Each (method, seed) writes
``checkpoint.pt`` after every round (atomic rename); the run's ``results.json`` appears only when
every method and seed has finished. Timings go to ``timings.json`` (they differ between runs; the
results do not): per (method, seed) the seconds of each round's training and geometry, the
one-time geometry set-up and the wall time (``wall_s``).
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from . import _checkpoint, report
from ._io import atomic_write, check_out, json_text, remove_stale_tmp
from .algorithms import build_algorithm
from .augmenters import build_augmenter
from .client import DivergedError, client_round
from .config import CENTRALISED, ConfigError, MethodSpec, RunConfig, default_methods, read_config_json, slug
from .data import load_dataset
from .data.clients import client_data, make_partition
from .data.partition import USES_BETA
from .engine import Engine, LocalEngine
from .loop import Federation, run_rounds
from .metrics import CONVERGENCE_WINDOW, accuracy, convergence, evaluate, final_report
from .models import build_model, check_model_memory, run_defaults
from .personal import (TUNING_NEEDS, PersonalFederation, is_personal_run, personal_dataset, personal_unused,
                       run_personal_method)
from .plugins import apply_resume_changes, load_config, validate
from .prompt import check_prompt_dataset

# public here too: RunConfig, MethodSpec, slug, CENTRALISED and default_methods live in config.py (a
# leaf), load_config and validate in plugins.py; client_round in client.py (the engines' one client step)
__all__ = ["CENTRALISED", "MethodSpec", "RunConfig", "client_round", "default_methods", "load_config",
           "run", "run_method", "slug", "validate"]


def write_config_json(cfg: RunConfig, out: Path, engine: str) -> None:
    """out/config.json: every RunConfig field (what ``--resume`` reads back through
    config.read_config_json) and ``engine``, the engine the run was started on ("local" or
    "flower", as ``--engine``), a record only: it is not a RunConfig field. An infinite value
    (fedmc's epsilon, epsilon_total) is the string "inf" (_io.json_text)."""
    with atomic_write(out / "config.json") as tmp:
        tmp.write_text(json_text({**cfg.to_dict(), "engine": engine}))


def results_config(cfg: RunConfig) -> dict:
    """The configuration results.json records: every RunConfig field, less those which played no
    part, so that they are not reported: ``beta`` where the partition draws no Dirichlet (iid);
    on the personalised path the fields it never reads (personal.personal_unused: its clients keep their
    own 80/20 split and view, and a toy generates its own clients), and ``model`` as what trained
    ("personal": PersonalNet, which "linear", the default, stands for there). (config.json keeps
    every field: a resumed run's checkpoints are verified against them.)"""
    d = cfg.to_dict()
    if cfg.partition not in USES_BETA:
        del d["beta"]
    if is_personal_run(cfg):
        for f in ("val_fraction", *personal_unused(cfg)):
            d.pop(f, None)
        d["model"] = "personal"
    return d


# ------------------------------------------------------------------------------ helpers
def initial_model(cfg: RunConfig, ds, seed: int):
    """The round-0 global model of seed ``seed`` on cfg.device (the global RNG is left as it was)."""
    dev = torch.device(cfg.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(cfg.model, ds.dim, ds.n_classes, class_names=ds.class_names,
                            **cfg.model_params).to(dev)
    if cfg.zero_shot and cfg.model != "prompt":  # the prompt head starts from its class-name prompts itself
        model.init_from_text(ds.class_text.to(device=dev, dtype=torch.float32))
    return model


# ------------------------------------------------------------------------------ one method, one seed
class GlobalFederation(Federation):
    """One global model trained by ``spec``'s algorithm, its clients reached through ``engine``,
    evaluated on the test rows and on every client's validation rows after each round (loop.py
    runs the rounds)."""

    def __init__(self, cfg: RunConfig, spec: MethodSpec, seed: int, ds, clients, x_test, engine: Engine):
        dev = torch.device(cfg.device)
        self.cfg, self.spec, self.seed, self.ds, self.clients, self.engine = cfg, spec, seed, ds, clients, engine
        self.n_clients = len(clients)
        self.x_test, self.y_test = x_test.to(dev), ds.y_test.to(dev)
        self.x_val, self.y_val = torch.cat([c.x_val for c in clients]), torch.cat([c.y_val for c in clients])
        self.d_test = None if ds.d_test is None else ds.d_test.to(dev)
        self.model = initial_model(cfg, ds, seed)
        self.algo = build_algorithm(spec.algorithm, **spec.algorithm_params)
        self.algo.seed = seed  # algorithms that draw (FedMP's bank samples) derive from (seed, round, client)
        self.global_params = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.template = self.global_params
        self.privacy, self.aug_state, self.zero_shot = None, {}, None
        self.augmenter = None

    def restore(self, state):
        self.global_params, self.privacy = state["global"], state.get("privacy")
        self.aug_state = state.get("augmenter", {})
        if state.get("zero_shot") is not None:  # else the value computed for round 0 (the same model)
            self.zero_shot = state["zero_shot"]
        self.algo.load_state_dict(state["algorithm"])

    def begin(self, start, timings):
        cfg, ds = self.cfg, self.ds
        self.augmenter = build_augmenter(self.spec.augmenter, **self.spec.augmenter_params)
        self.augmenter.rounds = cfg.rounds
        # the server's side (and, on the local engine, every client's): uploads are checked against D and dtype
        self.augmenter.bind(n_classes=ds.n_classes, seed=self.seed, dim=ds.dim, dtype=ds.x_train.dtype)
        t0 = time.perf_counter()
        self.engine.start(cfg, self.spec, self.seed, self.clients, self.augmenter, self.model, ds.n_classes)
        self.engine.exchange(self.augmenter, None, list(range(self.n_clients)))
        self.augmenter.load_state_dict(self.aug_state)  # a per-round augmenter's state up to the checkpoint's round
        timings["geometry_setup_s"] = timings.get("geometry_setup_s", 0.0) + (time.perf_counter() - t0)
        self.privacy = self.augmenter.privacy(self.n_clients)
        self.setup_up, self.setup_down = self.augmenter.setup_bytes

    def round(self, r, selected):
        cfg, spec, algo, augmenter = self.cfg, self.spec, self.algo, self.augmenter
        t0 = time.perf_counter()
        self.engine.exchange(augmenter, r, selected)
        (up, down), t_geom = augmenter.round_bytes, time.perf_counter() - t0
        try:  # the selected clients train (on the engine), in cid order
            done = self.engine.train(spec, self.seed, r, selected, self.global_params, algo)
        except DivergedError as exc:  # args: (what, the client's id)
            raise DivergedError(_diverged(cfg, spec, self.seed, r, f"client {exc.args[1]}", exc.args[0],
                                          self.clients)) from None
        updates, t_train = [], 0.0
        for upd, dt_geom, dt_train in done:
            t_geom, t_train = t_geom + dt_geom, t_train + dt_train
            updates.append(upd)
            up += algo.upload_bytes(upd)
            down += algo.download_bytes(self.global_params)
        self.global_params = algo.aggregate(self.global_params, updates, n_clients=self.n_clients)
        bad = [k for k, v in self.global_params.items()
               if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:
            raise DivergedError(_diverged(cfg, spec, self.seed, r, f"the server's aggregation ({spec.algorithm})",
                                          f"the global weights {bad} became NaN/Inf", self.clients))
        self.model.load_state_dict(self.global_params)
        acc, per_domain = evaluate(self.model, self.x_test, self.y_test, self.d_test, self.ds.n_domains)
        if r == 0:
            up, down = up + self.setup_up, down + self.setup_down
        entry = {"accuracy": acc, "per_domain": per_domain, "train_loss": float(np.mean([u.loss for u in updates])),
                 "bytes_up": up, "bytes_down": down}
        if self.y_val.numel():
            entry["val_accuracy"] = accuracy(self.model, self.x_val, self.y_val)
        self.privacy = augmenter.privacy(self.n_clients)  # a per-round exchange spends more each round
        return entry, {"train_s": t_train, "geometry_s": t_geom}

    def state(self):
        return {"global": self.global_params, "algorithm": self.algo.state_dict(), "privacy": self.privacy,
                "augmenter": self.augmenter.state_dict(), "zero_shot": self.zero_shot}


def run_method(cfg: RunConfig, spec: MethodSpec, seed: int, ds, parts, run_dir: Path,
               *, progress: bool = True, dataset_sum: str | None = None, engine: Engine | None = None,
               pooled: bool = False) -> tuple[dict, dict]:
    """Train ``spec`` for cfg.rounds rounds through loop.run_rounds (continuing from
    run_dir/checkpoint.pt if present, once verified), evaluating the global model on the test rows
    and on every client's validation rows after each round. ``pooled``: one client holding every
    client's rows (the centralised row: client_data). ``dataset_sum``: ds's checksum if already
    computed. ``engine``: how the clients are reached (engine.Engine; default a LocalEngine, every
    client in this process). Returns (metrics, timings). A non-finite loss or weights raise
    DivergedError."""
    engine = engine or LocalEngine(progress=progress)
    clients, x_test = client_data(cfg, ds, parts, seed, pooled=pooled)
    fed = GlobalFederation(cfg, spec, seed, ds, clients, x_test, engine)
    # the centralised row under a shift trains on the clients' views (it once took one client's view for all:
    # such a checkpoint is refused)
    views = "pooled client views" if pooled and (cfg.feature_shift or cfg.feature_noise) else None
    fingerprint = _checkpoint.fingerprint(cfg, spec.name, seed, data=views)
    dataset_sum = dataset_sum or _checkpoint.dataset_checksum(ds)
    if cfg.zero_shot or cfg.model == "prompt":  # round 0: the untrained model (kept by a resume)
        fed.zero_shot = evaluate(fed.model, fed.x_test, fed.y_test)[0]
    history, timings = run_rounds(fed, cfg, spec, seed, run_dir, fingerprint=fingerprint, dataset_sum=dataset_sum,
                                  device=torch.device(cfg.device), progress=progress)
    engine.finish(spec, seed, fed.global_params, timings)
    return {**_metrics(history, ds, fed.privacy, fed.zero_shot),
            **_final_report(fed.model, fed.global_params, fed.x_test, fed.y_test, clients, ds.n_classes)}, timings


def _diverged(cfg: RunConfig, spec: MethodSpec, seed: int, r: int, where: str, what, clients) -> str:
    """The message of a run that diverged: where, what, and the likely causes."""
    norm = max(float(torch.linalg.vector_norm(c.x.to(torch.float64), dim=1).max()) for c in clients if c.x.numel())
    causes = []
    if norm > 10:  # unit-norm embeddings are what the defaults are made for
        causes.append(f"the embeddings are of huge scale (row norms up to {norm:.3g}; fedsim import "
                      "L2-normalises rows by default)")
    if spec.algorithm_params:
        causes.append(f"the algorithm's hyper-parameters {spec.algorithm_params}")
    default_lr = run_defaults(cfg.model)["lr"]
    if cfg.lr > default_lr or not causes:
        causes.append(f"the learning rate lr = {cfg.lr:g} is too large for this model and data "
                      f"(default for model {cfg.model!r}: {default_lr:g})")
    kept = f" (rounds 1-{r} are checkpointed)" if r > 1 else " (round 1 is checkpointed)" if r else ""
    return (f"{spec.name} seed {seed} diverged in round {r + 1}, {where}: {what}. Likely cause: "
            + "; or ".join(causes) + f". results.json is not written{kept}; run again with the fix as a new "
            "run (a resumed run keeps its configuration)")


def _final_report(model, global_params, x_test, y_test, clients, n_classes: int) -> dict:
    """Per-class and per-client accuracy and the confusion matrix of the final global model
    (fedsim/metrics.py: a client holds a class with >= 1 training row of it)."""
    model.load_state_dict(global_params)
    return final_report(model, x_test, y_test, [c.y for c in clients], n_classes)


def _metrics(history: list[dict], ds, privacy: dict | None = None, zero_shot: float | None = None) -> dict:
    accs = [h["accuracy"] for h in history]
    last = history[-1]
    out = {"final_accuracy": accs[-1], "last5_mean": float(np.mean(accs[-5:])), "accuracy": accs,
           "train_loss": [h["train_loss"] for h in history],
           "bytes_up": int(sum(h["bytes_up"] for h in history)),
           "bytes_down": int(sum(h["bytes_down"] for h in history))}
    if all("val_accuracy" in h for h in history):  # the run has validation rows (val_fraction > 0)
        out["val_accuracy"] = [h["val_accuracy"] for h in history]
        out.update(convergence(out["val_accuracy"]))
    if last["per_domain"]:
        out["per_domain"] = dict(zip(ds.domain_names, last["per_domain"]))
        out["per_domain_std"] = float(np.std([a for a in last["per_domain"] if a is not None]))
    if privacy is not None:
        out["privacy"] = privacy
    if zero_shot is not None:  # test accuracy of the round-0 model (class-name prompts, no training)
        out["zero_shot_accuracy"] = zero_shot
    return out


# ------------------------------------------------------------------------------ tuning
# what --tune chooses by: the validation accuracy of a grid point's last rounds (metrics.CONVERGENCE_WINDOW,
# fewer in a shorter run), mean over those rounds and over the seeds
TUNE_SCORE = "validation accuracy, mean over the last 5 rounds and over the seeds"
# --tune without --tune-lr: the learning rates lr x these (lr: --lr or the model's default)
TUNE_LR_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)


def tuned(cfg: RunConfig) -> bool:
    return bool(cfg.tune_lr or cfg.tune_epochs)


def at_point(cfg: RunConfig, lr: float, local_epochs: int) -> RunConfig:
    """``cfg`` at one grid point: the plain run (no tuning) with this lr and local_epochs, so its
    checkpoints are a plain run's (the grid does not enter its fingerprint)."""
    return replace(cfg, lr=lr, local_epochs=local_epochs, tune_lr=[], tune_epochs=[])


def tune_method(cfg: RunConfig, spec: MethodSpec, seeds: list[int], ds, partitions, out: Path, *, pooled: bool,
                progress: bool, dataset_sum: str) -> tuple[dict, dict, dict]:
    """Run ``spec`` at every grid point (cfg.tune_lr x cfg.tune_epochs; an empty grid is the run's own
    value) for every seed, each a plain run in out/tune/ (checkpointed, so a resume continues it), and
    choose the point with the best TUNE_SCORE on the validation rows; the test rows play no part. A
    grid point that diverges on some seed scores nothing. Returns (the tuning record: the grid's
    scores, the chosen lr / local_epochs, and ``at_edge``: those chosen at an end of a grid of several
    values; the chosen point's metrics per seed; its timings per seed, each with ``tuning_wall_s``:
    the seed's wall time over the whole grid)."""
    points, runs = [], []
    wall = {str(s): 0.0 for s in seeds}
    for epochs in cfg.tune_epochs or [cfg.local_epochs]:
        for lr in cfg.tune_lr or [cfg.lr]:
            c = at_point(cfg, lr, epochs)
            per_seed, tim, point = {}, {}, {"lr": lr, "local_epochs": epochs}
            for s in seeds:
                run_dir = out / "tune" / f"{slug(spec.name)}-lr{lr:g}-ep{epochs}-seed{s}"
                try:
                    per_seed[str(s)], tim[str(s)] = run_method(c, spec, s, ds, partitions[s], run_dir, pooled=pooled,
                                                               progress=progress, dataset_sum=dataset_sum)
                except DivergedError:
                    point["diverged"] = f"seed {s}"
                    break
                wall[str(s)] += tim[str(s)].get("wall_s", 0.0)
            if "diverged" not in point:
                scores = {s: float(np.mean(v["val_accuracy"][-CONVERGENCE_WINDOW:])) for s, v in per_seed.items()}
                point.update(score=float(np.mean(list(scores.values()))), per_seed=scores)
            points.append(point)
            runs.append((per_seed, tim))
    ok = [i for i, p in enumerate(points) if "score" in p]
    if not ok:
        raise DivergedError(f"--tune: {spec.name} diverged at every grid point (lr {cfg.tune_lr or [cfg.lr]}, "
                            f"local epochs {cfg.tune_epochs or [cfg.local_epochs]}); give smaller learning "
                            "rates (--tune-lr)")
    best = max(ok, key=lambda i: points[i]["score"])  # ties: the first in grid order (fewer epochs, smaller lr)
    per_seed, tim = runs[best]
    for s, t in tim.items():
        t["tuning_wall_s"] = wall[s]
    record = {"score": TUNE_SCORE, "lr": points[best]["lr"], "local_epochs": points[best]["local_epochs"],
              "grid": points}
    # a choice at an end of its grid may only be the best of a range that stops too early
    for key, grid in (("lr", cfg.tune_lr), ("local_epochs", cfg.tune_epochs)):
        if len(grid) > 1 and record[key] in (grid[0], grid[-1]):
            record.setdefault("at_edge", {})[key] = "min" if record[key] == grid[0] else "max"
    return record, per_seed, tim


# ------------------------------------------------------------------------------ whole run
def _warn_if_not_unit_norm(ds) -> None:
    """One stderr line when the rows are not L2-normalised: the methods then see different data."""
    norms = torch.linalg.vector_norm(torch.cat([ds.x_train, ds.x_test]).to(torch.float64), dim=1)
    # 1e-2: rows normalised in float32 and stored as float16 are off by up to ~1e-3.
    if bool(((norms - 1).abs() > 1e-2).any()):
        print(f"fedsim: warning: the rows of dataset {ds.name!r} are not unit-norm (norms "
              f"{float(norms.min()):.3g} to {float(norms.max()):.3g}): GGEUR and FedMC work on the raw vectors "
              "while the cosine head normalises them (fedsim import L2-normalises by default)",
              file=sys.stderr)


def _finished(out: Path, cfg: RunConfig) -> bool:
    """results.json exists for this many rounds (a run resumed with more rounds is not finished)."""
    try:
        return json.loads((out / "results.json").read_text())["config"]["rounds"] == cfg.rounds
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError):
        return False  # a damaged results.json is written again at the end


@dataclass
class Plan:
    """A run checked and ready (``plan``): nothing is written yet. ``execute`` runs it."""
    cfg: RunConfig
    out: Path
    resume: bool
    engine_name: str
    write_config: bool
    seeds: list[int]
    ds: object | None  # the global path's Dataset (None on the personalised path)
    partitions: dict  # seed -> the global path's partition
    dataset_sum: str | None
    personal_data: dict  # seed -> the personalised path's PersonalDataset

    @property
    def personal(self) -> bool:
        return self.ds is None


def plan(cfg: RunConfig, out_dir, *, resume: bool = False, changes: dict | None = None,
         engine: Engine | None = None) -> Plan:
    """Every check of ``run`` (the configuration, the run folder, the dataset, what the engine can
    run), before anything is written; see ``run`` for the arguments."""
    engine = engine or LocalEngine()
    engine_name = engine.name
    if resume and not engine.resumable:
        raise ValueError(f"--resume {out_dir}: a run on the {engine.name} engine cannot be resumed (its clients' "
                         "state lived in the nodes of that run); start it again with another --out")
    out = check_out(out_dir, resume=resume)
    stored_rounds = None
    if resume:
        cfg_path = out / "config.json"
        if not cfg_path.is_file():
            raise ValueError(f"--resume {out}: no config.json there, so it is not a fedsim run folder")
        try:
            stored, recorded_engine = read_config_json(cfg_path)
            cfg = validate(RunConfig.from_dict(stored))
        except ValueError as exc:
            raise ConfigError(f"--resume {out}: {cfg_path} cannot be used ({exc}); the run cannot be resumed: "
                              "start it again with another --out") from None
        stored_rounds = cfg.rounds
        # config.json, rewritten when --rounds grows, keeps the engine the run was started on
        engine_name = recorded_engine or engine_name
        apply_resume_changes(cfg, changes or {}, out)
        if _finished(out, cfg):
            raise ValueError(f"--resume {out}: that run already finished (results.json exists); pass "
                             f"--rounds N with N > {cfg.rounds} to continue it")
    else:
        validate(cfg)
        if (out / "config.json").is_file():
            raise ValueError(f"{out} already holds a run; resume it with --resume {out} or choose "
                             "another --out")
    engine.check(cfg)  # e.g. the Flower engine refuses personalised runs and FedMP by name
    personal = is_personal_run(cfg)
    if tuned(cfg) and not engine.tunes:
        raise ConfigError(f"{TUNING_NEEDS} drop --engine {engine.name} to tune, then run the chosen values there "
                          "with --lr/--epochs")
    if personal:
        PersonalFederation.check(cfg)  # what the personalised path cannot run (its own checks, personal.py)
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    write_config = not resume or cfg.rounds != stored_rounds
    if personal:  # personalised algorithms, or clients in their own feature spaces (toy:NAME)
        # config.json is written again on resume (it may have raised rounds)
        return Plan(cfg, out, resume, engine_name, True, seeds, None, {}, None,
                    {s: personal_dataset(cfg, s) for s in seeds})
    ds = load_dataset(cfg.dataset)  # before writing anything: a bad dataset leaves no run folder
    check_model_memory(cfg, ds.dim, ds.n_classes)  # before the model is built (below) or anything written
    present = torch.unique(ds.y_train)
    if len(present) < 2:
        raise ValueError(f"dataset {cfg.dataset} (--dataset): every training row has the class "
                         f"{ds.class_names[int(present[0])]!r}; a classifier needs at least 2 classes (with one, every "
                         "prediction is right and the run would report a trivial 100 % accuracy): build the dataset "
                         "with the rows of the other classes too (fedsim import refuses a single class)")
    _warn_if_not_unit_norm(ds)
    if cfg.zero_shot and cfg.model != "prompt" and (
            cfg.model != "linear" or ds.class_text is None or ds.class_text.shape[1] != ds.dim):
        raise ValueError("config: zero_shot needs model='linear' and a dataset with class_text embeddings "
                         "in the embedding space (fedsim embed --text-model clip), or model='prompt'")
    if cfg.model == "prompt":
        cfg.model_params = check_prompt_dataset(ds, cfg.model_params)  # tower clip: the dataset's open_clip model
    partitions = {s: make_partition(cfg, ds, s) for s in seeds}
    with torch.random.fork_rng(devices=[]):  # model parameters it cannot build fail before anything is written
        build_model(cfg.model, ds.dim, ds.n_classes, class_names=ds.class_names, **cfg.model_params)
    return Plan(cfg, out, resume, engine_name, write_config, seeds, ds, partitions, _checkpoint.dataset_checksum(ds),
                {})


def execute(p: Plan, *, engine: Engine | None = None, progress: bool = True) -> dict:
    """Run a ``plan``: every method for every seed, then results.json/.csv, timings.json and plots.
    A fresh run that fails before its first checkpoint removes what it wrote."""
    engine = engine or LocalEngine(progress=progress)
    cfg, out, ds = p.cfg, p.out, p.ds
    created = [q for q in (out, *out.parents) if not q.exists()]  # deepest first
    out.mkdir(parents=True, exist_ok=True)
    if p.resume:
        for q in remove_stale_tmp(out):
            print(f"fedsim: removed {q}, left by an interrupted write", file=sys.stderr)
    if p.write_config:
        write_config_json(cfg, out, p.engine_name)
    try:
        if p.personal:
            first = p.personal_data[p.seeds[0]]
            results = {"config": results_config(cfg), "dataset": first.summary(), "personalised": True, "methods": {}}
            summary_data, parts = first, first.parts
        else:
            engine.open(cfg, ds)
            results = {"config": results_config(cfg), "dataset": ds.summary(), "methods": {}}
            summary_data, parts = ds, p.partitions[p.seeds[0]]
        timings = {}
        for spec in cfg.methods + ([MethodSpec(CENTRALISED)] if cfg.centralised else []):
            entry = {"algorithm": spec.algorithm, "augmenter": spec.augmenter}
            pooled = spec.name == CENTRALISED
            if tuned(cfg):
                entry["tuning"], per_seed, tim = tune_method(cfg, spec, p.seeds, ds, p.partitions, out, pooled=pooled,
                                                             progress=progress, dataset_sum=p.dataset_sum)
            else:
                per_seed, tim = {}, {}
                for s in p.seeds:
                    run_dir = out / "runs" / f"{slug(spec.name)}-seed{s}"
                    if p.personal:
                        per_seed[str(s)], tim[str(s)] = run_personal_method(cfg, spec, s, p.personal_data[s], run_dir,
                                                                            progress=progress)
                    else:
                        # the centralised row's one client holds every client's rows: it runs here
                        per_seed[str(s)], tim[str(s)] = run_method(
                            cfg, spec, s, ds, p.partitions[s], run_dir, progress=progress, dataset_sum=p.dataset_sum,
                            pooled=pooled, engine=LocalEngine(progress=progress) if pooled else engine)
            results["methods"][spec.name] = {**entry, "seeds": per_seed, "summary": report.summarise(per_seed)}
            timings[spec.name] = tim
        report.write_outputs(results, timings, summary_data, parts, out)
    except Exception:
        if not p.resume:
            _checkpoint.discard_unstarted(out, created)
        raise
    return results


def run(cfg: RunConfig, out_dir, *, resume: bool = False, progress: bool = True,
        changes: dict | None = None, engine: Engine | None = None) -> dict:
    """Run every method for every seed; write results.json/.csv, timings.json and plots.

    Every value is checked before anything is written (``plan``), and a fresh run that fails
    before its first checkpoint removes what it wrote, so the same ``out_dir`` can be used again.
    ``resume`` continues the run in ``out_dir`` from its config.json (``cfg`` is not used) and its
    verified checkpoints; ``changes`` (RunConfig field -> value, the CLI's flags given with
    --resume) may raise ``rounds`` (a finished run then continues) and repeat the run's values,
    anything else is refused by name. ``engine``: how the clients are reached (engine.Engine;
    default engine.LocalEngine, every client in this process; fedsim.flower's FlowerEngine runs
    them on Flower SuperNodes, and ``fedsim.flower.apps.run_simulation`` runs a whole run in
    Flower's Simulation Engine); the same results either way."""
    if engine is not None and not isinstance(engine, Engine):
        raise TypeError(f"engine must be an engine.Engine (LocalEngine, fedsim.flower's FlowerEngine), got "
                        f"{engine!r}; for Flower's Simulation Engine use fedsim.flower.apps.run_simulation "
                        "(fedsim run --engine flower)")
    return execute(plan(cfg, out_dir, resume=resume, changes=changes, engine=engine), engine=engine,
                   progress=progress)
