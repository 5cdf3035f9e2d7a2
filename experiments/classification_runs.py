"""What the classification experiments share: one run through the real ``fairseq-train`` / ``fairseq-validate``
(its record kept in its folder), the methods' runs over seeds with the open hyper-parameters chosen on seed 1, and
the tables and plot made from the records.

An experiment (``clinc150.py``: intents with an out-of-scope class; ``conll2003.py``: named entities, a tag per
word) describes itself as a ``Benchmark``: its methods, the validation score that picks a run's checkpoint, the test
scores it records and the task's flags. Every run's record is its ``result.json`` (the test scores and what the
tables and plots read of its training log), committed so that seeds and methods can be added later without
re-running the others.

Fine-tuning (``--hf-model-dir``) follows the BERT regime: AdamW, 10 % linear warm-up then linear decay to 0 at the
last update. Every method trains the same epochs (the same samples) and validates every ``--validate-every``
updates, saving there too; the checkpoint with the best validation score is tested. A run's training time is the
sum of fairseq's ``train_wall`` over its epochs (the updates alone: validations and checkpoints excluded); runs go
one at a time, and the load average before each is recorded to show the machine was otherwise idle. Times are
compared only between runs that one command made (``batch`` in their records): a machine's speed changes from one
sitting to the next with the work beside it on its host, so runs added later have no time ratio to earlier ones.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from measure import (BIN, ROOT, add_run_selection, command_line, json_records, machine, mean_sd, paired_difference,
                     pyplot, run)
from sparse_softmax.userinput import UserInputError

# AS-Speed makes fewer updates than the decay, counted in updates, was sized for, so its learning rate is still
# high when the epochs end; this variant sizes the decay to the updates the same seed's AS-Speed run made
# (fine-tuning only: from scratch the rate is constant), to tell the two effects on the scores apart
AS_SPEED = "as_softmax+as_speed"
FITTED = "as_softmax+as_speed+fitted_decay"
SELECTION_SEED = 1
#: how the tables name the scores fairseq logs
LABELS = {"accuracy": "accuracy", "macro_f1": "macro-F1", "in_scope_accuracy": "in-scope accuracy",
          "out_of_scope_recall": "oos recall", "entity_f1": "entity F1"}


@dataclass(frozen=True)
class Benchmark:
    """A classification experiment: ``methods`` (name → criterion flags, in its table's order; ``FITTED`` takes
    ``AS_SPEED``'s), ``choices`` (method → the flag the papers leave open and the values tried on seed 1's
    validation), ``metric`` (the validation score that picks the checkpoint, one of ``test_scores``),
    ``test_scores`` (what ``fairseq-validate`` logs on the test split and the record keeps) and ``task_flags``."""

    methods: dict[str, list[str]]
    choices: dict[str, tuple[str, list[str]]]
    metric: str
    test_scores: tuple[str, ...]
    task_flags: list[str]

    def method_flags(self, method: str, value: str | None, warmup: float | None) -> list[str]:
        """The method's criterion flags with its ``choices`` value, plus AS-Softmax's warm-up where the setting has
        one (it is a share of --max-update, which only the fine-tuning schedule sets)."""
        return (self.methods[method] + ([self.choices[method][0], value] if value else [])
                + (["--as-warmup-ratio", warmup] if warmup and method.startswith("as_softmax") else []))

    def run_name(self, method: str, value: str | None) -> str:
        """The method's table row: its name, and its ``choices`` flag and value."""
        return f"{method} {self.choices[method][0]} {value}" if value else method


def add_arguments(parser: argparse.ArgumentParser, bench: Benchmark, default_methods: list[str],
                  defaults: dict[str, str]) -> None:
    """The options every classification harness takes; ``defaults`` says, per option of the setting
    (``check_arguments`` fills them in), what its default is."""
    add_run_selection(parser, list(bench.methods), default_methods,
                      (f"; {FITTED} needs --hf-model-dir and {AS_SPEED}" if FITTED in bench.methods else "")
                      + "".join(f"; {m}'s {flag} is chosen on seed {SELECTION_SEED}'s validation from "
                                f"{', '.join(values)}" for m, (flag, values) in bench.choices.items()))
    parser.add_argument("--epochs", type=int, help=f"train this many epochs (default: {defaults['epochs']})")
    parser.add_argument("--lr", type=float, help=f"peak learning rate (default: {defaults['lr']})")
    parser.add_argument("--batch-size", type=int,
                        help=f"sentences per micro-batch (default: {defaults['batch_size']})")
    parser.add_argument("--validate-every", type=int, help="validate every N updates, and at each epoch end "
                        f"(default: {defaults['validate_every']})")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, setting: dict) -> None:
    """Refuse what the table cannot be made of, and fill in the setting's value where no option was given."""
    if "softmax" not in args.methods:
        parser.error("the table is relative to softmax: keep it in --methods")
    if FITTED in args.methods and not (args.hf_model_dir and AS_SPEED in args.methods):
        parser.error(f"{FITTED} sizes the fine-tuning decay to AS-Speed's updates: it needs --hf-model-dir "
                     f"and {AS_SPEED} in --methods")
    for option in ("epochs", "batch_size", "lr", "validate_every"):
        if getattr(args, option) is None:
            setattr(args, option, setting[option])
    args.as_warmup_ratio = setting.get("as_warmup_ratio")


def prepared(args, prep: list, inputs: list[Path], hint: str) -> Path:
    """The binarised data in OUT/work/data, made there once by ``data-prep/`` + ``prep`` (the script and its
    options) from ``inputs`` (missing ones: an error with ``hint``), with ``args.train_sentences`` set from its
    summary."""
    data = args.out / "work" / "data"
    if not (data / "data-bin" / "label" / "dict.txt").exists():
        if missing := [str(path) for path in inputs if not path.exists()]:
            print(f"{Path(sys.argv[0]).name}: error: {', '.join(missing)} not found: {hint}", file=sys.stderr)
            sys.exit(2)
        run([sys.executable, ROOT / "data-prep" / prep[0], data, *prep[1:], "--overwrite"])
    args.train_sentences = json.loads((data / "prep_summary.json").read_text())["splits"]["train"]["written"]
    return data / "data-bin"


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
    decay = updates_made(args, AS_SPEED, seed) if method == FITTED else updates
    return ["--optimizer", "adam", "--adam-betas", "(0.9, 0.999)", "--weight-decay", "0.01",
            "--lr", args.lr, "--lr-scheduler", "polynomial_decay",
            "--warmup-updates", max(1, updates // 10), "--total-num-update", decay, "--max-update", updates]


def updates_made(args, method: str, seed: int) -> int:
    return json.loads((run_folder(args, method, seed) / "result.json").read_text(encoding="utf-8"))["updates"]


def validations(args) -> list:
    """Validate every N updates and save there too: fairseq keeps checkpoint_best.pt only when it saves, so
    validating alone would test the best *epoch-end* checkpoint, not the best validation. Only the newest
    mid-epoch checkpoint is kept, without optimizer state (the runs are never resumed)."""
    return ["--validate-interval-updates", args.validate_every, "--save-interval-updates", args.validate_every,
            "--keep-interval-updates", "1", "--no-epoch-checkpoints", "--no-last-checkpoints",
            "--no-save-optimizer-state"]


def train_and_test(bench: Benchmark, args, model: list[str], data: Path, method: str, seed: int, batch: str,
                   value: str | None = None) -> dict:
    """One run of ``model`` (its ``--arch`` flags) on ``data``: its record, ``result.json`` (its test scores, what
    the tables need of its training log, ``log_summary``, and ``batch``, the command that made it), made once; the
    weights are deleted."""
    folder = run_folder(args, method, seed, value)
    result_file, train_log = folder / "result.json", folder / "train.log"
    if not result_file.exists() or args.fresh:
        folder.mkdir(parents=True, exist_ok=True)
        load = os.getloadavg()[0]
        run([BIN / "fairseq-train", data, "--user-dir", ROOT / "user_dir", "--task", "text_classification", *model,
             *(["--hf-model-dir", args.hf_model_dir] if args.hf_model_dir else []),
             *bench.method_flags(method, value, args.as_warmup_ratio), "--seed", seed, "--cpu",
             *schedule(args, method, seed), "--batch-size", args.batch_size, "--batch-size-valid", "512",
             "--max-epoch", args.epochs, *validations(args), *bench.task_flags,
             "--best-checkpoint-metric", bench.metric, "--maximize-best-checkpoint-metric",
             "--save-dir", folder / "checkpoints", "--log-format", "json", "--log-interval", "1",
             "--num-workers", "0"], train_log)
        test = json_records(run([BIN / "fairseq-validate", data, "--user-dir", ROOT / "user_dir", "--task",
                                 "text_classification", "--path", folder / "checkpoints" / "checkpoint_best.pt",
                                 "--valid-subset", "test", "--cpu", "--batch-size", "512", "--log-format", "json"]),
                            "test")[0]
        record = {f"test_{key}": float(test[key]) for key in bench.test_scores}
        summary = log_summary(train_log.read_text(encoding="utf-8"), bench.metric)
        record |= {**summary, "load_before": load, "batch": batch}
        result_file.write_text(json.dumps(record) + "\n", encoding="utf-8")
        for checkpoint in (folder / "checkpoints").glob("*.pt"):  # the numbers are kept; the weights are not
            checkpoint.unlink()
    result = json.loads(result_file.read_text(encoding="utf-8"))
    for point in result["valid"]:
        point["epochs"] = point.pop("sentences") / args.train_sentences
    return {"method": bench.run_name(method, value), "seed": seed, **result}


def log_summary(log: str, metric: str) -> dict:
    """What a run's record keeps of its training log: the valid curve (``metric``, nll, the seconds and sentences
    of training at each validation), the masked share and accumulation steps of every update, the seconds since
    the start, the seconds of training alone (fairseq's ``train_wall`` summed over the epochs), the updates made
    and the sentences seen."""
    inner = json_records(log, "train_inner")
    seen, sentences = 0.0, {}
    for r in inner:
        seen += float(r["bsz"])
        sentences[int(r["num_updates"])] = seen
    wall = {int(r["num_updates"]): float(r["wall"]) for r in inner}
    valid = [{"update": int(r["num_updates"]), metric: float(r[metric]), "nll": float(r["nll_loss"]),
              "wall": wall[int(r["num_updates"])], "sentences": sentences[int(r["num_updates"])]}
             for r in json_records(log, "valid")]
    train = [{"update": int(r["num_updates"]), "masked_ratio": float(r.get("masked_ratio", 0.0)),
              "accum_steps": float(r.get("accum_steps", 1))} for r in inner]
    epochs = json_records(log, "train")
    return {"valid": valid, "train": train, "wall": float(inner[-1]["wall"]), "updates": int(inner[-1]["num_updates"]),
            "train_seconds": sum(float(r["train_wall"]) for r in epochs), "sentences_seen": seen}


def run_methods(bench: Benchmark, args, model: list[str],
                data: Path) -> tuple[dict[str, list[dict]], dict[str, dict[str, dict]]]:
    """Every run of the table: first each ``choices`` value on seed 1, then the seeds in turn, each seed's
    methods in the benchmark's order (interleaved, so that machine noise hits every method alike; AS-Speed before
    FITTED), those with ``choices`` at their chosen value. Returns the runs per table row, and per method with
    ``choices`` its seed-1 run per value. With ``args.table_only``, only the runs already finished (a method with
    ``choices`` takes the best of its finished seed-1 runs, and is left out without one). The runs this command
    makes share their ``batch``: this machine and the time the command started."""
    def wanted(method: str, seed: int, value: str | None = None) -> bool:
        return not args.table_only or (run_folder(args, method, seed, value) / "result.json").exists()

    methods = [m for m in bench.methods if m in args.methods]
    candidates = [(m, value) for m in methods if m in bench.choices for value in bench.choices[m][1]
                  if wanted(m, SELECTION_SEED, value)]
    tried: dict[str, dict[str, dict]] = {m: {} for m, _ in candidates}
    batch = f"{machine()} {datetime.now():%Y-%m-%dT%H:%M:%S}"
    methods = [m for m in methods if m not in bench.choices or m in tried]
    with tqdm(total=len(candidates) + len(args.seeds) * len(methods), desc="training runs", unit="run") as bar:
        for method, value in candidates:
            tried[method][value] = train_and_test(bench, args, model, data, method, SELECTION_SEED, batch, value)
            bar.update()
        chosen = choose(tried, bench.metric)
        results: dict[str, list[dict]] = {bench.run_name(m, chosen.get(m)): [] for m in methods}
        for seed in args.seeds:
            for method in methods:  # a chosen value's seed-1 run is read back from its record
                if wanted(method, seed, chosen.get(method)):
                    results[bench.run_name(method, chosen.get(method))].append(
                        train_and_test(bench, args, model, data, method, seed, batch, chosen.get(method)))
                bar.update()
    if not results.get("softmax"):
        raise UserInputError(f"--table-only: no finished softmax run of seeds {' '.join(map(str, args.seeds))} in "
                             f"{args.out / 'work'}; the table is relative to softmax")
    return {row: runs for row, runs in results.items() if runs}, tried


def choose(tried: dict[str, dict[str, dict]], metric: str) -> dict[str, str]:
    """Per method, the value whose seed-1 run reached the best validation ``metric`` (the first listed on a tie)."""
    return {method: max(runs, key=lambda value: best(runs[value], metric)[metric]) for method, runs in tried.items()}


def best(result: dict, metric: str) -> dict:
    """The first validation with the run's best ``metric``."""
    top = max(v[metric] for v in result["valid"])
    return next(v for v in result["valid"] if v[metric] == top)


def first_reaching(result: dict, metric: str, score: float) -> dict | None:
    """The first validation with ``metric`` at or above ``score``."""
    return next((v for v in result["valid"] if v[metric] >= score), None)


def table(bench: Benchmark, results: dict[str, list[dict]]) -> str:
    """Test scores (mean ± sd over seeds), the best validation score, the wall-clock seconds to it (validations
    included) with softmax's over them paired by seed and command, and the same to the best validation score of the
    worst softmax seed (a score every softmax run reached); then the paired differences and, where every run has
    them, the training times."""
    metric, label = bench.metric, LABELS[bench.metric]
    softmax = results["softmax"]
    target = min(best(r, metric)[metric] for r in softmax)

    def mean(values) -> float:
        return statistics.mean(list(values))

    def to_best(run: dict) -> float:
        return best(run, metric)["wall"]

    def to_target(run: dict) -> float:
        return first_reaching(run, metric, target)["wall"]

    scores = " | ".join(f"test {LABELS[key]}" for key in bench.test_scores)
    rows = [f"| method | {scores} | best valid {label} | s to best valid (× softmax) | epochs to best "
            f"| s to valid {target:.2f} (× softmax) | epochs to {target:.2f} | s per run | updates | seeds |",
            "|---|" + "---|" * (len(bench.test_scores) + 8)]
    for method, runs in results.items():
        reached = [first_reaching(r, metric, target) for r in runs]
        if None in reached:
            seconds_to_target = epochs_to_target = f"not reached in {reached.count(None)}/{len(runs)} runs"
        else:
            seconds_to_target = relative(runs, softmax, to_target)
            epochs_to_target = f"{mean(v['epochs'] for v in reached):.2f}"
        tested = " | ".join(test_score(runs, f"test_{key}") for key in bench.test_scores)
        rows.append(f"| {method} | {tested} | {mean_sd([best(r, metric)[metric] for r in runs])} "
                    f"| {relative(runs, softmax, to_best)} | {mean(best(r, metric)['epochs'] for r in runs):.2f} "
                    f"| {seconds_to_target} | {epochs_to_target} | {mean(r['wall'] for r in runs):.0f} "
                    f"| {mean(r['train'][-1]['update'] for r in runs):.0f} "
                    f"| {', '.join(str(r['seed']) for r in runs)} |")
    timed = all("train_seconds" in r for runs in results.values() for r in runs)
    return "\n".join(rows) + "\n\n" + differences(bench, results) + ("\n\n" + training_times(results) if timed else "")


def paired_ratio(runs: list[dict], baseline: list[dict], seconds: Callable[[dict], float]) -> float | None:
    """The mean, over the seeds on which one command made a run of ``runs`` and one of ``baseline`` (their records'
    ``batch``), of a run's ``seconds`` over those of the baseline's run on that seed: a ratio of means over unequal
    seeds, or of runs made at other speeds, would compare the machines. Older records name only their ``machine``,
    and the oldest nothing: those pair by what they name. None without such a pair whose baseline took above 0
    seconds (fairseq's wall-clock is in whole seconds: 0 in a tiny run)."""
    def where(run: dict) -> tuple[int, str | None]:
        return run["seed"], run.get("batch", run.get("machine"))

    base = {where(r): seconds(r) for r in baseline}
    ratios = [seconds(r) / base[where(r)] for r in runs if base.get(where(r))]
    return statistics.mean(ratios) if ratios else None


def relative(runs: list[dict], softmax: list[dict], seconds: Callable[[dict], float]) -> str:
    """The runs' mean ``seconds``, and softmax's over theirs paired by seed and command (``paired_ratio``; above 1:
    sooner than softmax)."""
    ratio = paired_ratio(softmax, runs, seconds)
    return f"{statistics.mean(seconds(r) for r in runs):.0f} ({'–' if ratio is None else f'{ratio:.2f}×'})"


def test_score(runs: list[dict], key: str) -> str:
    """Mean ± sd of a test score over the runs; records made before a score was kept lack it, and say so."""
    missing = sum(key not in r for r in runs)
    return f"not recorded in {missing}/{len(runs)} runs" if missing else mean_sd([r[key] for r in runs])


def selection(bench: Benchmark, tried: dict[str, dict[str, dict]]) -> str:
    """What each ``choices`` value reached on seed 1's validation, and the value chosen."""
    chosen, metric = choose(tried, bench.metric), bench.metric
    return "\n".join([f"Chosen on seed {SELECTION_SEED}'s best validation {LABELS[metric]}:", ""] + [
        f"- {method} {bench.choices[method][0]}: "
        + ", ".join(f"{value}: {best(run, metric)[metric]:.2f}" for value, run in runs.items())
        + f" → {chosen[method]}"
        for method, runs in tried.items()])


def differences(bench: Benchmark, results: dict[str, list[dict]]) -> str:
    """Each method's test score (the checkpoint-picking one) minus softmax's on the same seed."""
    key = f"test_{bench.metric}"

    def scores(runs: list[dict]) -> dict[int, float]:
        return {r["seed"]: r[key] for r in runs}

    return "\n".join([f"Test {LABELS[bench.metric]} minus softmax's on the same seed (mean ± sd over seeds):", ""] + [
        f"- {method}: {paired_difference(scores(runs), scores(results['softmax']))}"
        for method, runs in results.items() if method != "softmax"])


def time_ratio(runs: list[dict], baseline: list[dict]) -> str:
    """``runs``' seconds of training as a multiple of ``baseline``'s, paired by seed and command
    (``paired_ratio``); "–" without such a pair."""
    ratio = paired_ratio(runs, baseline, lambda run: run["train_seconds"])
    return "–" if ratio is None else f"{ratio:.2f}"


def training_times(results: dict[str, list[dict]]) -> str:
    """Each method's seconds of training (validations and checkpoints excluded), relative to softmax's and, where
    it ran, as_softmax's (the ratio AS-Speed is about), with the updates made and the sentences seen."""
    base = [m for m in ("softmax", "as_softmax") if m in results]
    rows = ["| method | s of training | " + " | ".join(f"× {m}" for m in base) + " | updates | sentences seen |",
            "|---|---|" + "---|" * len(base) + "---|---|"]
    for method, runs in results.items():
        rows.append(f"| {method} | {mean_sd([r['train_seconds'] for r in runs], digits=0)} | "
                    + " | ".join(time_ratio(runs, results[m]) for m in base)
                    + f" | {statistics.mean(r['updates'] for r in runs):.0f} "
                    f"| {statistics.mean(r['sentences_seen'] for r in runs):,.0f} |")
    load = max(r["load_before"] for runs in results.values() for r in runs)
    return "\n".join(["Training time (fairseq's train_wall summed over the epochs: the updates alone, whole seconds "
                      "an epoch; mean ± sd over seeds; each ratio is the mean, over the seeds on which one command "
                      "ran both methods, of the ratio on a seed; the runs went one at a time, the 1-minute load "
                      f"average before each at most {load:.2f} on {os.cpu_count()} cores):", "", *rows])


def plot(bench: Benchmark, results: dict[str, list[dict]], path: Path, train_sentences: int) -> None:
    metric, label = bench.metric, LABELS[bench.metric]
    fig, axes = pyplot().subplots(2, 3, figsize=(19, 8), layout="constrained")
    lowest_best = min(best(r, metric)[metric] for runs in results.values() for r in runs)
    panels = [  # (row, column, title, x label, records, x key, y key, AS-Softmax runs only)
        (0, 0, f"validation {label} (%)", "update", "valid", "update", metric, False),
        (0, 1, f"validation {label} (%)", "wall-clock seconds (validations included)", "valid", "wall", metric,
         False),
        (0, 2, "validation softmax cross-entropy (base 2)", "update", "valid", "update", "nll", False),
        (1, 0, "masked-sample ratio (train, per update)", "update", "train", "update", "masked_ratio", True),
        (1, 1, "accumulation steps per update", "update", "train", "update", "accum_steps", True),
        (1, 2, f"validation {label} (%)", f"epochs (training sentences seen / {train_sentences:,})", "valid",
         "epochs", metric, False),
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
        if y == metric:  # the first validations, far below, would squeeze the differences that matter
            ax.set_ylim(bottom=lowest_best - 10)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside right upper")
    fig.savefig(path, dpi=100)


def write_results(bench: Benchmark, args, script: str | Path, argv: list[str] | None, results: dict[str, list[dict]],
                  tried: dict[str, dict[str, dict]]) -> None:
    """OUT/results.md (the command and the tables), OUT/runs.json (per-run numbers) and OUT/curves.png."""
    text = table(bench, results) + (f"\n\n{selection(bench, tried)}" if tried else "")
    print(text)
    (args.out / "results.md").write_text(f"`{command_line(script, argv)}`\n\n{text}\n", encoding="utf-8")
    summary = [{"method": r["method"], "seed": r["seed"], **{k: v for k, v in r.items() if k.startswith("test_")},
                "best_valid": best(r, bench.metric)} for runs in results.values() for r in runs]
    (args.out / "runs.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    plot(bench, results, args.out / "curves.png", args.train_sentences)
    print(f"wrote {args.out / 'results.md'} and {args.out / 'curves.png'}")
