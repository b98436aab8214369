"""fedsim/flower/codec.py's exchange payloads: every kind of entry survives put -> take, and what
Flower itself cannot carry (an empty list) is carried anyway. Needs the `flower` extra."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import RecordDict  # noqa: E402

from fedsim.flower import codec  # noqa: E402
from geomkern import ggeur  # noqa: E402


def test_every_kind_of_entry_round_trips_and_its_bytes_are_counted():
    g = torch.Generator().manual_seed(0)
    stats = ggeur.local_statistics(torch.randn(20, 4, generator=g), torch.randint(0, 3, (20,), generator=g), 3)
    payload = {"t": torch.arange(6.0).view(2, 3), "c": stats, "cs": [stats, stats], "ids": [3, 7], "x": 0.25,
               "s": "median", "none": None, "empty": []}
    rd = RecordDict()
    codec.put(rd, "p", payload)
    back = codec.take(rd, "p", source="the upload")
    assert set(back) == set(payload)
    assert torch.equal(back["t"], payload["t"]) and back["ids"] == [3, 7] and back["x"] == 0.25
    assert back["s"] == "median" and back["none"] is None and back["empty"] == []
    for c in (back["c"], *back["cs"]):
        assert isinstance(c, ggeur.ClassStatistics) and torch.equal(c.covs, stats.covs)
    assert codec.payload_bytes(rd) > stats.nbytes() * 3  # the tensors, three blobs and their headers


def test_nothing_sent_and_nothing_there_are_told_apart():
    rd = RecordDict()
    assert codec.take(rd, "p", source="x") == {}  # no payload at all
    codec.put(rd, "p", None)  # a client that sends nothing (no rows)
    assert codec.take(rd, "p", source="x") is None
    codec.put(rd, "p", {"a": 1})  # put replaces what was there
    assert codec.take(rd, "p", source="x") == {"a": 1}
