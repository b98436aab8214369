"""fedsim.embed.datasets: every adapter on a tiny generated tree (PIL images / text files written to
tmp_path), its split rule, and the error for a missing or incomplete folder."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedsim.embed.datasets import ADAPTERS, load_source, stratified_split


def write_image(path: Path, rng: np.random.Generator, size=(12, 10)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)


def make_tree(root: Path, domains, classes, n: int, *, seed: int = 0, ext: str = ".png", sub: str = "") -> list[Path]:
    """root/<domain>/<sub>/<class>/img<i><ext>; returns the written files."""
    rng = np.random.default_rng(seed)
    out = []
    for d in domains:
        for c in classes:
            for i in range(n):
                p = root / d / sub / c / f"img{i:02d}{ext}" if sub else root / d / c / f"img{i:02d}{ext}"
                if ext == ".txt":
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_text(f"{d} {c} {i}\n")
                else:
                    write_image(p, rng)
                out.append(p)
    return out


def check_consistent(src, files=None, *, domain_level=True):
    """Every item's folder names agree with its label/domain; splits are disjoint (and cover files)."""
    for split in (src.train, src.test):
        assert len(split.items) == len(split.labels) > 0
        assert split.labels.dtype == np.int64
        for k, item in enumerate(split.items):
            p = Path(item)
            assert p.is_file() and p.is_absolute()
            assert src.class_names[split.labels[k]] in p.parts, (item, split.labels[k])
            if domain_level:
                assert src.domain_names[split.domains[k]] in p.parts, (item, split.domains[k])
    tr, te = set(src.train.items), set(src.test.items)
    assert not tr & te
    if files is not None:
        assert tr | te == {str(f.resolve()) for f in files}


def per_stratum(split, n_classes):
    return {(int(d), int(c)): int(((split.domains == d) & (split.labels == c)).sum())
            for d in np.unique(split.domains) for c in range(n_classes)}


# --- the seeded stratified split -----------------------------------------------------------------

@pytest.mark.parametrize("n, frac, n_test", [(1, 0.2, 0), (2, 0.2, 1), (2, 0.9, 1), (5, 0.2, 1), (10, 0.25, 3),
                                             (10, 0.3, 3), (7, 0.5, 4), (100, 0.2, 20)])
def test_stratified_split_sizes(n, frac, n_test):
    tr, te = stratified_split(n, frac, 0, "a/b")
    assert len(te) == n_test and len(tr) == n - n_test
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(n))


def test_stratified_split_seeded_per_stratum():
    a = stratified_split(50, 0.2, 3, "Art/Mug")[1]
    assert np.array_equal(a, stratified_split(50, 0.2, 3, "Art/Mug")[1])
    assert not np.array_equal(a, stratified_split(50, 0.2, 4, "Art/Mug")[1])
    assert not np.array_equal(a, stratified_split(50, 0.2, 3, "Art/Pen")[1])


# --- Office-Home (the generic domain/class walk) -----------------------------------------------------

OH = ["Art", "Clipart", "Product", "Real World"]


@pytest.fixture
def officehome(tmp_path):
    files = make_tree(tmp_path / "OfficeHome", OH, ["Alarm_Clock", "Bike"], 5)
    return tmp_path / "OfficeHome", files


def test_office_home(officehome):
    root, files = officehome
    src = load_source("office-home", root)
    assert src.name == "office-home" and src.modality == "image"
    assert src.domain_names == OH and src.class_names == ["Alarm_Clock", "Bike"]
    assert src.class_text_names == ["Alarm Clock", "Bike"]
    check_consistent(src, files)
    # 5 per (domain, class), test_fraction 0.2: exactly 1 test and 4 train in every stratum
    assert set(per_stratum(src.test, 2).values()) == {1} and set(per_stratum(src.train, 2).values()) == {4}
    assert "seeded stratified" in src.split_rule and "seed=0" in src.split_rule
    assert src.counts()["train"]["per_domain"] == [8, 8, 8, 8]


def test_office_home_split_is_seeded(officehome):
    root, _ = officehome
    a, b = load_source("office-home", root, seed=0), load_source("office-home", root, seed=0)
    assert a.test.items == b.test.items and a.train.fingerprint == b.train.fingerprint
    c = load_source("office-home", root, seed=1)
    assert c.test.items != a.test.items and c.train.fingerprint != a.train.fingerprint
    d = load_source("office-home", root, test_fraction=0.6)
    assert set(per_stratum(d.test, 2).values()) == {3}


def test_office_home_domain_subset_keeps_each_strata_split(officehome):
    root, _ = officehome
    full = load_source("office-home", root)
    sub = load_source("OfficeHome", root, domains=["Clipart", "Art"])
    assert sub.domain_names == ["Clipart", "Art"]
    assert set(sub.test.items) == {i for i, d in zip(full.test.items, full.test.domains) if OH[d] in ("Art", "Clipart")}


def test_office_home_missing_or_incomplete(officehome, tmp_path):
    root, _ = officehome
    with pytest.raises(FileNotFoundError, match=r"(?s)does not exist.*expected layout.*Real World"):
        load_source("office-home", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"domain folder\(s\) \['Nope'\] missing"):
        load_source("office-home", root, domains=["Art", "Nope"])
    for f in (root / "Product" / "Bike").iterdir():
        f.unlink()
    with pytest.raises(FileNotFoundError, match=r"Product/Bike holds no files ending in \.jpg"):
        load_source("office-home", root)
    (root / "Product" / "Bike").rmdir()
    with pytest.raises(FileNotFoundError, match=r"incomplete: domain 'Product' lacks class folder\(s\) \['Bike'\]"):
        load_source("office-home", root)
    import shutil

    shutil.rmtree(root / "Product")
    with pytest.raises(FileNotFoundError, match=r"(?s)domain folder\(s\) \['Product'\] missing.*expected layout"):
        load_source("office-home", root)


# --- Office-31 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("images_level", [True, False])
def test_office31(tmp_path, images_level):
    files = make_tree(tmp_path, ["amazon", "dslr", "webcam"], ["back_pack", "bike", "mug"], 3, ext=".jpg",
                      sub="images" if images_level else "")
    src = load_source("office-31", tmp_path)
    assert src.domain_names == ["amazon", "dslr", "webcam"] and src.class_names == ["back_pack", "bike", "mug"]
    check_consistent(src, files)
    assert set(per_stratum(src.test, 3).values()) == {1}


def test_office31_missing_domain(tmp_path):
    make_tree(tmp_path, ["amazon", "webcam"], ["bike"], 2)
    with pytest.raises(FileNotFoundError, match=r"\['dslr'\] missing"):
        load_source("office_31", tmp_path)


# --- DomainNet ----------------------------------------------------------------------------------

DN = ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]


def test_domainnet_seeded_without_lists(tmp_path):
    files = make_tree(tmp_path, DN, ["airplane", "zebra"], 3, ext=".jpg")
    src = load_source("domainnet", tmp_path)
    assert src.domain_names == DN
    check_consistent(src, files)
    assert "seeded" in src.split_rule


def test_domainnet_official_lists(tmp_path):
    files = make_tree(tmp_path, DN, ["airplane", "zebra"], 3, ext=".jpg")
    expect = {"train": set(), "test": set()}
    for d in DN:
        rel = sorted(f.relative_to(tmp_path).as_posix() for f in files if f.parts[-3] == d)
        # label numbers in the lists are ignored (labels come from the folders): write nonsense ones
        (tmp_path / f"{d}_train.txt").write_text("".join(f"{r} 7\n" for r in rel[:4]))
        (tmp_path / f"{d}_test.txt").write_text("".join(f"{r} 9\n" for r in rel[4:5]))
        expect["train"] |= {str(tmp_path / r) for r in rel[:4]}
        expect["test"] |= {str(tmp_path / r) for r in rel[4:5]}
    src = load_source("domainnet", tmp_path)
    assert set(src.train.items) == expect["train"] and set(src.test.items) == expect["test"]
    assert "clipart_train.txt" in src.split_rule
    check_consistent(src)  # files in neither list (one per domain) are not used
    # a list naming a file that is not there: an incomplete download
    with open(tmp_path / "real_test.txt", "a") as f:
        f.write("real/zebra/missing.jpg 1\n")
    with pytest.raises(FileNotFoundError, match=r"real_test.txt:2 lists 'real/zebra/missing.jpg'.*incomplete download"):
        load_source("domainnet", tmp_path)
    # lists for only some domains
    (tmp_path / "real_test.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"incomplete split lists.*real: real_train.txt \+ real_test.txt"):
        load_source("domainnet", tmp_path)


# --- PACS --------------------------------------------------------------------------------------

PACS = ["art_painting", "cartoon", "photo", "sketch"]


def test_pacs_kfold_and_split_lists(tmp_path):
    files = make_tree(tmp_path / "kfold", PACS, ["dog", "horse"], 4, ext=".jpg")
    src = load_source("pacs", tmp_path)
    check_consistent(src, files)
    assert "seeded" in src.split_rule
    (tmp_path / "splits").mkdir()
    for d in PACS:
        rel = sorted(f.relative_to(tmp_path / "kfold").as_posix() for f in files if f.parts[-3] == d)
        (tmp_path / "splits" / f"{d}_train_kfold.txt").write_text("\n".join(f"{r} 1" for r in rel[:3]) + "\n")
        (tmp_path / "splits" / f"{d}_crossval_kfold.txt").write_text("\n".join(f"{r} 1" for r in rel[3:]) + "\n")
    src = load_source("pacs", tmp_path)
    check_consistent(src, files)
    assert len(src.train) == 4 * 3 and len(src.test) == 4 * 5  # the lists' split, not 80/20 per stratum
    assert "crossval_kfold" in src.split_rule


# --- Digits / imagefolder / textfolder ------------------------------------------------------------

def test_digits_own_train_test_folders(tmp_path):
    classes = [str(i) for i in range(3)]
    tr = make_tree(tmp_path, ["MNIST", "SVHN"], classes, 2, sub="train")
    te = make_tree(tmp_path, ["MNIST", "SVHN"], classes, 1, sub="test", seed=1)
    src = load_source("digits", tmp_path)
    assert src.domain_names == ["MNIST", "SVHN"] and src.class_names == classes
    assert set(src.train.items) == {str(p) for p in tr} and set(src.test.items) == {str(p) for p in te}
    check_consistent(src)
    import shutil

    shutil.rmtree(tmp_path / "SVHN" / "test")
    with pytest.raises(FileNotFoundError, match=r"some domains have train/ and test/ folders.*\['SVHN'\]"):
        load_source("digits", tmp_path)


def test_digits_seeded_and_imagefolder(tmp_path):
    files = make_tree(tmp_path, ["MNIST", "USPS", "SynthDigits"], ["0", "1"], 5, ext=".bmp")
    src = load_source("digits", tmp_path)
    assert src.domain_names == ["MNIST", "SynthDigits", "USPS"]  # any folders, sorted
    check_consistent(src, files)
    gen = load_source("imagefolder", tmp_path)
    assert gen.train.items == src.train.items and gen.test.items == src.test.items
    with pytest.raises(FileNotFoundError, match="holds no domain folders"):
        load_source("imagefolder", tmp_path / "MNIST" / "0")


def test_textfolder(tmp_path):
    files = make_tree(tmp_path, ["news", "fiction"], ["a", "b", "c"], 6, ext=".txt")
    (tmp_path / "news" / "a" / "notes.md").write_text("not an item")
    src = load_source("textfolder", tmp_path)
    assert src.modality == "text" and src.domain_names == ["fiction", "news"]
    check_consistent(src, files)
    assert len(src.test) == 6 and len(src.train) == 30


# --- Tiny-ImageNet ---------------------------------------------------------------------------------

def make_tiny(root: Path, wnids, n_train=3, n_val=2) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(reversed(wnids)) + "\n")
    (root / "words.txt").write_text("".join(f"{w}\tname {w[-1]}, other\n" for w in wnids) + "n999\tunused\n")
    ann = []
    for k, w in enumerate(wnids):
        for i in range(n_train):
            write_image(root / "train" / w / "images" / f"{w}_{i}.JPEG", rng)
        for i in range(n_val):
            name = f"val_{k * n_val + i}.JPEG"
            write_image(root / "val" / "images" / name, rng)
            ann.append(f"{name}\t{w}\t0\t0\t10\t10")
    (root / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")
    (root / "test" / "images").mkdir(parents=True)


def test_tiny_imagenet(tmp_path):
    wnids = ["n01443537", "n01629819", "n01641577"]
    make_tiny(tmp_path / "tiny-imagenet-200", wnids)
    src = load_source("tiny-imagenet", tmp_path)  # the parent of tiny-imagenet-200 works too
    assert src.class_names == wnids and src.domain_names == [] and src.train.domains is None
    assert src.class_text_names == ["name 7", "name 9", "name 7"]
    assert len(src.train) == 9 and len(src.test) == 6
    for split in (src.train, src.test):
        for item, y in zip(split.items, split.labels):
            p = Path(item)
            assert p.is_file()
            if split is src.train:
                assert p.parts[-3] == wnids[y]
    ann = dict(line.split("\t")[:2] for line in
               (tmp_path / "tiny-imagenet-200" / "val" / "val_annotations.txt").read_text().splitlines())
    assert [wnids[y] for y in src.test.labels] == [ann[Path(i).name] for i in src.test.items]
    assert "val/ = test" in src.split_rule


def test_tiny_imagenet_incomplete(tmp_path):
    root = tmp_path / "tiny-imagenet-200"
    make_tiny(root, ["n01", "n02"])
    (root / "val" / "images" / "val_3.JPEG").unlink()
    with pytest.raises(FileNotFoundError, match=r"incomplete: .*val_annotations.txt:4 names .*val_3.JPEG"):
        load_source("tiny-imagenet", root)
    import shutil

    shutil.rmtree(root / "train" / "n02")
    with pytest.raises(FileNotFoundError, match=r"incomplete: no training images for class n02"):
        load_source("tiny-imagenet", root)
    (root / "val" / "val_annotations.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"(?s)val_annotations.txt does not exist.*wnids.txt"):
        load_source("tiny-imagenet", root)


# --- CIFAR -------------------------------------------------------------------------------------------

def make_cifar(root: Path, name: str, n_per_batch: int = 4, seed: int = 0) -> dict:
    """The python-version layout with tiny batches; returns the pixels (n, 32, 32, 3) per split."""
    rng = np.random.default_rng(seed)
    if name == "cifar10":
        folder, train, test, meta, names, key = (root / "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)],
                                                 ["test_batch"], "batches.meta", "label_names", "labels")
        classes = ["airplane", "automobile", "bird"]
    else:
        folder, train, test, meta, names, key = root / "cifar-100-python", ["train"], ["test"], "meta", \
            "fine_label_names", "fine_labels"
        classes = ["apple", "aquarium_fish", "baby", "bear"]
    folder.mkdir(parents=True)
    with open(folder / meta, "wb") as f:
        pickle.dump({names: classes, "num_cases_per_batch": n_per_batch}, f, protocol=2)
    out = {}
    for part, files in (("train", train), ("test", test)):
        pix, labels = [], []
        for fname in files:
            data = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
            y = rng.integers(0, len(classes), n_per_batch).tolist()
            with open(folder / fname, "wb") as f:
                pickle.dump({"data": data, key: y, "filenames": [b"x.png"] * n_per_batch}, f, protocol=2)
            pix.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels += y
        out[part] = (np.concatenate(pix), np.array(labels))
    out["classes"] = classes
    return out


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar(tmp_path, name):
    truth = make_cifar(tmp_path, name)
    src = load_source(name, tmp_path)
    assert src.class_names == truth["classes"] and src.domain_names == []
    if name == "cifar100":
        assert src.class_text_names[1] == "aquarium fish"
    for part in ("train", "test"):
        split = src.split(part)
        pixels, labels = truth[part]
        assert len(split) == len(pixels) == (20 if part == "train" and name == "cifar10" else 4)
        assert np.array_equal(split.labels, labels)
        for i in (0, len(split) - 1):
            img = split.items[i]
            assert img.size == (32, 32) and img.mode == "RGB"
            assert np.array_equal(np.asarray(img), pixels[i])
    assert "official train and test" in src.split_rule
    # the fingerprint is the pixels: change one and the split's fingerprint changes
    truth2 = make_cifar(tmp_path / "other", name, seed=1)
    assert load_source(name, tmp_path / "other").train.fingerprint != src.train.fingerprint
    assert len(truth2["train"][0]) == len(src.train)


def test_cifar_missing_and_download_without_torchvision(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"(?s)cifar-10-batches-py lacks.*cifar-10-python.tar.gz.*--download"):
        load_source("cifar10", tmp_path)
    import builtins

    real_import = builtins.__import__

    def no_torchvision(name, *args, **kwargs):
        if name.startswith("torchvision"):
            raise RuntimeError("operator torchvision::nms does not exist")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchvision)
    with pytest.raises(RuntimeError, match=r"torchvision, which did not import.*nms.*cifar-100-python.tar.gz"):
        load_source("cifar100", tmp_path, download=True)


def test_cifar_batch_cannot_run_code(tmp_path):
    make_cifar(tmp_path, "cifar10")

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, ("echo pwned",))

    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({"data": Evil(), "labels": []}, f, protocol=2)
    with pytest.raises(ValueError, match=r"test_batch is not a CIFAR python-version batch.*not allowed"):
        load_source("cifar10", tmp_path)


# --- registry -----------------------------------------------------------------------------------------

def test_registry_names_and_bad_options(tmp_path):
    assert set(ADAPTERS) >= {"cifar10", "cifar100", "tiny-imagenet", "office-home", "office-31", "domainnet",
                             "pacs", "digits", "textfolder"}
    with pytest.raises(ValueError, match=r"unknown dataset 'imagenet'.*office-home"):
        load_source("imagenet", tmp_path)
    with pytest.raises(ValueError, match="test_fraction"):
        load_source("pacs", tmp_path, test_fraction=1.0)
    with pytest.raises(ValueError, match="no domains to select"):
        load_source("cifar10", tmp_path, domains=["a"])
    with pytest.raises(ValueError, match="--download is available for cifar10 and cifar100 only"):
        load_source("pacs", tmp_path, download=True)
