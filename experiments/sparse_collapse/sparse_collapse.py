#!/usr/bin/env python
"""Why sparse_softmax collapses when a question generator is trained from scratch, measured on the model itself.

Sparse-softmax's loss ``lse(topk(z)) - z_t`` is ``log k`` for flat logits, whatever the model knows, and falls
below it only when the target scores above the mean of the k largest logits (``sparse_softmax.losses.
scale_profile``). This script trains the from-scratch question generator of ``qg_scratch.py`` (same data, model,
optimiser and batches; its ``--scale``) with ``cross_entropy``, ``sparse_softmax`` and ``sparse_softmax`` after
softmax warm-ups of several lengths, keeps the checkpoint of each of its ten validations, and probes each one on
the valid split (teacher forcing): the valid softmax cross-entropy, the Sparse-softmax loss, how often the target
is the argmax or in the top k, and the *flat slope*, ``mean(topk(z)) - z_t`` averaged over the target tokens: the
derivative of the Sparse-softmax loss in a common scale of the logits as that scale goes to 0. Where the slope is
>= 0 the flat logits are the loss's best scale, so a model trained on with Sparse-softmax from that checkpoint
gains by flattening its logits; where it is negative, by sharpening them. With it, the loss over a grid of
scales (the best scale on the grid), for the cross-entropy checkpoints a warm-up would hand over.

    python experiments/sparse_collapse/sparse_collapse.py                    # 5 runs at qg_scratch's cpu scale, ~30 min on 2 cores
    python experiments/sparse_collapse/sparse_collapse.py --warmups 0.3 0.6 0.9

OUT (default ``experiments/sparse_collapse/k10``) gets ``results.md`` (the probes, with the command),
``probes.json`` and ``probes.png``; each run's ``probe.json`` (committed) and ``train.log`` stay in OUT/work, and a run
with a ``probe.json`` is read, not run again (``--fresh``: run it again).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "qg_scratch")]  # the experiment it probes
import qg_scratch  # noqa: E402  (first: it puts benchmarks/ and experiments/ on the path)
import generation_runs  # noqa: E402  (experiments/)
from measure import command_line, pyplot  # noqa: E402  (benchmarks/)
from sparse_softmax.diagnostics import scale_profile
from sparse_softmax.schedules import warmup_end

#: Logit scales the loss is probed at (1 is the model as it is).
SCALES = torch.linspace(0.0, 3.0, 61, dtype=torch.float64)


def methods(k: int, warmups: list[float]) -> dict[str, tuple[list, float]]:
    """Each run's name: its loss flags and the share of the updates it trains softmax first."""
    sparse = ["--criterion", "sparse_softmax", "--sparse-topk", k]
    return {"cross_entropy": (["--criterion", "cross_entropy"], 0.0), "sparse_softmax": (sparse, 0.0),
            **{f"sparse_softmax after {w:.0%} softmax": ([*sparse, "--sparse-warmup-ratio", w], w) for w in warmups}}


def checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """The checkpoints of a run's validations (``checkpoint_EPOCH_UPDATES.pt``) by update."""
    found = ((re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", p.name), p) for p in folder.glob("checkpoint_*_*.pt"))
    return sorted((int(match.group(1)), path) for match, path in found if match)


@torch.no_grad()
def probe(checkpoint: Path, data: Path, k: int, max_tokens: int) -> dict:
    """Teacher-forced valid logits of ``checkpoint``, summarised as in the module docstring (losses in bits)."""
    from fairseq import checkpoint_utils

    import user_dir  # noqa: F401  (registers the task the checkpoint names)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={
        "data": str(data)})
    model = models[0].eval()
    task.load_dataset("valid")
    batches = task.get_batch_iterator(task.dataset("valid"), max_tokens=max_tokens).next_epoch_itr(shuffle=False)
    pad = task.target_dictionary.pad()
    rows, nll, slope, top1, topk = 0, 0.0, 0.0, 0, 0
    loss = torch.zeros_like(SCALES)
    for sample in batches:
        logits = model(**sample["net_input"])[0]
        logits, target = logits.reshape(-1, logits.size(-1)), sample["target"].reshape(-1)
        profile = scale_profile(logits, target, k, SCALES, ignore_index=pad)
        rows += len(profile.rank)
        nll += float(torch.nn.functional.cross_entropy(logits.double(), target, ignore_index=pad, reduction="sum"))
        slope += float(profile.flat_slope.sum())
        top1 += int((profile.rank == 0).sum())
        topk += int((profile.rank < k).sum())
        loss += profile.loss.sum(dim=0)
    loss = loss / rows / math.log(2)
    best = int(loss.argmin())
    at_one = int(torch.isclose(SCALES, torch.tensor(1.0, dtype=SCALES.dtype)).nonzero())
    return {"rows": rows, "nll": nll / rows / math.log(2), "sparse_loss": float(loss[at_one]),
            "flat_slope": slope / rows, "top1": top1 / rows, "topk": topk / rows,
            "best_scale": float(SCALES[best]), "best_loss": float(loss[best]), "loss_by_scale": loss.tolist()}


def run_and_probe(args, qg_args, data: Path, name: str, flags: list, warmup: float) -> dict:
    """One run trained with every validation's checkpoint kept, each probed; the probes are kept in ``probe.json``
    and the weights deleted."""
    folder = args.out / "work" / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    record = folder / "probe.json"
    updates = qg_args.updates or qg_scratch.SCALES[qg_args.scale]["updates"]
    if args.fresh or not record.exists():
        generation_runs.delete_weights(folder)
        (folder / "train.log").unlink(missing_ok=True)  # from the start: the probes need every checkpoint
        folder.mkdir(parents=True, exist_ok=True)
        generation_runs.fairseq_train(data, folder, args.seed, updates, qg_scratch.train_flags(qg_args, flags),
                                      log_interval=10, keep_all=True)
        probes = [{"update": update, **probe(path, data, args.k, int(qg_args.max_tokens))}
                  for update, path in checkpoints(folder / "checkpoints")]
        record.write_text(json.dumps({"flags": [str(f) for f in flags], "probes": probes}, indent=1),
                          encoding="utf-8")
        generation_runs.delete_weights(folder)
    return {"name": name, "probes": json.loads(record.read_text(encoding="utf-8"))["probes"],
            "switch": warmup_end(warmup, updates) if warmup else None}  # how many updates train softmax


def table(runs: list[dict], k: int) -> str:
    rows = ["| run | update | valid nll (bits) | Sparse-softmax loss (bits) | target is the argmax | target in the top "
            f"{k} | flat slope (nats) | best scale on the grid | its loss (bits) |", "|---|" + "---:|" * 8]
    for run in runs:
        for p in run["probes"]:
            rows.append(f"| {run['name']} | {p['update']} | {p['nll']:.2f} | {p['sparse_loss']:.2f} | "
                        f"{p['top1']:.1%} | {p['topk']:.1%} | {p['flat_slope']:+.2f} | {p['best_scale']:.2f} | "
                        f"{p['best_loss']:.2f} |")
    return "\n".join(rows)


def plot(runs: list[dict], k: int, path: Path) -> None:
    """The flat slope, the valid Sparse-softmax loss and how often the target is the argmax, for every run by update,
    and cross-entropy's checkpoints' Sparse-softmax loss by logit scale."""
    fig, (slopes, losses, argmax, scales) = pyplot().subplots(1, 4, figsize=(22, 4.5))
    for index, run in enumerate(runs):
        updates = [p["update"] for p in run["probes"]]
        for axis, key in ((slopes, "flat_slope"), (losses, "sparse_loss"), (argmax, "top1")):
            axis.plot(updates, [p[key] for p in run["probes"]], "o-", color=f"C{index}", label=run["name"])
            if run["switch"]:
                axis.axvline(run["switch"], color=f"C{index}", linestyle=":", alpha=0.6)
    slopes.axhline(0, color="black", linewidth=0.8)
    slopes.set(title="flat slope: mean(top-k logits) − target logit\n(> 0: flat logits are the sparse loss's best)",
               xlabel="update (dotted: end of the softmax warm-up)", ylabel="nats")
    losses.axhline(math.log2(k), color="black", linewidth=0.8, linestyle="--", label=f"log2 {k}: flat logits")
    losses.set(title=f"valid Sparse-softmax loss (k = {k})", xlabel="update", ylabel="bits")
    argmax.set(title="valid: the target is the argmax (the ranking)", xlabel="update", ylabel="share of tokens")
    base = next(run for run in runs if run["name"] == "cross_entropy")
    colours = pyplot().cm.viridis([i / max(1, len(base["probes"]) - 1) for i in range(len(base["probes"]))])
    for colour, p in zip(colours, base["probes"]):
        scales.plot(SCALES.tolist(), p["loss_by_scale"], color=colour, label=f"update {p['update']}")
    scales.axhline(math.log2(k), color="black", linewidth=0.8, linestyle="--")
    scales.set_ylim(0, 3 * math.log2(k))  # the early checkpoints' losses climb far above the rest
    scales.axvline(1, color="grey", linewidth=0.8)
    scales.set(title="cross_entropy's checkpoints: Sparse-softmax loss\nwith the logits multiplied by s",
               xlabel="s (1: the model as it is)", ylabel="bits")
    for axis in (slopes, losses, argmax, scales):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for the data, the runs, the table and the plot (default: "
                        "experiments/sparse_collapse/kK)")
    parser.add_argument("--du2017-dir", type=Path, default=qg_scratch.DEFAULT_DU_DIR,
                        help="Du et al.'s src-/tgt-{dev,test}.txt (default: %(default)s)")
    parser.add_argument("--scale", choices=list(qg_scratch.SCALES), default="cpu",
                        help="qg_scratch.py's scale: model, updates and schedule")
    parser.add_argument("--updates", type=int, help="train this many updates instead of the scale's")
    parser.add_argument("--k", type=int, default=10, help="sparse_softmax's --sparse-topk (default: %(default)s)")
    parser.add_argument("--warmups", type=float, nargs="*", default=[0.3, 0.6],
                        help="softmax warm-ups to run sparse_softmax after, as shares of the updates")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="re-run runs that already have probes")
    args = parser.parse_args(argv)
    if args.k < 1:
        parser.error(f"--k: expected a count >= 1, got {args.k}")
    args.out = args.out or Path(__file__).parent / f"k{args.k}"
    if any(not 0 < w < 1 for w in args.warmups):
        parser.error(f"--warmups: expected shares between 0 and 1, got {args.warmups}")
    qg_args = qg_scratch.build_parser().parse_args(
        ["--du2017-dir", str(args.du2017_dir), "--out", str(args.out), "--scale", args.scale,
         *(["--updates", str(args.updates)] if args.updates else [])])
    data = qg_scratch.checked_data(parser, qg_args)
    jobs = methods(args.k, args.warmups)
    runs = [run_and_probe(args, qg_args, data, name, flags, warmup)
            for name, (flags, warmup) in tqdm(jobs.items(), desc="runs", unit="run")]
    command = command_line(__file__, argv)
    (args.out / "probes.json").write_text(json.dumps(runs, indent=1), encoding="utf-8")
    (args.out / "results.md").write_text(
        f"`{command}`\n\nThe valid split ({runs[0]['probes'][0]['rows']:,} target tokens) probed at every "
        f"validation of each run (seed {args.seed}, qg_scratch.py's {args.scale} scale); flat slope > 0: the "
        f"Sparse-softmax loss (k = {args.k}) is lowest for flat logits, at log2 {args.k} = {math.log2(args.k):.2f} "
        f"bits. Best scale: of {len(SCALES)} from 0 to {float(SCALES[-1]):g}.\n\n{table(runs, args.k)}\n\n"
        "![probes](probes.png)\n", encoding="utf-8")
    plot(runs, args.k, args.out / "probes.png")


if __name__ == "__main__":
    main()
