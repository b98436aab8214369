"""OpenCLIPEncoder through the real extraction pipeline: a random-weight ViT-B-32 on 64 generated
images, resume, class-name text embeddings (the zero-shot head), tag/model errors and the offline
message; and the whole image path through the CLI on a tiny open_clip ViT (random weights, 32x32
pixels): image folders -> fedsim embed -> cache and Ctrl-C/resume -> fedsim run --zero-shot.

`make test` installs open_clip (scripts/bootstrap.sh: torch 2.14.1 + torchvision 0.29.1), so these
run in the default suite. Where ``import open_clip`` fails (a torch of yours without the torchvision
built for it) every test is skipped with the import error as the reason, unless
FEDSIM_REQUIRE_OPEN_CLIP=1 (CI sets it: .ci/run), which turns that skip into an error.
"""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from fedsim.data import load_dataset
from fedsim.embed import ImageEncoder, extract, load_source

from test_embed import Interrupting, assert_same_file, chunk_files
from test_embed_datasets import make_tree


def _open_clip_error() -> str | None:
    if importlib.util.find_spec("open_clip") is None:
        return "ModuleNotFoundError: No module named 'open_clip'"
    try:
        import open_clip  # noqa: F401
    except Exception as exc:  # a torchvision that does not match torch raises RuntimeError
        return f"{type(exc).__name__}: {exc}"
    return None


OPEN_CLIP_ERROR = _open_clip_error()
if OPEN_CLIP_ERROR is not None and os.environ.get("FEDSIM_REQUIRE_OPEN_CLIP") == "1":
    raise ImportError(f"FEDSIM_REQUIRE_OPEN_CLIP=1 but open_clip does not import ({OPEN_CLIP_ERROR}); "
                      "scripts/bootstrap.sh installs it beside torch 2.14.1 + torchvision 0.29.1")
pytestmark = pytest.mark.skipif(
    OPEN_CLIP_ERROR is not None,
    reason=f"open_clip does not import here ({OPEN_CLIP_ERROR}); install it without replacing torch: "
           "pip install 'geomkern[clip]' && pip install --no-deps open_clip_torch timm torchvision==<for your torch>")


@pytest.fixture(scope="module")
def clip():
    from fedsim.embed import OpenCLIPEncoder

    return OpenCLIPEncoder("ViT-B-32", None, device="cpu", seed=0)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """imagefolder: 2 domains x 2 classes x 16 images = 64 (seeded split: 52 train, 12 test)."""
    root = tmp_path_factory.mktemp("clip") / "imgs"
    make_tree(root, ["photo", "sketch"], ["cat", "dog"], 16, ext=".jpg")
    return load_source("imagefolder", root)


def direct(clip, paths) -> torch.Tensor:
    with torch.inference_mode():
        x = torch.stack([clip.preprocess(Image.open(p).convert("RGB")) for p in paths])
        return clip.model.encode_image(x).float()


# The full-size model on 64 images: about a minute on a busy 2-core machine; the default suite runs
# the same path on the tiny model below and ViT-B-32 itself once, on 6 images (test_cli_embed_open_clip).
@pytest.mark.slow
def test_random_vitb32_through_pipeline(tmp_path, clip, pictures):
    assert isinstance(clip, ImageEncoder)
    assert clip.dim == 512 and clip.name == "open_clip:ViT-B-32:random(seed=0)"
    assert clip.identity["precision"] == "float32" and clip.identity["seed"] == 0
    out = tmp_path / "clip.npz"
    ds = extract(pictures, clip, out, cache_dir=tmp_path / "cache", batch_size=16, chunk_size=32, num_workers=2,
                 normalize=False, text_encoder=clip.text_encoder(), prompts=["a photo of a {}.", "a sketch of a {}."],
                 progress=False)
    back = load_dataset(out)
    assert (len(back.y_train), len(back.y_test), back.dim) == (52, 12, 512)
    torch.testing.assert_close(back.x_test, direct(clip, pictures.test.items), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(back.x_train[:5], direct(clip, pictures.train.items[:5]), atol=1e-4, rtol=1e-4)
    assert back.meta["encoder"]["preprocess"] == repr(clip.preprocess)
    assert back.meta["encoder"]["open_clip_version"] and back.meta["normalised"] is False
    # class_text: the prompt ensemble of the same model's text tower, one unit row per class
    with torch.inference_mode():
        per = [clip.model.encode_text(clip.tokenizer([p.format(c) for c in ("cat", "dog")])).float()
               for p in ("a photo of a {}.", "a sketch of a {}.")]
    per = [e / e.norm(dim=1, keepdim=True) for e in per]
    want = per[0] + per[1]
    torch.testing.assert_close(back.class_text, want / want.norm(dim=1, keepdim=True), atol=1e-5, rtol=1e-5)
    assert back.meta["class_text"]["encoder"] == clip.name + ":text"
    assert torch.equal(ds.x_train, back.x_train)


@pytest.mark.slow
def test_same_seed_same_weights_and_resume(tmp_path, clip, pictures):
    from fedsim.embed import OpenCLIPEncoder

    photos = load_source("imagefolder", pictures.root, domains=["photo"])  # 26 train + 6 test

    twin = OpenCLIPEncoder("ViT-B-32", "none", device="cpu", seed=0)  # random weights are reproducible: cacheable
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    assert torch.equal(twin.encode(x), clip.encode(x))
    opts = dict(batch_size=8, chunk_size=8, num_workers=0, use_cache=False, progress=False)
    extract(photos, clip, tmp_path / "full.npz", **opts)
    out = tmp_path / "resumed.npz"
    with pytest.raises(KeyboardInterrupt):
        extract(photos, Interrupting(twin, 2), out, **opts)
    assert chunk_files(out) == ["train-000000.npy", "train-000001.npy"]
    extract(photos, twin, out, **opts)
    assert_same_file(tmp_path / "full.npz", out)


def test_cli_embed_open_clip(tmp_path, capsys):
    """The issue's model, open_clip ViT-B-32 with random weights (no download), through fedsim embed
    on 2 classes x 3 images of one domain, with its text tower's class embeddings."""
    from fedsim.cli import main

    root = tmp_path / "imgs"
    make_tree(root, ["photo", "sketch"], ["cat", "dog"], 3, ext=".jpg")
    out = tmp_path / "cli.safetensors"
    assert main(["embed", "--dataset", "imagefolder", "--root", str(root), "--model", "ViT-B-32",
                 "--pretrained", "none", "--device", "cpu", "--out", str(out), "--no-cache", "--workers", "0",
                 "--domains", "sketch",
                 "--batch-size", "32", "--text-model", "clip", "--quiet"]) == 0
    ds = load_dataset(out)
    assert len(ds.y_train) + len(ds.y_test) == 6 and ds.meta["encoder"]["pretrained"] == "random(seed=0)"
    assert ds.dim == 512 and ds.class_text.shape == (2, 512) and ds.meta["normalised"] is True
    np.testing.assert_allclose(ds.x_train.norm(dim=1).numpy(), 1.0, atol=1e-5)
    assert ds.meta["class_text"]["prompts"] == ["a photo of a {}."]


def test_unknown_model_and_tag():
    from fedsim.embed import OpenCLIPEncoder

    with pytest.raises(ValueError, match=r"does not know the model 'ViT-B-61'.*close"):
        OpenCLIPEncoder("ViT-B-61", None)
    with pytest.raises(ValueError, match=r"'no_such_tag' is neither a pretrained tag.*laion2b_s34b_b88k"):
        OpenCLIPEncoder("ViT-B-16", "no_such_tag")


@pytest.mark.parametrize("tag, extra", [("laion2b_s34b_b88k", "laion/CLIP-ViT-B-16-laion2B-s34B-b88K"),
                                        ("openai", "ViT-B-16-quickgelu")])
def test_offline_download_says_which_file_to_place_where(monkeypatch, tmp_path, tag, extra):
    """No network: the real open_clip download path fails (hf_hub_download / urlopen patched to
    fail as they do offline); the error names the file, --pretrained, and the Hugging Face cache."""
    import urllib.request

    import open_clip.pretrained

    from fedsim.embed import OpenCLIPEncoder

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' (offline)")

    monkeypatch.setattr(open_clip.pretrained, "hf_hub_download", offline, raising=False)
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError) as info:
        OpenCLIPEncoder("ViT-B-16", tag, device="cpu", cache_dir=str(tmp_path))
    msg = str(info.value)
    assert "open_clip could not load the weights of ViT-B-16" in msg and "offline" in msg
    assert "--pretrained /path/to/" in msg and "HF_HUB_OFFLINE=1" in msg and extra in msg


# --- a tiny open_clip model: the whole image path (folders -> embed -> cache/resume -> run) in seconds ---

# Same architecture family as ViT-B-32 (a ViT image tower and a transformer text tower with open_clip's
# BPE tokenizer, bundled with the package), shrunk to 2 layers and 32x32 pixels: the code paths are
# open_clip's own, only the sizes differ.
TINY = {"embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """Registers the TINY config with open_clip (a process-wide registry) and returns its model name."""
    import open_clip

    folder = tmp_path_factory.mktemp("open_clip_config")
    (folder / "fedsim-tiny-vit.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(folder)
    return "fedsim-tiny-vit"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """imagefolder: 2 domains x 3 classes x 8 images (seeded split: 36 train, 12 test); each class
    its own colour, so that even random features separate the classes a little."""
    root = tmp_path_factory.mktemp("shapes")
    rng = np.random.default_rng(0)
    for d in ("photo", "sketch"):
        for c, rgb in (("red", (200, 30, 30)), ("green", (30, 200, 30)), ("blue", (30, 30, 200))):
            (root / d / c).mkdir(parents=True)
            for i in range(8):
                px = np.clip(np.array(rgb) + rng.integers(-40, 41, (20, 24, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(px).save(root / d / c / f"img{i}.png")
    return root


class EncodeCalls:
    """Counts OpenCLIPEncoder.encode calls (image batches) in the encoders the CLI builds, and can
    raise KeyboardInterrupt after ``stop_after`` of them (Ctrl-C in the middle of an extraction)."""

    def __init__(self, monkeypatch, stop_after: int | None = None):
        from fedsim.embed.encoders import OpenCLIPEncoder

        self.calls, self.stop_after = 0, stop_after
        # the real method, not an earlier EncodeCalls' wrapper (nor the function inside torch.inference_mode)
        real = getattr(OpenCLIPEncoder.encode, "uncounted", OpenCLIPEncoder.encode)

        def encode(enc, images):
            if self.calls == self.stop_after:
                raise KeyboardInterrupt("simulated Ctrl-C")
            self.calls += 1
            return real(enc, images)

        encode.uncounted = real
        monkeypatch.setattr(OpenCLIPEncoder, "encode", encode)


def test_image_folders_to_fedsim_run(tmp_path, tiny, shapes, monkeypatch, capsys):
    """fedsim embed --encoder open_clip --pretrained none on image folders, the CLIP text tower as
    class_text, the second run served by the cache, then fedsim run (and --zero-shot) on the file."""
    from fedsim.cli import main
    from fedsim.embed import OpenCLIPEncoder

    out = tmp_path / "shapes.npz"
    argv = ["embed", "--dataset", "imagefolder", "--root", str(shapes), "--encoder", "open_clip", "--model", tiny,
            "--pretrained", "none", "--device", "cpu", "--text-model", "clip", "--cache-dir", str(tmp_path / "cache"),
            "--batch-size", "8", "--workers", "0", "--out", str(out), "--quiet"]
    first = EncodeCalls(monkeypatch)
    assert main(argv) == 0
    assert first.calls == 5 + 2  # 36 train rows in batches of 8, 12 test rows
    ds = load_dataset(out)
    assert ds.class_names == ["blue", "green", "red"] and ds.domain_names == ["photo", "sketch"]
    assert (len(ds.y_train), len(ds.y_test), ds.dim) == (36, 12, TINY["embed_dim"])
    assert ds.meta["normalised"] is True and ds.meta["encoder"]["pretrained"] == "random(seed=0)"
    # the rows are the model's own image features of those files (L2-normalised), in the split's order
    clip = OpenCLIPEncoder(tiny, None, device="cpu", seed=0)
    want = direct(clip, load_source("imagefolder", shapes).test.items)
    torch.testing.assert_close(ds.x_test, want / want.norm(dim=1, keepdim=True), atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        names = clip.model.encode_text(clip.tokenizer([f"a photo of a {c}." for c in ds.class_names])).float()
    torch.testing.assert_close(ds.class_text, names / names.norm(dim=1, keepdim=True), atol=1e-5, rtol=1e-5)
    # the same command again: every row from the cache, an identical file
    (tmp_path / "first.npz").write_bytes(out.read_bytes())
    again = EncodeCalls(monkeypatch)
    assert main(argv + ["--overwrite"]) == 0
    assert again.calls == 0
    assert_same_file(tmp_path / "first.npz", out)
    capsys.readouterr()
    # fedsim run on it: two rounds of FedAvg, the linear head started from the class-name embeddings
    run = tmp_path / "run"
    assert main(["run", "--dataset", str(out), "--rounds", "2", "--clients", "2", "--min-size", "2",
                 "--algorithms", "fedavg", "--augmenters", "none", "--zero-shot", "--quiet", "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    fedavg = results["methods"]["FedAvg"]["seeds"]["0"]
    assert len(fedavg["accuracy"]) == 2 and set(fedavg["per_domain"]) == {"photo", "sketch"}
    assert results["config"]["zero_shot"] is True
    # round 0 is the untrained head = the class-name embeddings: its accuracy is nearest-class-text
    zero_shot = (ds.x_test @ ds.class_text.T).argmax(dim=1).eq(ds.y_test).float().mean().item()
    assert fedavg["zero_shot_accuracy"] == pytest.approx(zero_shot, abs=1e-6)
    assert "shapes: 36 train / 12 test, D=32, 3 classes, 2 domains" in capsys.readouterr().out


def test_cli_embed_interrupted_then_resumed(tmp_path, tiny, shapes, monkeypatch, capsys):
    """Ctrl-C after 3 batches: exit 130, the finished chunks kept; the same command again encodes only
    what is missing and writes the file an uninterrupted run writes."""
    from fedsim.cli import main

    def argv(out):
        return ["embed", "--dataset", "imagefolder", "--root", str(shapes), "--model", tiny, "--pretrained", "none",
                "--device", "cpu", "--no-cache", "--batch-size", "4", "--chunk-size", "8", "--workers", "0",
                "--out", str(out), "--quiet"]

    assert main(argv(tmp_path / "full.npz")) == 0
    out = tmp_path / "resumed.npz"
    EncodeCalls(monkeypatch, stop_after=5)
    assert main(argv(out)) == 130
    assert "interrupted: the finished chunks are kept" in capsys.readouterr().err
    assert chunk_files(out) == ["train-000000.npy", "train-000001.npy"] and not out.exists()
    resumed = EncodeCalls(monkeypatch)
    assert main(argv(out)) == 0
    assert resumed.calls == (9 - 4) + 3  # train: 36 rows = 9 batches, 2 chunks of 2 kept; test: 3 batches
    assert_same_file(tmp_path / "full.npz", out)
    assert chunk_files(out) == []
