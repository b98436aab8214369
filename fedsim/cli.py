"""The ``fedsim`` command."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import sys
import threading
from pathlib import Path


def _demo(args) -> int:
    import torch

    import geomkern as gk

    from .demo import format_table, run_demo

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"geomkern {gk.__version__}, torch {torch.__version__}, backends {gk.available_backends()}, "
          f"{torch.get_num_threads()} threads")
    print(f"S-curve in D={args.dim}: {args.n} points, {args.clusters} patches, d={args.components}, "
          f"S={args.basis}, {args.dtype}")
    rows = run_demo(n=args.n, dim=args.dim, clusters=args.clusters, components=args.components,
                    basis=args.basis, holdout=args.holdout, steps=args.steps, dtype=args.dtype,
                    seed=args.seed)
    print(format_table(rows))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=2))
        print(f"wrote {out}")
    return 0


_DISPLAY = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "moon": "MOON",
            "feddyn": "FedDyn", "fedopt": "FedOpt", "fedadam": "FedAdam", "fedyogi": "FedYogi",
            "fedavgm": "FedAvgM", "fedntd": "FedNTD", "fedproto": "FedProto", "fedmp": "FedMP", "fedmp_sfmc": "FedMP-SFMC",
            "fedmp_cpgma": "FedMP-cPGMA", "ggeur": "GGEUR",
            "local": "Local", "fedrep": "FedRep", "flic": "FLIC", "fedhenn": "FedHeNN",
            "fedmc": "FedMC", "fedmc-fixed": "FedMC-fixed"}


def _default_augmenters(algorithms: str | None) -> str:
    """The default run's augmenters (those of config.default_methods) for global-model algorithms;
    none for personalised ones (local, fedrep, flic, fedhenn), whose clients may live in different
    feature spaces where no augmenter works."""
    from .algorithms import ALGORITHMS
    from .config import default_methods

    names = [a.strip().lower() for a in (algorithms or "fedavg").split(",") if a.strip()]
    personal = names and all(getattr(ALGORITHMS.get(a), "personal", False) for a in names)
    return "none" if personal else ",".join(dict.fromkeys(m.augmenter for m in default_methods()))


def _augmenters_help() -> str:
    """--augmenters' help, from the registries: every augmenter with its ``summary``, the default
    list and the personalised algorithms (made only when help is shown: _RegistryHelp)."""
    from .algorithms import ALGORITHMS
    from .augmenters import AUGMENTERS

    personal = sorted(n for n, cls in ALGORITHMS.items() if getattr(cls, "personal", False))
    each = "; ".join(f"{name}: {cls.summary}" for name, cls in AUGMENTERS.items())
    text = (f"comma list of augmenters (default {_default_augmenters(None)}; none for the personalised "
            f"algorithms {', '.join(personal)}). {each}")
    return text.replace("%", "%%")


class _RegistryHelp(argparse.HelpFormatter):
    """A help string that needs the plug-in registries (which import torch) is a function, called
    when help is shown: building the parser imports no registry, so `fedsim presets` stays fast."""

    def _format_action(self, action):
        if callable(action.help):
            action = copy.copy(action)
            action.help = action.help()
        return super()._format_action(action)


def _methods(algorithms: str, augmenters: str):
    from .runner import MethodSpec

    out = []
    for a in [x.strip().lower() for x in algorithms.split(",") if x.strip()]:
        for g in [x.strip().lower() for x in augmenters.split(",") if x.strip()]:
            name = _DISPLAY.get(a, a) + ("" if g == "none" else "+" + _DISPLAY.get(g, g))
            out.append(MethodSpec(name, algorithm=a, augmenter=g))
    return out


def run_config(args, given: dict):
    """The RunConfig of a new `fedsim run`: RunConfig defaults < --preset < --config file < flags
    (``given``: RunConfig field -> value of each config flag given; --algorithms/--augmenters;
    --set; --epsilon-total). Built and not yet validated (run() validates it)."""
    from . import presets
    from .config import RunConfig, apply_params, config_from_tables, parse_set, read_config_toml
    from .models import apply_run_defaults
    from .plugins import plugin_class

    # defaults < --preset < --config file < flags (fedsim/presets/__init__.py)
    tables = ([presets.load(args.preset)] if args.preset else []) + \
             ([read_config_toml(args.config)] if args.config else [])
    where = " + ".join(w for w, on in ((f"preset {args.preset}", args.preset),
                                       (f"config file {args.config}", args.config)) if on)
    cfg = config_from_tables(*tables, lookup=plugin_class, where=where) if tables else RunConfig()
    for attr, v in given.items():
        setattr(cfg, attr, v)
    if "model" in given:  # --model mlp:512x2 -> model "mlp", model_params hidden/depth (models.parse_model)
        from .models import parse_model

        cfg.model, sizes = parse_model(cfg.model)
        cfg.model_params = {**cfg.model_params, **sizes}
    apply_run_defaults(cfg)  # the model's rounds / batch_size / lr where nothing set them (models.RUN_DEFAULTS)
    if args.tune and "tune_lr" not in given:  # --tune: a grid around the run's lr
        from .runner import TUNE_LR_FACTORS

        cfg.tune_lr = [float(f"{cfg.lr * f:.6g}") for f in TUNE_LR_FACTORS]
    for flag, value in (("--algorithms", args.algorithms), ("--augmenters", args.augmenters)):
        if value is not None and not [x for x in value.split(",") if x.strip()]:  # "" ran the defaults silently
            raise ValueError(f"{flag} {value!r}: give at least one name, e.g. {flag} "
                             f"{'fedavg' if flag == '--algorithms' else 'none,ggeur'} (leave the flag out for the "
                             "defaults)")
    if args.algorithms or args.augmenters:
        params = {}  # the preset's / file's [params.PLUGIN] tables also reach the methods the flags name
        for t in tables:
            for plugin, kv in t.get("params", {}).items():
                params.setdefault(plugin, {}).update(kv)
        cfg.methods = _methods(args.algorithms or "fedavg", args.augmenters or _default_augmenters(args.algorithms))
        apply_params(cfg.methods, params, plugin_class, override=False)
    apply_params(cfg.methods, parse_set(args.set, plugin_class), plugin_class, override=True, source="--set")
    if args.epsilon_total is not None:
        from .augmenters import AUGMENTERS

        # the methods whose augmenter takes a DP budget (FedMC's two protocols), asked of the registry
        dp = [m for m in cfg.methods if "epsilon_total" in getattr(AUGMENTERS.get(m.augmenter), "defaults", {})]
        if not dp:
            raise ValueError(f"--epsilon-total {args.epsilon_total}: it budgets FedMC's DP releases, but no "
                             "method uses a FedMC augmenter (--augmenters fedmc or fedmc-fixed)")
        for m in dp:
            m.augmenter_params = {**m.augmenter_params, "epsilon_total": args.epsilon_total}
    return cfg


def _auto_threads(cfg) -> int:
    """--threads 0: fedsim/_threads.py's rule for this run's head and data (``cfg``: a RunConfig,
    or a resumed run's config.json); 1 where the data cannot be read here (run() then says why)."""
    import inspect

    from ._threads import default_threads, step_work
    from .config import RunConfig, read_config_json
    from .data import load_dataset
    from .models import MLPHead

    try:
        if isinstance(cfg, Path):
            cfg = RunConfig.from_dict(read_config_json(cfg)[0])
        ds = load_dataset(cfg.dataset)
    except (OSError, ValueError, KeyError, TypeError):
        return 1
    hidden = None
    if cfg.model == "mlp":
        hidden = cfg.model_params.get("hidden", inspect.signature(MLPHead).parameters["hidden"].default)
    return default_threads(step_work(cfg.batch_size, ds.dim, ds.n_classes, hidden))


def _run(args) -> int:
    import time

    import torch

    from .config import FLAGS
    from .report import format_table, partition_text
    from .runner import RunConfig, run

    if args.threads:
        torch.set_num_threads(args.threads)
    # RunConfig field -> value of each config flag given (FLAGS: the one field <-> flag table)
    given = {attr: getattr(args, flag[2:].replace("-", "_")) for attr, flag in FLAGS.items()
             if getattr(args, flag[2:].replace("-", "_")) is not None}
    if args.resume:
        for flag, v in (("--out", args.out), ("--config", args.config), ("--preset", args.preset),
                        ("--set", args.set), ("--algorithms", args.algorithms),
                        ("--augmenters", args.augmenters), ("--epsilon-total", args.epsilon_total),
                        ("--tune", args.tune or None)):
            if v is not None:
                raise ValueError(f"--resume {args.resume}: {flag} cannot be used with --resume (a resumed run "
                                 "keeps its configuration; only --rounds may grow)")
        out = Path(args.resume)
        cfg = RunConfig()
    else:
        cfg = run_config(args, given)
        out = Path(args.out or time.strftime("fedsim-out/run-%Y%m%d-%H%M%S"))
    if not args.threads:
        torch.set_num_threads(_auto_threads(out / "config.json" if args.resume else cfg))
    t0 = time.perf_counter()
    try:
        kw = dict(resume=bool(args.resume), progress=not args.quiet, changes=given if args.resume else None)
        if args.engine == "flower":  # fedsim/flower imports the runner, never the reverse
            from .flower import require_flower

            require_flower()  # a clear error without the optional extra, before it is imported
            from .flower.apps import run_simulation

            results = run_simulation(cfg, out, **kw)
        else:
            results = run(cfg, out, **kw)
    except KeyboardInterrupt:
        print(f"\ninterrupted: every finished round is checkpointed; continue with\n"
              f"  fedsim run --resume {out}", file=sys.stderr)
        _exit_now_if_threads_linger(130)
        return 130
    timings = json.loads((out / "timings.json").read_text())
    print(results["dataset"])
    c = results["config"]
    final = sorted(m["name"] for m in c["methods"] if m.get("algorithm_params", {}).get("final_epochs"))
    print(f"{partition_text(c)}{c['n_clients']} clients, {c['rounds']} rounds"
          + (f" + a final round of every client ({', '.join(final)})" if final else "")
          + f", {c['seeds']} seed(s) from {c['seed']}, model {c['model']}"
          + (f", validation {c['val_fraction']:g} of each client's training rows" if c.get("val_fraction") else ""))
    print(format_table(results, timings))
    print(f"wrote {out}/results.json, results.csv, timings.json, table.txt, accuracy.png, partition.png, "
          f"per_class.png ({time.perf_counter() - t0:.1f} s)")
    return 0


def _embed(args) -> int:
    import torch

    from .data.dataset import check_dataset_out
    from .embed import extract, load_source

    check_dataset_out(args.out, overwrite=args.overwrite)  # before the source and the encoder are loaded
    if args.threads:
        torch.set_num_threads(args.threads)
    domains = [d.strip() for d in args.domains.split(",") if d.strip()] if args.domains else None
    source = load_source(args.dataset, args.root, seed=args.seed, test_fraction=args.test_fraction,
                         domains=domains, download=args.download)
    print(f"{source.name}: {len(source.train)} train / {len(source.test)} test {source.modality} items, "
          f"{len(source.class_names)} classes"
          + (f", domains {source.domain_names}" if source.domain_names else "") + f"; split: {source.split_rule}")
    if (source.modality == "text") != (args.encoder == "minilm"):
        raise ValueError(f"{source.name} holds {source.modality} items: use --encoder "
                         f"{'minilm' if source.modality == 'text' else 'open_clip'}")
    try:
        if args.encoder == "minilm":
            from .embed.encoders import MiniLMEncoder

            device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
            encoder = MiniLMEncoder(device=device)
        else:
            from .embed.encoders import OpenCLIPEncoder

            encoder = OpenCLIPEncoder(args.model, args.pretrained, device=args.device)
        text_encoder = None
        if args.text_model == "clip":
            if args.encoder != "open_clip":
                raise ValueError("--text-model clip is the text tower of the open_clip model: use it with "
                                 "--encoder open_clip (or --text-model minilm)")
            text_encoder = encoder.text_encoder()
        elif args.text_model == "minilm":
            from .embed.encoders import MiniLMEncoder

            text_encoder = encoder if args.encoder == "minilm" else MiniLMEncoder()
    except ImportError as exc:
        print(f"fedsim: error: {exc}", file=sys.stderr)
        return 2
    prompts = args.prompt or (["a photo of a {}."] if args.text_model == "clip" else ["{}"])
    print(f"encoder {encoder.name} ({encoder.dim}-d)"
          + (f", class text: {text_encoder.name} with {prompts}" if text_encoder else ""))
    try:
        ds = extract(source, encoder, args.out, cache_dir=args.cache_dir, use_cache=not args.no_cache,
                     normalize=not args.no_normalize, dtype=args.dtype, batch_size=args.batch_size,
                     chunk_size=args.chunk_size, num_workers=args.workers, text_encoder=text_encoder,
                     prompts=prompts, progress=not args.quiet, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the finished chunks are kept in {args.out}.work; run the same command again "
              "to continue", file=sys.stderr)
        return 130
    print(f"{ds.summary()}; normalised={ds.meta['normalised']}"
          + (f", class_text {tuple(ds.class_text.shape)}" if ds.class_text is not None else ""))
    print(f"wrote {args.out}")
    return 0


def _exit_now_if_threads_linger(code: int) -> None:
    """After an interrupt, end the process now where threads that cannot be stopped are left.
    Flower's simulation runs fedsim's ServerApp in a thread that waits on its dead Ray actors, and
    Python's exit would join it: the process stayed alive after Ctrl-C, orphaned once its parent
    left. Every finished round is already checkpointed (atomic, fsynced writes), so nothing is lost."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _import(args) -> int:
    from .data import save_dataset
    from .data.dataset import check_dataset_out
    from .data.importer import format_summary, import_embeddings

    out = check_dataset_out(args.out, overwrite=args.overwrite)
    ds = import_embeddings(args.train_x, args.train_y, test_x=args.test_x, test_y=args.test_y,
                           test_fraction=args.test_fraction, class_names=args.class_names, domains=args.domains,
                           test_domains=args.test_domains, normalize=not args.no_normalize, seed=args.seed,
                           name=out.stem)
    save_dataset(ds, out)
    print(format_summary(ds))
    print(f"wrote {out}; train on it with: fedsim run --dataset {out}")
    return 0


def _presets(args) -> int:
    from . import presets

    if args.name:
        print(presets.text(args.name), end="")
        return 0
    for name in presets.names():
        print(f"{name:<14} {presets.describe(name)}")
    print("print one with: fedsim presets NAME; run with: fedsim run --preset NAME (flags override it)")
    return 0


def _number_list(kind):
    """argparse type: a comma list of numbers of ``kind`` (ranges are checked with the RunConfig)."""
    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of {kind.__name__}s, e.g. "
                                             f"{'0.01,0.05,0.2' if kind is float else '1,2,5'}; got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
        return values

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedsim", description="federated simulator for feature calibration "
                                "(FedMC, GGEUR) on frozen embeddings")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", formatter_class=_RegistryHelp, help="run a federated experiment (default: FedAvg, FedAvg+oversample, FedAvg+GGEUR, "
                                   "FedAvg+FedMC on the embedded data, Dirichlet beta=0.1, 10 clients)")
    r.add_argument("--config", help="TOML file with RunConfig keys, [[methods]] tables and [params.PLUGIN] tables; "
                   "over --preset, under the flags")
    r.add_argument("--preset", metavar="NAME", help="a paper's settings (fedsim presets lists them: fedmc-paper, "
                   "ggeur-paper); flags and --config override it")
    r.add_argument("--set", action="append", metavar="PLUGIN.KEY=VALUE",
                   help="an algorithm or augmenter hyper-parameter for every method using that plug-in, repeatable, "
                        "e.g. --set fedmc.n_base=512 --set fedprox.mu=0.01 --set ggeur.target_per_class=2000; "
                        "VALUE is a TOML scalar (a string may go unquoted); overrides --preset and --config")
    r.add_argument("--resume", metavar="DIR", help="continue an interrupted run in DIR")
    r.add_argument("--out", help="output folder (default fedsim-out/run-<time>)")
    r.add_argument("--dataset", help='"default" (embedded) or a dataset file written by `fedsim import` '
                   "(your own embeddings) or `fedsim embed`, or a seeded toy problem with per-client "
                   "feature spaces: toy:noisy-features | toy:linear-mapping, or wordnet:mixed (the embedded texts as "
                   "MiniLM for some clients, TF-IDF+SVD for others); options in the name, e.g. "
                   "'toy:linear-mapping?n_spaces=20&dims=3-99' or 'wordnet:mixed?prune=0' (docs/flic.md) "
                   "(default default, the embedded data)")
    r.add_argument("--partition", help="iid | dirichlet | domain | label_domain (default dirichlet; docs/data.md)")
    r.add_argument("--beta", type=float, help="Dirichlet concentration of dirichlet, of domain (label skew among "
                   "a domain's clients) and of label_domain (each class's share of every domain) (default 0.1)")
    r.add_argument("--clients", type=int, help="number of clients (default 10)")
    r.add_argument("--min-size", dest="min_size", type=int, help="minimum samples per client (default 10; at most "
                   "5 in the domain and label_domain partitions)")
    r.add_argument("--feature-shift", dest="feature_shift", type=float, metavar="ANGLE",
                   help="feature-shift option of the partition: every client sees its data (and its share of "
                        "the test set) through its own fixed random rotation of this strength (default 0: none)")
    r.add_argument("--feature-noise", dest="feature_noise", type=float, metavar="STD",
                   help="with it, fixed Gaussian noise of about this norm per row (default 0)")
    r.add_argument("--rounds", type=int, help="communication rounds (default per model: linear 30, mlp 30, prompt 5)")
    r.add_argument("--fraction", type=float, help="fraction of clients sampled per round (default 1)")
    r.add_argument("--epochs", type=int, help="local epochs per round (default 1)")
    r.add_argument("--batch-size", dest="batch_size", type=int, help="local batch size (default per model: linear 64, mlp 64, prompt 256)")
    r.add_argument("--lr", type=float, help="local learning rate (default per model, measured: linear 0.05, mlp 0.5, prompt 0.5)")
    r.add_argument("--model", help="linear (cosine head) | mlp | mlp:WIDTHxDEPTH (e.g. mlp:512x2; FedMP's trunk) | prompt (learnt prompt contexts on the frozen "
                   "MiniLM text tower, or a CLIP model's with model_params tower = \"clip\"; own defaults for rounds, batch size, lr: docs/prompt.md) (default linear)")
    r.add_argument("--algorithms", help="comma list, e.g. fedavg,fedprox,scaffold (default fedavg); each one runs "
                   "with every augmenter of --augmenters, so a bare run is 4 methods: FedAvg, FedAvg+oversample, "
                   "FedAvg+GGEUR, FedAvg+FedMC")
    r.add_argument("--augmenters", help=_augmenters_help)
    r.add_argument("--seed", type=int, help="first seed (default 0)")
    r.add_argument("--seeds", type=int, help="number of seeds; tables show mean ± std (default 1)")
    r.add_argument("--device", help="cpu | cuda (default cpu)")
    r.add_argument("--threads", type=int, default=0,
                   help="torch threads (default 0: one per 2**24 multiply-adds of a local step, at most the CPUs "
                        "this process may use; pass 1 on a shared machine)")
    r.add_argument("--centralised", dest="centralised", action="store_true", default=None,
                   help="also train the ceiling row 'Centralised': one client holding every client's training rows "
                        "as that client sees them (with --feature-shift/--feature-noise each row through its own "
                        "client's view, and tested on the same per-client views of the test rows as the federated "
                        "methods), the same head, FedAvg without augmenter, rounds x epochs epochs over the pooled "
                        "rows")
    r.add_argument("--val-fraction", dest="val_fraction", type=float, metavar="FRAC",
                   help="share of each client's training rows held out as its validation rows (seeded, stratified "
                        "per class; a class keeps at least one training row): every run checks convergence on them "
                        "(the table marks with * a method whose validation accuracy still rose by more than 0.2 "
                        "points per round over its last 5 rounds) and --tune chooses on them; the test rows are never "
                        "used to choose; 0: none (global-model runs; the personalised path keeps its own 80/20 split "
                        "and has none) (default 0.1)")
    r.add_argument("--tune", action="store_true",
                   help="choose each method's learning rate (the centralised row's too) on the validation rows: "
                        "every method runs at lr x 0.25, 0.5, 1, 2, 4 (lr: --lr or the model's default), and its "
                        "row is the run at the best validation accuracy (mean of the last 5 rounds and the seeds); "
                        "results.json records the grid, the scores and the choice (docs/comparisons.md)")
    r.add_argument("--tune-lr", dest="tune_lr", type=_number_list(float), metavar="LR,LR,...",
                   help="tune on this grid of learning rates instead of --tune's (default none: --tune's grid "
                        "with --tune, else lr is not tuned)")
    r.add_argument("--tune-epochs", dest="tune_epochs", type=_number_list(int), metavar="E,E,...",
                   help="also choose the local epochs from this grid (with --tune or --tune-lr: every pair) "
                        "(default none: not tuned)")
    r.add_argument("--zero-shot", dest="zero_shot", action="store_true", default=None,
                   help="initialise the linear head from the dataset's class-name text embeddings")
    r.add_argument("--epsilon-total", dest="epsilon_total", type=float, metavar="EPS",
                   help="FedMC's privacy budget per client for all of its DP releases together, split "
                        "evenly over the most it can make (2 under fedmc-fixed; 1 + rounds under fedmc, "
                        "Algorithm 1: one per round it takes part in); results.json reports what each "
                        "client spent. Instead of the per-release epsilon of its augmenter_params; inf: no "
                        "noise (written as the string \"inf\" in config.json and results.json)")
    r.add_argument("--engine", choices=("local", "flower"), default="local",
                   help="local: every client in this process (default); flower: Flower's Simulation Engine "
                        "(Ray), one virtual SuperNode per client, the same results (pip install 'geomkern[flower]'; "
                        "docs/flower.md)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.set_defaults(func=_run)
    fd = sub.add_parser("flower-demo", help="a real Flower deployment on 127.0.0.1: flower-superlink, one "
                        "flower-supernode per client (each loading its own partition), fedsim's ServerApp; "
                        "writes the run folder as fedsim run does (docs/flower.md)")
    fd.add_argument("--config", help="TOML file with RunConfig keys and [[methods]] (default: FedAvg+GGEUR, "
                    "3 clients, 3 rounds on the embedded data)")
    fd.add_argument("--out", help="output folder (default fedsim-out/flower-<time>)")
    fd.add_argument("--clients", type=int, help="number of clients = SuperNodes (overrides the config)")
    fd.add_argument("--rounds", type=int, help="communication rounds (overrides the config)")
    fd.add_argument("--timeout", type=float, default=600.0, help="seconds the whole deployment may take before it "
                    "is shut down (default 600)")
    fd.set_defaults(func=_flower_demo)
    d = sub.add_parser("demo", help="geometry demo: the FedMC client pipeline on an S-curve, per backend")
    d.add_argument("--n", type=int, default=6000, help="training points (default 6000)")
    d.add_argument("--dim", type=int, default=64, help="ambient dimension D (default 64)")
    d.add_argument("--clusters", type=int, default=8, help="K-Means patches (default 8)")
    d.add_argument("--components", type=int, default=4, help="kernel PCs per patch (default 4)")
    d.add_argument("--basis", type=int, default=128, help="basis points S (default 128)")
    d.add_argument("--holdout", type=int, default=500, help="points recovered by pre-image (default 500)")
    d.add_argument("--steps", type=int, default=100, help="pre-image iterations (default 100)")
    d.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    d.add_argument("--out", default="", help="also write the rows as JSON to this file")
    d.set_defaults(func=_demo)
    e = sub.add_parser("embed", help="extract frozen embeddings of an image (open_clip) or text (MiniLM) "
                                     "dataset into a dataset file for `fedsim run`")
    e.add_argument("--dataset", required=True, help="cifar10 | cifar100 | tiny-imagenet | office-home | office-31 "
                   "| domainnet | pacs | digits | imagefolder | textfolder (layouts: fedsim/embed/datasets.py)")
    e.add_argument("--root", required=True, help="the dataset folder")
    e.add_argument("--out", required=True, help="output .npz or .safetensors file")
    e.add_argument("--encoder", choices=("open_clip", "minilm"), default="open_clip",
                   help="open_clip (images; default) or minilm (text items, all-MiniLM-L6-v2)")
    e.add_argument("--model", default="ViT-B-16", help="open_clip model name (default ViT-B-16)")
    e.add_argument("--pretrained", default="openai", help="open_clip pretrained tag of the model (default openai; "
                   "e.g. laion2b_s34b_b88k), a local checkpoint file, or none (random weights)")
    e.add_argument("--text-model", dest="text_model", choices=("clip", "minilm"),
                   help="also store class-name text embeddings (class_text): clip = the open_clip model's "
                        "text tower (a zero-shot head), minilm = all-MiniLM-L6-v2")
    e.add_argument("--prompt", action="append", help="class-name template, repeatable (ensembled); default "
                   "'a photo of a {}.' for clip, '{}' for minilm")
    e.add_argument("--no-normalize", dest="no_normalize", action="store_true",
                   help="store raw embeddings (default: L2-normalised rows; recorded in meta['normalised'])")
    e.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="storage dtype")
    e.add_argument("--cache-dir", dest="cache_dir", help="embedding cache (default $FEDSIM_CACHE or ~/.cache/fedsim)")
    e.add_argument("--no-cache", dest="no_cache", action="store_true", help="neither read nor write the cache")
    e.add_argument("--batch-size", dest="batch_size", type=int, default=256, help="encoder batch (default 256)")
    e.add_argument("--chunk-size", dest="chunk_size", type=int,
                   help="rows per resumable chunk, a multiple of --batch-size (default 16 batches)")
    e.add_argument("--workers", type=int, help="DataLoader worker processes (default min(8, CPUs))")
    e.add_argument("--device", default="auto", help="auto | cpu | cuda[:i] (AMP float16 on CUDA)")
    e.add_argument("--test-fraction", dest="test_fraction", type=float, default=0.2,
                   help="test share of the seeded split (datasets without their own split; default 0.2)")
    e.add_argument("--seed", type=int, default=0, help="seed of that split (default 0)")
    e.add_argument("--domains", help="comma list: only these domain folders (folder datasets)")
    e.add_argument("--download", action="store_true", help="cifar10/cifar100: download through torchvision")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    e.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    e.add_argument("--quiet", action="store_true", help="no progress bars")
    e.set_defaults(func=_embed)
    pr = sub.add_parser("presets", help="list the paper presets of fedsim run --preset, or print one")
    pr.add_argument("name", nargs="?", help="print this preset's TOML")
    pr.set_defaults(func=_presets)
    i = sub.add_parser("import", help="turn your own embeddings and labels (.npy, .npz, .pt, .safetensors, .csv, "
                                      ".parquet) into a dataset file for `fedsim run`",
                       description="Features and labels from .npy, .npz (one array or FILE.npz:KEY), .pt/.pth "
                       "(a tensor or a dict of tensors; torch.load weights_only=True), .safetensors, .csv or "
                       ".parquet (one column per dimension or one list-valued column; labels/domains one "
                       "column, FILE.csv:COLUMN). Labels are integer ids or strings (mapped to ids in sorted "
                       "order). Layout and examples: docs/own-embeddings.md.")
    i.add_argument("--train-x", dest="train_x", required=True, metavar="F", help="train features (n, D)")
    i.add_argument("--train-y", dest="train_y", required=True, metavar="F", help="train labels (n,)")
    i.add_argument("--test-x", dest="test_x", metavar="F", help="test features (m, D): the files' own split")
    i.add_argument("--test-y", dest="test_y", metavar="F", help="test labels (m,)")
    i.add_argument("--test-fraction", dest="test_fraction", type=float, metavar="FRAC",
                   help="without --test-x/--test-y: test share of the seeded stratified split per (domain, "
                        "class), as in fedsim embed (default 0.2)")
    i.add_argument("--seed", type=int, default=0, metavar="N", help="seed of that split (default 0)")
    i.add_argument("--class-names", dest="class_names", metavar="F",
                   help="text file, one class name per line (line i = label i; string labels must be listed); "
                        "default class_0, class_1, ... or the sorted string labels")
    i.add_argument("--domains", metavar="F", help="domain label per train row (ids or strings); enables "
                                                  "--partition domain / label_domain")
    i.add_argument("--test-domains", dest="test_domains", metavar="F",
                   help="domain label per test row (with --test-x/--test-y and --domains)")
    i.add_argument("--no-normalize", dest="no_normalize", action="store_true",
                   help="keep raw rows (default: L2-normalise every row; recorded in meta['normalised'])")
    i.add_argument("--out", required=True, help="output .npz or .safetensors dataset file")
    i.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    i.set_defaults(func=_import)
    return p


def _flower_demo(args) -> int:
    import time

    from .flower.deploy import demo_config, run_deployment

    cfg = demo_config(args.config, clients=args.clients, rounds=args.rounds)
    out = Path(args.out or time.strftime("fedsim-out/flower-%Y%m%d-%H%M%S"))
    results = run_deployment(cfg, out, timeout=args.timeout)
    from .report import format_table

    print(format_table(results, json.loads((out / "timings.json").read_text())))
    print(f"wrote {out}/results.json (Flower deployment: 1 SuperLink, {cfg.n_clients} SuperNodes; logs in {out}/flower-logs)")
    return 0


# the `fedsim` extra of pyproject.toml (import name: distribution); plain `geomkern` needs none
_EXTRA_MODULES = {"matplotlib": "matplotlib", "PIL": "Pillow", "sklearn": "scikit-learn", "tqdm": "tqdm"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = [dist for m, dist in _EXTRA_MODULES.items() if importlib.util.find_spec(m) is None]
    if missing:
        print(f"fedsim: error: missing {', '.join(missing)}; install the simulator's dependencies with "
              "pip install 'geomkern[fedsim]'", file=sys.stderr)
        return 2
    from .config import check_cli_numbers

    try:
        check_cli_numbers(args)
        return args.func(args)
    except (ValueError, TypeError, RuntimeError, OSError) as exc:  # OSError: FileNotFoundError, PermissionError, ...
        print(f"fedsim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
