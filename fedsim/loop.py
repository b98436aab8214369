"""The one round loop: every (method, seed) of a run, shared-model or personalised, runs here.

What it owns: client sampling (the same formula for every method, from (seed, round)), the
resume block (the checkpoint verified against the configuration's fingerprint and the dataset's
checksum, _checkpoint.load), a checkpoint after every round (atomic rename), the progress bar and
the wall time. What differs between the paths lives in a ``Federation`` (runner.GlobalFederation:
one global model, an augmenter, an engine; personal.PersonalFederation: a model per client):
what a round does, what the checkpoint keeps besides (round, history, timings), and how it is
restored.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import _checkpoint
from ._progress import progress_bar


class Federation:
    """One (method, seed) as the loop drives it. ``n_clients``; ``template``: the model's
    state_dict that checkpointed weights must fit (None: per-client models, checked by
    ``restore``); ``weights``: the checkpoint keys holding model weights."""

    n_clients: int
    template: dict | None = None
    weights: tuple[str, ...] = ("global",)
    # True: after cfg.rounds rounds, one more (0-based index cfg.rounds) in which every client takes
    # part (personal.PersonalFederation: the FLIC authors' last round, PersonalAlgorithm.final_epochs)
    final_round: bool = False

    def restore(self, state: dict) -> None:
        """Take the verified checkpoint ``state`` (raise _checkpoint.CheckpointError if it does not fit)."""

    def begin(self, start: int, timings: dict) -> None:
        """Called once before the first round this session runs (``start``: its 0-based index);
        it may add to ``timings`` (checkpointed with the rounds)."""

    def round(self, r: int, selected: list[int]) -> tuple[dict, dict]:
        """Run round ``r`` with the ``selected`` clients: (its history entry with at least
        ``accuracy``, its timings entry)."""
        raise NotImplementedError

    def state(self) -> dict:
        """What the checkpoint keeps besides round, history and timings."""
        return {}


def select(seed: int, r: int, n_clients: int, fraction: float) -> list[int]:
    """Round r's clients: max(1, round(fraction x K)) of K, drawn from (seed, r) alone."""
    n_sel = max(1, int(round(fraction * n_clients)))
    return sorted(np.random.default_rng([seed, r, 17]).choice(n_clients, n_sel, replace=False).tolist())


def run_rounds(fed: Federation, cfg, spec, seed: int, run_dir: Path, *, fingerprint: str, dataset_sum: str,
               device, progress: bool = True) -> tuple[list[dict], dict]:
    """Run ``fed`` for cfg.rounds rounds (+ its final round where ``fed.final_round``: every client,
    its history entry marked ``"final": True``), continuing from run_dir/checkpoint.pt if present
    (once verified). Returns (history, timings).

    ``timings["wall_s"]``: this (method, seed)'s wall time, summed over the sessions that ran it,
    each from the start of this call to its last checkpoint (the final evaluation after it, and
    the time an interruption lost after it, are not counted). It is checkpointed with the rounds,
    so a resume that finds the method finished runs nothing and reports the time recorded when it
    ran, not the seconds that resume spent loading it."""
    t_start = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / "checkpoint.pt"
    history: list[dict] = []
    timings: dict = {"rounds": []}
    start = 0
    total = cfg.rounds + int(fed.final_round)
    redo = f"delete the folder {run_dir} to redo {spec.name} seed {seed} from round 1, or start the whole run " \
           "again with another --out"
    if ckpt.is_file():
        state = _checkpoint.load(ckpt, fingerprint=fingerprint, dataset=dataset_sum, template=fed.template,
                                 rounds=total, device=device, weights=fed.weights, redo=redo)
        start, history, timings = state["round"], state["history"], state["timings"]
        if start < total and any(h.get("final") for h in history):
            raise _checkpoint.CheckpointError(
                f"cannot resume from {ckpt}: that run already ended with its final round (every client, round "
                f"{start}), so it cannot take more rounds; {redo}")
        fed.restore(state)
    if start >= total:
        return history, timings
    wall_before = timings.get("wall_s", 0.0)
    fed.begin(start, timings)
    rounds = progress_bar(range(start, total), desc=f"{spec.name} seed {seed}", unit="round",
                          initial=start, total=total, enabled=progress)
    for r in rounds:
        final = r == cfg.rounds  # (only reached where fed.final_round)
        entry, tim = fed.round(r, list(range(fed.n_clients)) if final else
                               select(seed, r, fed.n_clients, cfg.client_fraction))
        history.append({"round": r + 1, **entry, **({"final": True} if final else {})})
        timings["rounds"].append({"round": r + 1, **tim})
        timings["wall_s"] = wall_before + (time.perf_counter() - t_start)
        _checkpoint.save(ckpt, {"round": r + 1, **fed.state(), "history": history, "timings": timings},
                         fingerprint=fingerprint, dataset=dataset_sum)
        rounds.set_postfix(acc=f"{entry['accuracy']:.3f}")
    rounds.close()
    return history, timings
