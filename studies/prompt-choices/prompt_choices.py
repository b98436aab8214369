"""How the prompt head's defaults were chosen (docs/prompt.md).

    python studies/prompt-choices/prompt_choices.py zero-shot        # zero-shot accuracy of each class-name text
    python studies/prompt-choices/prompt_choices.py sweep            # 6 rounds of FedAvg (beta 0.1, seed 0) per setting

``zero-shot``: the tower's sentence embeddings of each candidate text are the class weights;
accuracy = nearest class text (cosine) on the embedded data's test rows. ``sweep``: one
``fedsim.runner.run`` per setting (FedAvg only), printing the accuracy per round and the
process (CPU) time of the run; one thread (torch.set_num_threads(1)).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from fedsim import runner
from fedsim.data import load_dataset
from fedsim.prompt import LEXNAME_CONTENTS, class_text, load_tower

TEXTS = {
    "the stored name": lambda n: n,
    "word": lambda n: class_text(n, "word"),
    "lexnames description": lambda n: LEXNAME_CONTENTS[n],
    "word: lexnames description": lambda n: f"{class_text(n)}: {LEXNAME_CONTENTS[n]}",
    "a kind of + word": lambda n: f"a kind of {class_text(n)}",
    "a noun of type + word": lambda n: f"a noun of type {class_text(n)}",
    "a noun of type + lexnames description": lambda n: f"a noun of type {LEXNAME_CONTENTS[n]}",
    "a noun denoting a kind of + word": lambda n: f"a noun denoting a kind of {class_text(n)}",
    "a dictionary gloss of a noun in the wordnet category of + word":
        lambda n: f"a dictionary gloss of a noun in the wordnet category of {class_text(n)}",
}

SWEEP = [
    {}, {"lr": 2.0}, {"lr": 8.0}, {"batch_size": 256}, {"batch_size": 256, "lr": 2.0},
    {"model_params": {"scale": 50.0}}, {"model_params": {"n_ctx": 8}}, {"model_params": {"n_ctx": 16}},
    {"model_params": {"csc": True}},
]


def zero_shot() -> None:
    ds = load_dataset("default")
    tower = load_tower()
    x = torch.nn.functional.normalize(ds.x_test.float(), dim=1)
    for what, make in TEXTS.items():
        texts = [make(n) for n in ds.class_names]
        acc = float(((x @ tower.encode(texts).T).argmax(1) == ds.y_test).double().mean())
        print(f"{what:65s} {texts[1]!r:50s} {100 * acc:6.2f}")


def sweep(rounds: int) -> None:
    for change in SWEEP:
        kw = {"rounds": rounds, "batch_size": 1024, "lr": 0.5, **change}
        cfg = runner.RunConfig(model="prompt", methods=[runner.MethodSpec("FedAvg")], **kw)
        t0 = time.process_time()
        with tempfile.TemporaryDirectory() as d:
            res = runner.run(cfg, Path(d) / "run", progress=False)
        m = res["methods"]["FedAvg"]["seeds"]["0"]
        print(json.dumps({"setting": kw, "cpu_s": round(time.process_time() - t0, 1),
                          "zero_shot": round(m["zero_shot_accuracy"], 4),
                          "accuracy": [round(a, 4) for a in m["accuracy"]]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("zero-shot", "sweep"))
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(1)
    zero_shot() if args.what == "zero-shot" else sweep(args.rounds)


if __name__ == "__main__":
    main()
