"""docs/development.md, "Add an FL algorithm or augmenter": the recipe, followed as written. A toy
algorithm and a toy augmenter, each one class with its defaults and params and one registry line,
in a module of their own; a run dispatches to both (the augmenter's exchange too: one step through
the protocol's hooks, with TypedDict payloads), and `--set toy.x=...` is checked by the params the
algorithm declared."""
from __future__ import annotations

import importlib
import json
import sys

import pytest

from _fedsim_helpers import save_blobs
from fedsim.algorithms import ALGORITHMS
from fedsim.augmenters import AUGMENTERS

TOY = '''
from typing import TypedDict

import torch

from fedsim.algorithms import Algorithm, register
from fedsim.augmenters import Augmenter, register as register_augmenter
from fedsim.config import Int

SEEN = []


@register
class Toy(Algorithm):
    name = "toy"
    defaults = {"x": 0}
    params = {"x": Int(0)}

    def begin_client(self, ctx):
        SEEN.append(("toy", self.hp["x"]))


class Rows(TypedDict):  # up: a client's row count
    n: int


class Total(TypedDict):  # down: every client's rows
    total: int


@register_augmenter
class ToyAug(Augmenter[Rows, Rows, Total]):
    name = "toyaug"
    summary = "copies of every row, after counting the rows"  # its line in `fedsim run --help`
    step_names = ("count",)
    defaults = {"copies": 1}
    params = {"copies": Int(0)}

    def steps(self, round, clients):
        return [("count", clients)] if round is None else []

    def upload(self, step, cid, data, *, round):
        SEEN.append(("rows", cid, int(data.x.shape[0])))
        return {"n": int(data.x.shape[0])}

    def aggregate(self, step, uploads, *, round, clients, rejected):
        total = sum(u["n"] for u in uploads.values())
        return {k: {"total": total} for k in clients}

    def download(self, step, cid, payload, *, round):
        SEEN.append(("total", cid, payload["total"]))

    def augment(self, cid, data, *, generator):
        SEEN.append(("toyaug", self.p["copies"]))
        return data.x.repeat(self.p["copies"], 1), data.y.repeat(self.p["copies"])
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "toy_plugins.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = (dict(ALGORITHMS), dict(AUGMENTERS))
    module = importlib.import_module("toy_plugins")
    yield module
    for registry, saved in zip((ALGORITHMS, AUGMENTERS), before):
        registry.clear()
        registry.update(saved)
    sys.modules.pop("toy_plugins", None)


def test_a_toy_algorithm_and_augmenter_are_dispatched_and_configured(toy, tmp_path, capsys):
    from fedsim.cli import main

    data = save_blobs(tmp_path / "blobs.npz", classes=3, dim=6, noise=0.5, n_train=90, n_test=30, seed=0)
    common = ["run", "--dataset", str(data), "--clients", "3", "--rounds", "1", "--min-size", "3",
              "--algorithms", "toy", "--augmenters", "toyaug", "--quiet"]
    assert main(common + ["--set", "toy.x=7", "--set", "toyaug.copies=2", "--out", str(tmp_path / "run")]) == 0
    assert ("toy", 7) in toy.SEEN and ("toyaug", 2) in toy.SEEN  # both hooks ran, with the values set
    # the exchange ran once, before round 1: every client's rows up, their sum down to each
    rows = {k: n for kind, k, n in (e for e in toy.SEEN if len(e) == 3) if kind == "rows"}
    totals = {k: t for kind, k, t in (e for e in toy.SEEN if len(e) == 3) if kind == "total"}
    assert sorted(rows) == sorted(totals) == [0, 1, 2] and min(rows.values()) > 0
    assert set(totals.values()) == {sum(rows.values())}
    method = json.loads((tmp_path / "run" / "results.json").read_text())["config"]["methods"][0]
    assert (method["algorithm"], method["augmenter"]) == ("toy", "toyaug")
    assert method["algorithm_params"] == {"x": 7} and method["augmenter_params"] == {"copies": 2}
    capsys.readouterr()
    # the declared kinds check --set before anything is written
    assert main(common + ["--set", "toy.x=-1", "--out", str(tmp_path / "bad")]) == 2
    assert "toy.x must be an integer >= 0, got -1" in capsys.readouterr().err
    assert main(common + ["--set", "toy.y=1", "--out", str(tmp_path / "bad")]) == 2
    assert "algorithm 'toy' has no parameter 'y'; it takes x" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    # the CLI's --augmenters help is made from the registry: the toy's name and summary are in it
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "toyaug: copies of every row, after counting the rows" in " ".join(capsys.readouterr().out.split())
