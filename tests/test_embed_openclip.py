"""OpenCLIPEncoder through the real extraction pipeline: a random-weight ViT-B-32 on 64 generated
images, resume, class-name text embeddings (the zero-shot head), tag/model errors and the offline
message. Runs only where ``import open_clip`` works (it needs a torchvision built for the installed
torch); elsewhere every test is skipped with the import error as the reason.
"""
from __future__ import annotations

import importlib.util

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


def test_cli_embed_open_clip(tmp_path, pictures, capsys):
    from fedsim.cli import main

    out = tmp_path / "cli.safetensors"
    assert main(["embed", "--dataset", "imagefolder", "--root", pictures.root, "--model", "ViT-B-32",
                 "--pretrained", "none", "--device", "cpu", "--out", str(out), "--no-cache", "--workers", "0",
                 "--domains", "sketch",
                 "--batch-size", "32", "--text-model", "clip", "--quiet"]) == 0
    ds = load_dataset(out)
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
