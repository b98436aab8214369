"""The prompt head on the CLIP text tower (fedsim/prompt.py, ``tower = "clip"``): image folders ->
fedsim embed (a tiny open_clip ViT, random weights, no download) -> fedsim run --model prompt with
the text tower of the same model, read from the dataset's header. Checked: the tower is open_clip's
``encode_text`` (normalised), the round-0 accuracy is nearest-class-name accuracy computed directly
with open_clip, gradients reach only the context vectors, and the header rules (a dataset not made by
a CLIP model, another model or other weights, a pretrained tag = a download) give clear errors.

The open_clip tests skip where ``import open_clip`` fails, as tests/fedsim/test_embed_encoders.py does
(FEDSIM_REQUIRE_OPEN_CLIP=1 turns that skip into an error); the header and missing-package
tests need no open_clip.
"""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F

from fedsim.prompt import CLIPTower, PromptHead, check_prompt_dataset, load_tower

from test_embed_encoders import OPEN_CLIP_ERROR, TINY

needs_open_clip = pytest.mark.skipif(OPEN_CLIP_ERROR is not None,
                                     reason=f"open_clip does not import here ({OPEN_CLIP_ERROR})")
CLASSES = ("red", "green", "blue")
MODEL = "fedsim-tiny-vit"  # TINY registered under this name (as test_embed_openclip registers it)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    import open_clip

    folder = tmp_path_factory.mktemp("open_clip_config")
    (folder / f"{MODEL}.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(folder)
    return MODEL


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, tiny):
    """fedsim embed of 3 colour classes x 10 images (one domain) with the tiny model, random weights."""
    from fedsim.cli import main
    from fedsim.data import load_dataset

    root = tmp_path_factory.mktemp("colours")
    rng = np.random.default_rng(0)
    for c, rgb in zip(CLASSES, ((200, 30, 30), (30, 200, 30), (30, 30, 200))):
        (root / "photo" / c).mkdir(parents=True)
        for i in range(10):
            px = np.clip(np.array(rgb) + rng.integers(-40, 41, (20, 24, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(px).save(root / "photo" / c / f"img{i}.png")
    out = root / "colours.npz"
    assert main(["embed", "--dataset", "imagefolder", "--root", str(root), "--encoder", "open_clip", "--model", tiny,
                 "--pretrained", "none", "--device", "cpu", "--no-cache", "--workers", "0", "--batch-size", "16",
                 "--out", str(out), "--quiet"]) == 0
    return out, load_dataset(out)


def _direct_text(tiny, texts) -> torch.Tensor:
    """open_clip's own encode_text of ``texts`` on the model fedsim embed used, L2-normalised."""
    from fedsim.embed import OpenCLIPEncoder

    clip = OpenCLIPEncoder(tiny, None, device="cpu", seed=0)
    with torch.inference_mode():
        return F.normalize(clip.model.encode_text(clip.tokenizer(list(texts))).float(), dim=1)


@needs_open_clip
def test_fedsim_run_prompt_on_the_clip_tower(tmp_path, tiny, embedded, monkeypatch):
    """fedsim run --model prompt, tower clip: the tower is taken from the header, round 0 is the
    class-name prompt "a photo of a <class>", whose accuracy is nearest-class-name accuracy."""
    from fedsim import report
    from fedsim.cli import main

    for plot in ("plot_partition", "plot_accuracy", "plot_per_class"):  # most of the run's time; tested elsewhere
        monkeypatch.setattr(report, plot, lambda *a, **k: None)

    out, ds = embedded
    assert ds.meta["encoder"]["library"] == "open_clip" and ds.class_names == sorted(CLASSES)
    cfg = tmp_path / "prompt.toml"
    cfg.write_text('[model_params]\ntower = "clip"\n')
    run = tmp_path / "run"
    assert main(["run", "--dataset", str(out), "--model", "prompt", "--config", str(cfg), "--rounds", "2",
                 "--clients", "2", "--min-size", "2", "--algorithms", "fedavg", "--augmenters", "none",
                 "--quiet", "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["config"]["model_params"] == {"tower": "clip", "tower_model": tiny,
                                                 "tower_pretrained": "random(seed=0)"}
    fedavg = results["methods"]["FedAvg"]["seeds"]["0"]
    assert len(fedavg["accuracy"]) == 2
    names = _direct_text(tiny, [f"a photo of a {c}" for c in ds.class_names])
    direct = (F.normalize(ds.x_test, dim=1) @ names.T).argmax(1).eq(ds.y_test).float().mean().item()
    assert fedavg["zero_shot_accuracy"] == pytest.approx(direct, abs=1e-6)
    # the head's round-0 class weights are open_clip's encode_text of the same prompts
    head = PromptHead(ds.dim, ds.n_classes, ds.class_names, tower="clip", tower_model=tiny,
                      tower_pretrained="random(seed=0)")
    with torch.no_grad():
        torch.testing.assert_close(head.class_weights(), names, atol=1e-5, rtol=1e-5)


@needs_open_clip
def test_gradients_reach_only_the_contexts(tiny, embedded):
    _, ds = embedded
    torch.manual_seed(0)
    head = PromptHead(ds.dim, ds.n_classes, ds.class_names, tower="clip", tower_model=tiny,
                      tower_pretrained="random(seed=0)", n_ctx=6)  # 2 random contexts before "a photo of a"
    tw = load_tower("clip", model=tiny, pretrained="random(seed=0)")
    assert (tw.width, tw.dim) == (TINY["text_cfg"]["width"], TINY["embed_dim"])  # contexts live in the input width
    assert head.ctx.shape == (6, tw.width)
    assert set(head.state_dict()) == {"ctx", "log_scale"}
    assert {n for n, _ in head.named_parameters()} == {"ctx", "log_scale"}
    logits, _ = head(ds.x_train)
    F.cross_entropy(logits, ds.y_train).backward()
    assert head.ctx.grad is not None and head.ctx.grad.abs().sum() > 0 and torch.isfinite(head.ctx.grad).all()
    frozen = [*tw.transformer.parameters(), *tw.ln_final.parameters()]
    assert frozen and all(not p.requires_grad and p.grad is None for p in frozen)
    assert not tw.embedding.requires_grad and not tw.pos.requires_grad


def _fake(meta, name="imgs"):
    return SimpleNamespace(meta=meta, name=name)


def test_header_picks_the_tower_and_refuses_mismatches(tmp_path):
    """check_prompt_dataset with tower clip (no open_clip needed): the header's model and random
    weights fill the tower's; other encoders, another model or weights, and a tag are refused."""
    header = {"encoder": {"library": "open_clip", "model": "ViT-B-32", "pretrained": "random(seed=3)"}}
    got = check_prompt_dataset(_fake(header), {"tower": "clip"})
    assert got == {"tower": "clip", "tower_model": "ViT-B-32", "tower_pretrained": "random(seed=3)"}
    minilm = {"encoder": {"model": "sentence-transformers/all-MiniLM-L6-v2"}}
    with pytest.raises(ValueError, match=r"'imgs' were made with 'sentence-transformers/all-MiniLM-L6-v2', not by a "
                                         r"CLIP model through open_clip"):
        check_prompt_dataset(_fake(minilm), {"tower": "clip"})
    with pytest.raises(ValueError, match=r"tower_model='ViT-B-16'.*embedded with open_clip model 'ViT-B-32'"):
        check_prompt_dataset(_fake(header), {"tower": "clip", "tower_model": "ViT-B-16"})
    with pytest.raises(ValueError, match=r"tower_pretrained='random\(seed=0\)'.*'random\(seed=3\)'"):
        check_prompt_dataset(_fake(header), {"tower": "clip", "tower_pretrained": "random(seed=0)"})
    tagged = {"encoder": {"library": "open_clip", "model": "ViT-B-32", "pretrained": "openai"}}
    with pytest.raises(ValueError, match=r"tower_pretrained: .*pretrained 'openai'.*local file.*nothing is downloaded"):
        check_prompt_dataset(_fake(tagged), {"tower": "clip"})
    # a checkpoint file: checked against the header's digest where fedsim embed recorded one
    from fedsim.embed.encoders import _file_digest

    ckpt = tmp_path / "weights.bin"
    ckpt.write_bytes(b"not really weights")
    filed = {"encoder": {"library": "open_clip", "model": "ViT-B-32", "pretrained": "file:weights.bin",
                         "pretrained_sha256": _file_digest(ckpt)}}
    assert check_prompt_dataset(_fake(filed), {"tower": "clip", "tower_pretrained": str(ckpt)})["tower_pretrained"] \
        == str(ckpt)
    ckpt.write_bytes(b"other weights")
    with pytest.raises(ValueError, match="is not the checkpoint dataset 'imgs' was embedded with"):
        check_prompt_dataset(_fake(filed), {"tower": "clip", "tower_pretrained": str(ckpt)})
    with pytest.raises(ValueError, match="tower_model / tower_pretrained choose the open_clip model of tower 'clip'"):
        check_prompt_dataset(_fake(minilm), {"tower_model": "ViT-B-32"})


def test_tower_without_open_clip_or_local_weights(monkeypatch):
    """A tag is a download (refused before open_clip is touched); without open_clip the error says so."""
    with pytest.raises(FileNotFoundError, match=r"tower_pretrained='openai': no such file.*no download at run time"):
        CLIPTower("cpu", "ViT-B-32", "openai")
    with pytest.raises(ValueError, match="needs the open_clip model name"):
        CLIPTower("cpu", None, "random(seed=0)")
    monkeypatch.setitem(sys.modules, "open_clip", None)  # import open_clip now raises ImportError
    with pytest.raises(ImportError, match="the prompt head's clip tower needs open_clip"):
        CLIPTower("cpu", "ViT-B-32", "random(seed=0)")
