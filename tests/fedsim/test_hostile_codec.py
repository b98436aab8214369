"""Issue 44 item 2: a hostile-input harness over the serialised containers (FedMC's and GGEUR's
statistics, geomkern.exchange) and the Flower codec that carries them (fedsim/flower/codec.py).

Each generated case mutates a valid container's bytes (a safetensors header field: dtype, shape,
offsets, the format / version / kind / scalars metadata; a value written into the tensor data:
NaN, inf, a negative or huge number; truncation, appended or random bytes, a broken length
prefix) or a codec payload's schema (an unknown or mismatched kind, an entry listed but not
sent), and reads it back through ``from_bytes``, ``load`` (a file) and ``codec.take``. A case
ends in one of two ways: a ValueError or TypeError whose message names the source (the file, or
the codec's ``source`` and the entry), or a container that holds its kind's invariants, checked
here independently of geomkern (every float finite, variances and eigenvalues >= 0, GGEUR's
counts >= 0 (FedMC's are DP-noisy and may be negative), covariances symmetric, the fields of the
original) and that reads back to itself. A well-formed container with poisoned but valid values
is accepted: that is not detectable here (docs/reliability.md).
Derandomized hypothesis (tests/conftest.py); ``--runslow`` runs 10x the cases."""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("flwr")

from flwr.app import RecordDict  # noqa: E402

from fedsim.flower import codec  # noqa: E402
from geomkern import fedmc, ggeur  # noqa: E402
from geomkern.exchange import Exchanged  # noqa: E402


def _containers() -> dict[str, Exchanged]:
    g = torch.Generator().manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(40, 6, generator=g), dim=1)
    y = torch.randint(0, 3, (40,), generator=g)
    lg = fedmc.local_geometry(X[:20], X[:8], n_clusters=2, n_components=2, gamma=0.5, generator=g)
    lg2 = fedmc.local_geometry(X[20:], X[:8], n_clusters=2, n_components=2, gamma=0.5, generator=g)
    stats = [ggeur.local_statistics(X[i::2], y[i::2], 3) for i in range(2)]
    return {"local_geometry": lg, "dictionary": fedmc.fuse([lg, lg2], n_entries=2),
            "prototypes": fedmc.PrototypeRelease(*fedmc.client_prototypes(X, 3, epsilon=math.inf, generator=g)),
            "class_statistics": stats[0], "global_geometry": ggeur.aggregate(stats)}


CONTAINERS = _containers()
SLOW = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# per default run; ten times as many with --runslow
BLOBS_PER_KIND, PAYLOADS, WEIGHT_SETS = 80, 60, 30


def _invariants(c, original) -> None:
    """What an accepted container must hold, whatever bytes it came from."""
    assert type(c) is type(original)
    d, o = c.to_dict(), original.to_dict()
    assert set(d) == set(o), f"fields {sorted(d)} != {sorted(o)}"
    for k, v in d.items():
        if isinstance(v, torch.Tensor):
            assert torch.isfinite(v).all() if v.is_floating_point() else True, f"{k} holds NaN/Inf"
            assert v.dim() == o[k].dim(), f"{k} has {v.dim()} dims, the kind has {o[k].dim()}"
            # FedMC's counts are DP-noisy sizes, which may be negative (the server clamps them); GGEUR's exact
            if k in ("variances", "eigenvalues", "weights") or (k == "counts" and c._FORMAT == "geomkern.ggeur"):
                assert (v >= 0).all(), f"{k} < 0"
            if k == "covs":
                assert torch.allclose(v, v.transpose(-1, -2), rtol=1e-4, atol=1e-5), "covs not symmetric"
        elif isinstance(v, float):
            assert not math.isnan(v), f"{k} is NaN"
    back = type(c).from_bytes(c.to_bytes())
    assert all(torch.equal(back.to_dict()[k], v) if isinstance(v, torch.Tensor) else back.to_dict()[k] == v
               for k, v in d.items())


def _split(blob: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _join(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


HOSTILE_NUMBERS = st.sampled_from([float("nan"), float("inf"), float("-inf"), -1.0, -1e-30, 1e38, 3.4e38, -0.0, 0.0])
HOSTILE_SCALARS = st.sampled_from(['{"gamma": NaN}', '{"gamma": -1}', '{"gamma": "x"}', "[]", "not json",
                                   '{"gamma": 1e999}', '{"epsilon": 0}', '{"delta": 2}', "{}", '{"x": 1}'])


@st.composite
def mutated(draw, kind: str) -> bytes:
    blob = CONTAINERS[kind].to_bytes()
    header, data = _split(blob)
    # values four times as often: the checks of what a well-formed container holds are the finest
    how = draw(st.sampled_from(["dtype", "shape", "offsets", "meta", "value", "value", "value", "value", "truncate",
                                "append", "prefix", "random", "drop"]))
    names = sorted(k for k in header if k != "__metadata__")
    name = draw(st.sampled_from(names))
    if how == "dtype":
        header[name]["dtype"] = draw(st.sampled_from(["F64", "F16", "BF16", "I64", "I32", "U8", "BOOL", "XX", ""]))
    elif how == "shape":
        header[name]["shape"] = draw(st.lists(st.one_of(st.integers(-3, 9), st.just(2 ** 62)), max_size=4))
    elif how == "offsets":
        header[name]["data_offsets"] = draw(st.lists(st.integers(-5, len(data) + 64), min_size=0, max_size=3))
    elif how == "meta":
        key = draw(st.sampled_from(["format", "version", "kind", "scalars"]))
        header["__metadata__"][key] = (draw(HOSTILE_SCALARS) if key == "scalars" else
                                       draw(st.sampled_from(["", "2", "geomkern.fedmc", "geomkern.ggeur",
                                                             "local_geometry", "class_statistics", "x" * 300])))
    elif how == "value":  # one float32 slot of one tensor set to a hostile number
        spec = header[name]
        lo, hi = spec["data_offsets"]
        if spec["dtype"] == "F32" and hi > lo:
            at = lo + 4 * draw(st.integers(0, (hi - lo) // 4 - 1))
            data = data[:at] + struct.pack("<f", draw(HOSTILE_NUMBERS)) + data[at + 4:]
    elif how == "drop":
        del header[name]
    if how == "truncate":
        full = _join(header, data)
        return full[:draw(st.integers(0, len(full) - 1))]
    if how == "append":
        return _join(header, data) + draw(st.binary(min_size=1, max_size=64))
    if how == "prefix":
        full = _join(header, data)
        return struct.pack("<Q", draw(st.sampled_from([0, 1, 7, len(full), 2 ** 40, 2 ** 64 - 1]))) + full[8:]
    if how == "random":
        return draw(st.binary(max_size=256))
    return _join(header, data)


def _ends_well(call, original, source: str) -> str:
    """'refused' (a named ValueError/TypeError) or 'accepted' (invariants hold)."""
    try:
        c = call()
    except (ValueError, TypeError) as exc:
        assert source in str(exc), f"the refusal does not name {source!r}: {exc}"
        return "refused"
    _invariants(c, original)
    return "accepted"


def _harness(kind: str, examples: int):
    @settings(max_examples=examples)
    @given(blob=mutated(kind))
    def check(tmp_path_factory, blob):
        original = CONTAINERS[kind]
        cls = type(original)
        how = _ends_well(lambda: cls.from_bytes(blob, source="the upload of client 3"), original,
                         "the upload of client 3")
        path = tmp_path_factory.mktemp("c") / "hostile.safetensors"
        path.write_bytes(blob)
        assert _ends_well(lambda: cls.load(path), original, str(path)) == how
    return check


@pytest.mark.parametrize("kind", list(CONTAINERS))
def test_a_mutated_container_is_refused_by_name_or_holds_its_invariants(kind, tmp_path_factory):
    _harness(kind, BLOBS_PER_KIND)(tmp_path_factory)


@SLOW
@pytest.mark.parametrize("kind", list(CONTAINERS))
def test_a_mutated_container_deep(kind, tmp_path_factory):
    _harness(kind, 10 * BLOBS_PER_KIND)(tmp_path_factory)


def test_a_container_is_refused_as_another_kind():
    for kind, c in CONTAINERS.items():
        for other, o in CONTAINERS.items():
            if other != kind:
                with pytest.raises(ValueError, match="upload"):
                    type(o).from_bytes(c.to_bytes(), source="upload")


# ---------------------------------------------------------------------- the codec
TAGS = ["tensor", "null", "empty", "value", "container:geomkern.fedmc/nope", "container:x", "",
        "containers:geomkern.ggeur/class_statistics", "container:geomkern.ggeur/global_geometry",
        "container:geomkern.fedmc/local_geometry", "containers:geomkern.fedmc/prototypes", "other:a/b"]


@st.composite
def payloads(draw):
    rd = RecordDict()
    cs = CONTAINERS
    codec.put(rd, "p", {"t": torch.arange(6.0).view(2, 3), "c": cs["local_geometry"],
                        "cs": [cs["class_statistics"], cs["class_statistics"]], "ids": [3, 7], "x": 0.25,
                        "none": None, "empty": []})
    schema, config = rd.config_records["p.schema"], rd.config_records["p"]
    for _ in range(draw(st.integers(1, 3))):
        entry = draw(st.sampled_from(["t", "c", "cs", "ids", "x", "none", "empty", "ghost"]))
        what = draw(st.sampled_from(["tag", "unsend", "blob"]))
        if what == "tag":
            schema[entry] = draw(st.sampled_from(TAGS))
        elif what == "unsend" and entry in config:
            del config[entry]
        elif what == "blob" and entry in ("c", "cs") and entry in config:
            kind = "local_geometry" if entry == "c" else "class_statistics"
            bad = draw(mutated(kind))
            config[entry] = bad if entry == "c" else [config[entry][0], bad]
    return rd


def _check_take(rd):
    try:
        out = codec.take(rd, "p", source="client 5's upload")
    except (ValueError, TypeError) as exc:
        assert "client 5's upload" in str(exc), f"the refusal does not name the source: {exc}"
        return
    schema = rd.config_records["p.schema"]
    assert set(out) == set(schema)
    for k, tag in schema.items():
        v = out[k]
        if tag == "tensor":
            assert isinstance(v, torch.Tensor)
        elif tag == "null":
            assert v is None
        elif tag == "empty":
            assert v == []
        elif tag.startswith("container"):
            fmt, kind = tag.split(":", 1)[1].split("/", 1)
            for c in (v if tag.startswith("containers:") else [v]):
                assert (c._FORMAT, c._KIND) == (fmt, kind)
                original = next(o for o in CONTAINERS.values() if type(o) is type(c))
                _invariants(c, original)


@given(rd=payloads())
@settings(max_examples=PAYLOADS)
def test_a_hostile_payload_is_refused_naming_its_source_or_read_as_its_schema_says(rd):
    _check_take(rd)


@SLOW
@given(rd=payloads())
@settings(max_examples=10 * PAYLOADS)
def test_a_hostile_payload_deep(rd):
    _check_take(rd)


@given(data=st.data())
@settings(max_examples=WEIGHT_SETS)
def test_uploaded_weights_of_another_shape_dtype_or_entries_are_refused_by_name(data):
    template = {"weight": torch.zeros(4, 8), "log_scale": torch.zeros(())}
    params = {k: v.clone() for k, v in template.items()}
    change = data.draw(st.sampled_from(["shape", "dtype", "drop", "extra"]))
    key = data.draw(st.sampled_from(sorted(template)))
    if change == "shape":
        params[key] = torch.zeros(data.draw(st.lists(st.integers(0, 9), max_size=3).filter(
            lambda s: tuple(s) != tuple(template[key].shape)).map(tuple)))
    elif change == "dtype":
        params[key] = params[key].to(data.draw(st.sampled_from([torch.float64, torch.float16, torch.int64])))
    elif change == "drop":
        del params[key]
    else:
        params["evil"] = torch.zeros(1)
    with pytest.raises(ValueError, match="client 2's update"):
        codec.check_params("client 2's update", params, template)


def _reliability_row(surface: str) -> str:
    """The row of docs/reliability.md's harness table for ``surface``: its counts are this file's."""
    rows = [ln for ln in (ROOT / "docs" / "reliability.md").read_text().splitlines() if ln.startswith(f"| {surface} |")]
    assert len(rows) == 1, f"docs/reliability.md has {len(rows)} rows for {surface!r}"
    return rows[0]


def test_the_reliability_page_states_these_cases():
    swaps = len(CONTAINERS) * (len(CONTAINERS) - 1)
    assert (f"| {BLOBS_PER_KIND} mutated blobs per kind ({len(CONTAINERS)} kinds) + {swaps} kind swaps |"
            in _reliability_row("containers (FedMC, GGEUR)"))
    assert f"| {PAYLOADS} payloads + {WEIGHT_SETS} weight sets |" in _reliability_row("Flower codec")
