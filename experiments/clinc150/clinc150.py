#!/usr/bin/env python
"""CLINC150 (151 intents with out-of-scope): softmax against the papers' alternatives (by default sparse_softmax,
as_softmax and as_softmax with AS-Speed; ``--methods`` adds T-softmax, sparsemax, entmax-1.5, label smoothing
and AM-softmax), several seeds each, through the real ``fairseq-train`` / ``fairseq-validate`` commands.

Every run trains ``--arch text_encoder`` from scratch, or fine-tunes a pretrained encoder
(``--hf-model-dir DIR``, e.g. all-MiniLM-L6-v2 from ``scripts/extract_minilm.py``: ``--arch hf_encoder`` on data
tokenised with its own tokenizer, in the BERT fine-tuning regime: AdamW, learning rate 5e-5 with 10 % linear
warm-up then linear decay, batch 32, 3 epochs; AS-Softmax with the paper's warm-up, δ = 1 for the first 10 % of
updates, while the learning rate warms up and the new head is still near random). Every method trains for the
same number of epochs (the same samples) and validates every ``--validate-every`` updates; the checkpoint with
the best validation accuracy is scored on the test split. The table gives test accuracy and macro-F1 (mean ± sd
over seeds), the wall-clock time at which the best validation accuracy was reached, and that time relative to
softmax; a second time column, "to softmax's accuracy", is the first validation at which a run reached the best
validation accuracy of the worst softmax seed (an accuracy every softmax run reached).
Wall-clock is fairseq's own ``wall`` (whole seconds since the run started, validations included).
The plots show validation accuracy per update, per second and per epoch, the validation softmax
cross-entropy per update, and, for AS-Softmax, the masked-sample ratio and the accumulation steps per
update (the AS paper's Figure 1). Test scores also come as CLINC150 is read (Larson et al. 2019): accuracy on the
150 intents and recall of ``oos``, whose share is 18 % of the test split and 3 % of the validation split.

Where the papers leave a method's hyper-parameter open (T-softmax's temperature, label smoothing's epsilon,
AM-softmax's margin: ``CHOICES``), each value runs on seed 1 and the value with the best validation accuracy
runs on every seed (the first value listed on a tie); ``results.md`` lists what each value reached.

    python experiments/clinc150/clinc150.py            # ~30 min on 2 CPU cores
    python experiments/clinc150/clinc150.py --full     # larger encoder, more epochs
    python experiments/clinc150/clinc150.py --hf-model-dir models/all-MiniLM-L6-v2   # ~3 min an epoch a run

Fine-tuning, ``--methods ... as_softmax+as_speed as_softmax+as_speed+fitted_decay`` adds AS-Speed with its
learning-rate decay ending at the update count of the same seed's AS-Speed run, where it would end on time.

Data, logs and per-run records go to OUT/work; runs found there (a ``result.json``: the test scores and the curves
the tables and plots read) are reused, ``--fresh`` re-runs them, and the records are committed, so seeds and methods
can be added later. OUT gets ``results.md`` (table and command), ``runs.json`` (per-run numbers) and ``curves.png``.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from tqdm import tqdm

from user_dir import hf_checkpoint

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "benchmarks")]
from measure import BIN, ROOT, json_records, mean_sd, paired_difference, pyplot, run  # noqa: E402  (benchmarks/)

DEFAULT_JSON = ROOT.parent / "shared" / "data" / "clinc150" / "data_full.json"

METHODS = {  # in the AS-Softmax paper's order
    "softmax": ["--criterion", "softmax"],
    "temperature_softmax": ["--criterion", "temperature_softmax"],
    "sparse_softmax": ["--criterion", "sparse_softmax", "--sparse-topk", "10"],
    "sparsemax": ["--criterion", "sparsemax"],
    "entmax15": ["--criterion", "entmax15"],
    "label_smoothing": ["--criterion", "softmax"],
    "am_softmax": ["--criterion", "am_softmax", "--classifier", "cosine"],  # s = 30 (--cosine-scale's default)
    "as_softmax": ["--criterion", "as_softmax", "--as-delta", "0.3"],
    "as_softmax+as_speed": ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-speed",
                            "--as-speed-lambda", "1.0", "--as-speed-max-steps", "4"],
}
# AS-Speed makes fewer updates than the decay, counted in updates, was sized for, so its learning rate is still
# high when the epochs end; this variant sizes the decay to the updates the same seed's AS-Speed run made
# (fine-tuning only: from scratch the rate is constant), to tell the two effects on accuracy apart
FITTED = "as_softmax+as_speed+fitted_decay"
METHODS[FITTED] = METHODS["as_softmax+as_speed"]
#: the default --methods: the four of the committed from-scratch tables
CORE = ["softmax", "sparse_softmax", "as_softmax", "as_softmax+as_speed"]
#: hyper-parameters the papers leave open, each with the values tried on seed 1's validation (see the module doc)
CHOICES = {"temperature_softmax": ("--softmax-temperature", ["0.5", "2"]),
           "label_smoothing": ("--label-smoothing", ["0.1", "0.2"]),
           "am_softmax": ("--softmax-margin", ["0.2", "0.35"])}
SELECTION_SEED = 1
#: fairseq-validate's scores of the best checkpoint on the test split (the last two by --out-of-scope-label oos)
TEST_SCORES = ("accuracy", "macro_f1", "in_scope_accuracy", "out_of_scope_recall")
SETTINGS = {  # from scratch: our small encoder, adam at 1e-3, constant rate
    "default": {"epochs": 6, "batch_size": 64, "lr": 0.001, "validate_every": 50,
                "model": ["--arch", "text_encoder", "--encoder-layers", "2", "--encoder-embed-dim", "128",
                          "--encoder-ffn-embed-dim", "256", "--dropout", "0.1"]},
    "full": {"epochs": 20, "batch_size": 64, "lr": 0.001, "validate_every": 50,
             "model": ["--arch", "text_encoder", "--encoder-layers", "4", "--encoder-embed-dim", "256",
                       "--encoder-ffn-embed-dim", "1024", "--dropout", "0.1"]},
    # + --hf-model-dir; a validation through the pretrained encoder costs more, so fewer (about 5 an epoch)
    "pretrained": {"epochs": 3, "batch_size": 32, "lr": 5e-5, "validate_every": 100, "as_warmup_ratio": 0.1,
                   "model": ["--arch", "hf_encoder"]},
}


def setting(args) -> dict:
    return SETTINGS["pretrained" if args.hf_model_dir else "full" if args.full else "default"]


def method_flags(args, method: str, value: str | None) -> list[str]:
    """The method's criterion flags with its ``CHOICES`` value, plus AS-Softmax's warm-up where the setting has
    one (it is a share of --max-update, which only the fine-tuning schedule sets)."""
    warmup = setting(args).get("as_warmup_ratio")
    return (METHODS[method] + ([CHOICES[method][0], value] if value else [])
            + (["--as-warmup-ratio", warmup] if warmup and method.startswith("as_softmax") else []))


def run_name(method: str, value: str | None) -> str:
    """The method's table row: its name, and its ``CHOICES`` flag and value."""
    return f"{method} {CHOICES[method][0]} {value}" if value else method


def run_folder(args, method: str, seed: int, value: str | None = None) -> Path:
    return args.out / "work" / f"{method}{'=' + value if value else ''}-seed{seed}"


def schedule(args, method: str, seed: int) -> list[str]:
    """Optimiser and learning-rate flags: from scratch a constant rate; fine-tuning the BERT regime (decoupled
    weight decay 0.01, 10 % linear warm-up, then linear decay to 0 at the last update, which ends training:
    fairseq's batches per epoch may differ from sentences / batch size). The fitted AS-Speed variant decays to 0
    at the update count of the same seed's AS-Speed run instead (warm-up and --max-update unchanged)."""
    if not args.hf_model_dir:
        return ["--optimizer", "adam", "--lr", args.lr]
    updates = args.epochs * math.ceil(args.train_sentences / args.batch_size)
    decay = updates_made(args, "as_softmax+as_speed", seed) if method == FITTED else updates
    return ["--optimizer", "adam", "--adam-betas", "(0.9, 0.999)", "--weight-decay", "0.01",
            "--lr", args.lr, "--lr-scheduler", "polynomial_decay",
            "--warmup-updates", max(1, updates // 10), "--total-num-update", decay, "--max-update", updates]


def updates_made(args, method: str, seed: int) -> int:
    return json.loads((run_folder(args, method, seed) / "result.json").read_text(encoding="utf-8"))["updates"]


def prepare(args) -> Path:
    data = args.out / "work" / "data"
    if not (data / "data-bin" / "label" / "dict.txt").exists():
        if not args.clinc_json.exists():
            sys.exit(f"{args.clinc_json} not found: pass --clinc-json path/to/data_full.json")
        tokens = (["--hf-tokenizer", args.hf_model_dir] if args.hf_model_dir
                  else ["--lowercase", "--spm-vocab-size", "4000"])
        run([sys.executable, ROOT / "data-prep" / "prepare_classification.py", data, "--dataset", "clinc150",
             "--input", args.clinc_json, *tokens, "--overwrite"])
    args.train_sentences = json.loads((data / "prep_summary.json").read_text())["splits"]["train"]["written"]
    return data / "data-bin"


def validations(args) -> list:
    """Validate every N updates and save there too: fairseq keeps checkpoint_best.pt only when it saves, so
    validating alone would test the best *epoch-end* checkpoint, not the best validation. Only the newest
    mid-epoch checkpoint is kept, without optimizer state (the runs are never resumed)."""
    return ["--validate-interval-updates", args.validate_every, "--save-interval-updates", args.validate_every,
            "--keep-interval-updates", "1", "--no-epoch-checkpoints", "--no-last-checkpoints",
            "--no-save-optimizer-state"]


def train_and_test(args, data: Path, method: str, seed: int, value: str | None = None) -> dict:
    """One run: its record, ``result.json`` (its test scores and what the tables need of its training log,
    ``log_summary``), made once; the weights are deleted."""
    folder = run_folder(args, method, seed, value)
    result_file, train_log = folder / "result.json", folder / "train.log"
    if not result_file.exists() or args.fresh:
        folder.mkdir(parents=True, exist_ok=True)
        run([BIN / "fairseq-train", data, "--user-dir", ROOT / "user_dir", "--task", "text_classification",
             *setting(args)["model"], *(["--hf-model-dir", args.hf_model_dir] if args.hf_model_dir else []),
             *method_flags(args, method, value), "--seed", seed, "--cpu", *schedule(args, method, seed),
             "--batch-size", args.batch_size, "--batch-size-valid", "512", "--max-epoch", args.epochs,
             *validations(args), "--out-of-scope-label", "oos",
             "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
             "--save-dir", folder / "checkpoints", "--log-format", "json", "--log-interval", "1",
             "--num-workers", "0"], train_log)
        test = json_records(run([BIN / "fairseq-validate", data, "--user-dir", ROOT / "user_dir", "--task",
                                 "text_classification", "--path", folder / "checkpoints" / "checkpoint_best.pt",
                                 "--valid-subset", "test", "--cpu", "--batch-size", "512", "--log-format", "json"]),
                            "test")[0]
        record = {f"test_{key}": float(test[key]) for key in TEST_SCORES}
        result_file.write_text(json.dumps({**record, **log_summary(train_log.read_text(encoding="utf-8"))})
                               + "\n", encoding="utf-8")
        for checkpoint in (folder / "checkpoints").glob("*.pt"):  # the numbers are kept; the weights are not
            checkpoint.unlink()
    result = json.loads(result_file.read_text(encoding="utf-8"))
    for point in result["valid"]:
        point["epochs"] = point.pop("sentences") / args.train_sentences
    return {"method": run_name(method, value), "seed": seed, **result}


def log_summary(log: str) -> dict:
    """What a run's record keeps of its training log: the valid curve (accuracy, nll, the seconds and sentences
    of training at each validation), the masked share and accumulation steps of every update, the seconds of
    training and the updates made."""
    inner = json_records(log, "train_inner")
    seen, sentences = 0.0, {}
    for r in inner:
        seen += float(r["bsz"])
        sentences[int(r["num_updates"])] = seen
    wall = {int(r["num_updates"]): float(r["wall"]) for r in inner}
    valid = [{"update": int(r["num_updates"]), "accuracy": float(r["accuracy"]), "nll": float(r["nll_loss"]),
              "wall": wall[int(r["num_updates"])], "sentences": sentences[int(r["num_updates"])]}
             for r in json_records(log, "valid")]
    train = [{"update": int(r["num_updates"]), "masked_ratio": float(r.get("masked_ratio", 0.0)),
              "accum_steps": float(r.get("accum_steps", 1))} for r in inner]
    return {"valid": valid, "train": train, "wall": float(inner[-1]["wall"]), "updates": int(inner[-1]["num_updates"])}


def run_methods(args, data: Path) -> tuple[dict[str, list[dict]], dict[str, dict[str, dict]]]:
    """Every run of the table: first each ``CHOICES`` value on seed 1, then the seeds in turn, each seed's
    methods in METHODS' order (interleaved, so that machine noise hits every method alike; AS-Speed before
    FITTED), those with ``CHOICES`` at their chosen value. Returns the runs per table row, and per method with
    ``CHOICES`` its seed-1 run per value."""
    methods = [m for m in METHODS if m in args.methods]
    candidates = [(m, value) for m in methods if m in CHOICES for value in CHOICES[m][1]]
    tried: dict[str, dict[str, dict]] = {m: {} for m, _ in candidates}
    with tqdm(total=len(candidates) + len(args.seeds) * len(methods), desc="training runs", unit="run") as bar:
        for method, value in candidates:
            tried[method][value] = train_and_test(args, data, method, SELECTION_SEED, value)
            bar.update()
        chosen = choose(tried)
        results: dict[str, list[dict]] = {run_name(m, chosen.get(m)): [] for m in methods}
        for seed in args.seeds:
            for method in methods:  # a chosen value's seed-1 run is read back from its record
                results[run_name(method, chosen.get(method))].append(
                    train_and_test(args, data, method, seed, chosen.get(method)))
                bar.update()
    return results, tried


def choose(tried: dict[str, dict[str, dict]]) -> dict[str, str]:
    """Per method, the value whose seed-1 run reached the best validation accuracy (the first listed on a tie)."""
    return {method: max(runs, key=lambda value: best(runs[value])["accuracy"]) for method, runs in tried.items()}


def best(result: dict) -> dict:
    """The first validation with the run's best accuracy."""
    top = max(v["accuracy"] for v in result["valid"])
    return next(v for v in result["valid"] if v["accuracy"] == top)


def first_reaching(result: dict, accuracy: float) -> dict | None:
    """The first validation at or above ``accuracy``."""
    return next((v for v in result["valid"] if v["accuracy"] >= accuracy), None)


def table(results: dict[str, list[dict]]) -> str:
    target = min(best(r)["accuracy"] for r in results["softmax"])  # every softmax seed reached it

    def mean(values) -> float:
        return statistics.mean(list(values))

    base_best = mean(best(r)["wall"] for r in results["softmax"])
    base_target = mean(first_reaching(r, target)["wall"] for r in results["softmax"])
    rows = ["| method | test accuracy | test macro-F1 | test in-scope accuracy | test oos recall | best valid accuracy "
            f"| s to best valid (× softmax) | epochs to best | s to valid {target:.2f} (× softmax) "
            f"| epochs to {target:.2f} | s per run | updates |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for method, runs in results.items():
        to_best = mean(best(r)["wall"] for r in runs)
        reached = [first_reaching(r, target) for r in runs]
        if None in reached:
            to_target = epochs_to_target = f"not reached in {reached.count(None)}/{len(runs)} runs"
        else:
            seconds = mean(v["wall"] for v in reached)
            to_target = relative(seconds, base_target)
            epochs_to_target = f"{mean(v['epochs'] for v in reached):.2f}"
        scores = " | ".join(test_score(runs, f"test_{key}") for key in TEST_SCORES)
        rows.append(f"| {method} | {scores} | {mean_sd([best(r)['accuracy'] for r in runs])} "
                    f"| {relative(to_best, base_best)} | {mean(best(r)['epochs'] for r in runs):.2f} "
                    f"| {to_target} | {epochs_to_target} | {mean(r['wall'] for r in runs):.0f} "
                    f"| {mean(r['train'][-1]['update'] for r in runs):.0f} |")
    return "\n".join(rows) + "\n\n" + differences(results)


def relative(seconds: float, softmax: float) -> str:
    """Seconds, and softmax's seconds over them (fairseq's wall-clock is whole seconds: 0 in a tiny run)."""
    return f"{seconds:.0f} ({softmax / seconds:.2f}×)" if seconds else "0"


def test_score(runs: list[dict], key: str) -> str:
    """Mean ± sd of a test score over the runs; records made before a score was kept lack it, and say so."""
    missing = sum(key not in r for r in runs)
    return f"not recorded in {missing}/{len(runs)} runs" if missing else mean_sd([r[key] for r in runs])


def selection(tried: dict[str, dict[str, dict]]) -> str:
    """What each ``CHOICES`` value reached on seed 1's validation, and the value chosen."""
    chosen = choose(tried)
    return "\n".join([f"Chosen on seed {SELECTION_SEED}'s best validation accuracy:", ""] + [
        f"- {method} {CHOICES[method][0]}: "
        + ", ".join(f"{value}: {best(run)['accuracy']:.2f}" for value, run in runs.items()) + f" → {chosen[method]}"
        for method, runs in tried.items()])


def differences(results: dict[str, list[dict]]) -> str:
    """Each method's test accuracy minus softmax's on the same seed."""
    def accuracy(runs: list[dict]) -> dict[int, float]:
        return {r["seed"]: r["test_accuracy"] for r in runs}

    return "\n".join(["Test accuracy minus softmax's on the same seed (mean ± sd over seeds):", ""] + [
        f"- {method}: {paired_difference(accuracy(runs), accuracy(results['softmax']))}"
        for method, runs in results.items() if method != "softmax"])


def plot(results: dict[str, list[dict]], path: Path, train_sentences: int) -> None:
    fig, axes = pyplot().subplots(2, 3, figsize=(19, 8), layout="constrained")
    lowest_best = min(best(r)["accuracy"] for runs in results.values() for r in runs)
    panels = [  # (row, column, title, x label, records, x key, y key, AS-Softmax runs only)
        (0, 0, "validation accuracy (%)", "update", "valid", "update", "accuracy", False),
        (0, 1, "validation accuracy (%)", "wall-clock seconds (validations included)", "valid", "wall",
         "accuracy", False),
        (0, 2, "validation softmax cross-entropy (base 2)", "update", "valid", "update", "nll", False),
        (1, 0, "masked-sample ratio (train, per update)", "update", "train", "update", "masked_ratio", True),
        (1, 1, "accumulation steps per update", "update", "train", "update", "accum_steps", True),
        (1, 2, "validation accuracy (%)", f"epochs (training sentences seen / {train_sentences:,})", "valid", "epochs",
         "accuracy", False),
    ]
    for row, column, title, xlabel, records, x, y, as_only in panels:
        ax = axes[row, column]
        for index, (method, runs) in enumerate(results.items()):
            if as_only and not method.startswith("as_softmax"):
                continue
            for i, r in enumerate(runs):
                points = r[records]
                ax.plot([p[x] for p in points], [p[y] for p in points], color=f"C{index}",
                        alpha=0.4 if records == "train" and y == "masked_ratio" else 0.7,
                        lw=0.6 if y == "masked_ratio" else 1.2, label=method if i == 0 else None)
        ax.set(title=title, xlabel=xlabel)
        ax.grid(alpha=0.3)
        if y == "accuracy":  # the first validations, far below, would squeeze the differences that matter
            ax.set_ylim(bottom=lowest_best - 10)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside right upper")
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for data, runs, table and plots (default: "
                        "experiments/clinc150/scratch, or experiments/clinc150/NAME for --hf-model-dir .../NAME)")
    parser.add_argument("--clinc-json", type=Path, default=DEFAULT_JSON, help="CLINC150 data_full.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=CORE,
                        help=f"default: {' '.join(CORE)}; {FITTED} needs --hf-model-dir and as_softmax+as_speed; "
                        + "; ".join(f"{m}'s {flag} is chosen on seed {SELECTION_SEED}'s validation from "
                                    f"{', '.join(values)}" for m, (flag, values) in CHOICES.items()))
    parser.add_argument("--full", action="store_true", help="larger encoder, 20 epochs (hours on a CPU)")
    parser.add_argument("--hf-model-dir", type=Path, help="fine-tune this pretrained Hugging Face encoder "
                        "(a save_pretrained folder) instead of training text_encoder from scratch")
    parser.add_argument("--epochs", type=int, help="train this many epochs (default: 6, --full: 20, "
                        "--hf-model-dir: 3)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default: 0.001, --hf-model-dir: 5e-5)")
    parser.add_argument("--batch-size", type=int, help="sentences per micro-batch (default: 64, --hf-model-dir: 32)")
    parser.add_argument("--validate-every", type=int, help="validate every N updates, and at each epoch end "
                        "(default: 50, --hf-model-dir: 100)")
    parser.add_argument("--fresh", action="store_true", help="re-run runs that already have results")
    args = parser.parse_args(argv)
    if "softmax" not in args.methods:
        parser.error("the table is relative to softmax: keep it in --methods")
    if FITTED in args.methods and not (args.hf_model_dir and "as_softmax+as_speed" in args.methods):
        parser.error(f"{FITTED} sizes the fine-tuning decay to AS-Speed's updates: it needs --hf-model-dir "
                     "and as_softmax+as_speed in --methods")
    if args.hf_model_dir and args.full:
        parser.error("--full is the larger from-scratch encoder; --hf-model-dir fine-tunes a pretrained one")
    if args.hf_model_dir and (message := hf_checkpoint.problem(args.hf_model_dir, "--hf-model-dir")):
        parser.error(f"{message}; scripts/extract_minilm.py writes MiniLM's")
    for option in ("epochs", "batch_size", "lr", "validate_every"):  # the setting's value where none was given
        if getattr(args, option) is None:
            setattr(args, option, setting(args)[option])
    args.out = args.out or Path(__file__).parent / (args.hf_model_dir.resolve().name if args.hf_model_dir else "scratch")
    results, tried = run_methods(args, prepare(args))
    text = table(results) + (f"\n\n{selection(tried)}" if tried else "")
    print(text)
    command = "python experiments/clinc150/clinc150.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "results.md").write_text(f"`{command.strip()}`\n\n{text}\n", encoding="utf-8")
    summary = [{"method": r["method"], "seed": r["seed"], **{k: v for k, v in r.items() if k.startswith("test_")},
                "best_valid": best(r)} for runs in results.values() for r in runs]
    (args.out / "runs.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    plot(results, args.out / "curves.png", args.train_sentences)
    print(f"wrote {args.out / 'results.md'} and {args.out / 'curves.png'}")


if __name__ == "__main__":
    main()
