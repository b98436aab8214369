#!/usr/bin/env python3
"""Build the second real representation of the embedded WordNet data: TF-IDF + truncated SVD.

The embedded dataset (fedsim/data/wordnet_minilm.npz) stores MiniLM embeddings and, in its
metadata, the WordNet 3.0 synset offset of every row, but not the texts. The texts are rebuilt
here from WordNet's data.noun exactly as scripts/build_default_dataset.py made them ("<first
lemma>: <gloss>"), checked against the sha256 of data.noun that the dataset records, and
represented a second way: a TF-IDF of character 3- to 5-grams within words, reduced by truncated SVD to ``--dim``
dimensions, rows L2-normalised. The vectoriser and the SVD are fitted on the WordNet noun synsets
that are in *neither* split of the dataset, so the representation never saw a row it is used on
(as MiniLM was trained elsewhere). The output has the same rows in the same order, the same
labels and class names; ``fedsim run --dataset wordnet:mixed`` (fedsim/data/mixed.py) gives some
clients the MiniLM rows and others these.

Needs (besides fedsim): apt-get install wordnet-base; scikit-learn (the fedsim extra).

    python scripts/build_tfidf_view.py        # writes fedsim/data/wordnet_tfidf.npz
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from build_default_dataset import fail, read_noun_synsets, sha256  # noqa: E402

from fedsim.data import Dataset, load_dataset, save_dataset  # noqa: E402
from fedsim.data.dataset import EMBEDDED_DIR  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wordnet-dir", type=Path, default=Path("/usr/share/wordnet"))
    ap.add_argument("--out", type=Path, default=EMBEDDED_DIR / "wordnet_tfidf.npz")
    ap.add_argument("--dim", type=int, default=100, help="SVD components (default 100; MiniLM has 384)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    base = load_dataset("default")
    data_noun = args.wordnet_dir / "data.noun"
    if not data_noun.is_file():
        fail(f"{data_noun} not found: install the WordNet 3.0 database (apt-get install wordnet-base)")
    want = base.meta["source"]["file_sha256"]
    if sha256(data_noun) != want:
        fail(f"{data_noun} is not the file the embedded dataset was built from (sha256 {want})")
    synsets, _ = read_noun_synsets(data_noun)
    text_of = {f"{off:08d}": text for off, _, text in synsets}
    offsets = base.meta["synset_offsets"]
    used = set(offsets["train"]) | set(offsets["test"])
    missing = sorted(used - set(text_of))
    if missing:
        fail(f"{len(missing)} synset offsets of the dataset are not in {data_noun} (first {missing[0]})")
    corpus = [t for off, t in text_of.items() if off not in used]
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True, min_df=2)
    svd = TruncatedSVD(n_components=args.dim, random_state=args.seed)
    svd.fit(vec.fit_transform(corpus))

    arrays = {}
    for split in ("train", "test"):
        z = svd.transform(vec.transform([text_of[o] for o in offsets[split]]))
        norms = np.linalg.norm(z, axis=1, keepdims=True)
        if (norms == 0).any():
            fail(f"{int((norms == 0).sum())} {split} rows have an empty TF-IDF vector")
        arrays[f"x_{split}"] = torch.from_numpy(z / norms).to(torch.float16)
        arrays[f"y_{split}"] = getattr(base, f"y_{split}").clone()
    meta = {
        "description": "WordNet 3.0 noun synsets (lemma + gloss) as TF-IDF + truncated SVD; the rows, order, "
                       "labels and classes of wordnet_minilm.npz",
        "source": {k: v for k, v in base.meta["source"].items()},
        "representation": {
            "tfidf": "sklearn TfidfVectorizer(analyzer='char_wb', ngram_range=(3, 5), sublinear_tf=True, min_df=2)",
            "svd": f"sklearn TruncatedSVD(n_components={args.dim}, random_state={args.seed})",
            "fitted_on": f"the {len(corpus)} WordNet noun synsets in neither split of wordnet_minilm.npz",
            "explained_variance": round(float(svd.explained_variance_ratio_.sum()), 4),
            "vocabulary": len(vec.vocabulary_),
            "scikit_learn": metadata.version("scikit-learn"),
        },
        "text": base.meta["selection"]["text"],
        "rows_of": {"file": "wordnet_minilm.npz",
                    "synset_offsets_sha256": hashlib.sha256(
                        ("|".join(offsets["train"]) + "#" + "|".join(offsets["test"])).encode()).hexdigest()},
        "normalised": True,
        "dtype_on_disk": "float16",
        "built": datetime.date.today().isoformat(),
        "builder": "scripts/build_tfidf_view.py",
    }
    ds = Dataset(name="wordnet_tfidf", class_names=list(base.class_names), meta=meta, **arrays)
    path = save_dataset(ds, args.out)
    back = load_dataset(path)
    from sklearn.linear_model import LogisticRegression

    lr = LogisticRegression(max_iter=3000).fit(back.x_train.float().numpy(), back.y_train.numpy())
    print(back.summary())
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MiB); explained variance "
          f"{meta['representation']['explained_variance']}; logistic regression test accuracy "
          f"{lr.score(back.x_test.float().numpy(), back.y_test.numpy()):.4f}")


if __name__ == "__main__":
    main()
