"""FedMC's Algorithm 1 on the Flower engine (issue 14 item 3): the per-round exchange (S_r's LGDs
up in ``query.lgd``, D_{r-1} down with the train messages, as safetensors bytes checked on receipt)
gives the local engine's results; the protocol itself is FedMCAugmenter's in both engines.
Needs the `flower` extra (skipped without flwr)."""
from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("flwr")

from _fedsim_helpers import save_blobs  # noqa: E402
from test_flower import InProcessGrid, _cfg, _seed_metrics  # noqa: E402

from fedsim.flower.engine import FlowerEngine  # noqa: E402
from fedsim.runner import MethodSpec, run  # noqa: E402

@pytest.fixture
def blobs(tmp_path):
    return save_blobs(tmp_path / "blobs.npz", classes=4, dim=8, noise=0.6, n_train=240, n_test=80, seed=0)


def _forge_lgd_nan(blob: bytes) -> bytes:
    """An LGD's safetensors bytes with one NaN in its centres (a faulty or hostile client)."""
    import safetensors.torch

    n = int.from_bytes(blob[:8], "little")
    meta = json.loads(blob[8:8 + n])["__metadata__"]
    t = safetensors.torch.load(blob)
    t["centers"] = t["centers"].clone()
    t["centers"][0, 0] = float("nan")
    return safetensors.torch.save(t, metadata=meta)


A1 = {"protocol": "algorithm1", "n_prototypes": 8, "n_base": 16, "n_clusters": 3, "n_components": 2,
      "n_entries": 6}


# at a finite budget the PLD accountant's calibration makes it slow (~30 s on a busy 2-core machine)
@pytest.mark.parametrize("budget", [None, pytest.param(4.0, marks=pytest.mark.slow)])
def test_algorithm1_on_flower_gives_the_local_engines_results(blobs, tmp_path, budget):
    """3 rounds, 3 of 4 clients per round, same seed: accuracy, loss, bytes and the privacy report
    identical per round (bit for bit: every client draws from (seed, round, client) and the
    geometry crosses the wire as exact safetensors bytes). With a budget (--epsilon-total 4) it is
    split as in the local engine, over 1 + 3 releases."""
    params = A1 if budget is None else {**A1, "epsilon_total": budget}
    methods = [MethodSpec("FedAvg+FedMC (algorithm1)", augmenter="fedmc", augmenter_params=params)]
    local = run(_cfg(blobs, methods, rounds=3), tmp_path / "local", progress=False)
    grid = InProcessGrid(4)
    sent = []
    real = grid.send_and_receive

    def spy(messages, *, timeout=None):
        sent.extend((m.metadata.message_type, m.content) for m in messages)
        return real(messages, timeout=timeout)

    grid.send_and_receive = spy
    flower = run(_cfg(blobs, methods, rounds=3), tmp_path / "flower", progress=False, engine=FlowerEngine(grid))
    a, b = _seed_metrics(local), _seed_metrics(flower)
    assert b == a
    m = b["FedAvg+FedMC (algorithm1)"]
    assert len(m["accuracy"]) == 3
    if budget is not None:
        assert all(e <= budget for e in m["privacy"]["epsilon_spent"])
    # the exchange went through messages: one "lgd" upload per selected client and round, and the
    # dictionary down (its "lgd" download) in rounds 2 and 3 only
    def step(c):
        return c.config_records["exchange"]["step"] if "exchange" in c.config_records else None

    lgd = [c for t, c in sent if t == "query.upload" and step(c) == "lgd"]
    assert len(lgd) == 3 * 3
    with_dict = [c.config_records["job"]["round"] for t, c in sent
                 if t == "query.download" and step(c) == "lgd" and "dictionary" in c.config_records["payload"]]
    assert sorted(set(with_dict)) == [1, 2] and len(with_dict) == 2 * 3


def test_a_malformed_round_lgd_is_rejected_and_the_run_goes_on(blobs, tmp_path, caplog):
    def tamper(cid, kind, rep):
        if cid == 1 and kind == "query.upload" and "payload" in rep.content.config_records:
            rec = rep.content.config_records["payload"]
            if "lgd" in rec:
                rec["lgd"] = _forge_lgd_nan(rec["lgd"])
        return rep

    methods = [MethodSpec("a1", augmenter="fedmc", augmenter_params=A1)]
    with caplog.at_level(logging.WARNING, logger="fedsim.flower"):
        res = run(_cfg(blobs, methods, rounds=3, client_fraction=1.0), tmp_path / "run", progress=False,
                  engine=FlowerEngine(InProcessGrid(4, tamper)))
    msgs = [r.getMessage() for r in caplog.records if "rejected client 1's lgd upload of round" in r.getMessage()]
    assert len(msgs) == 3 and "NaN" in msgs[0], caplog.text
    m = res["methods"]["a1"]["seeds"]["0"]
    assert len(m["accuracy"]) == 3 and all(0.0 <= x <= 1.0 for x in m["accuracy"])
    # client 1's rejected uploads were still DP releases it made: they count
    assert m["privacy"]["releases_per_client"] == [4, 4, 4, 4]
