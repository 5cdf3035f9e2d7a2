#!/usr/bin/env python
"""Sentences/s of masked beam search (--decoding-topk, --source-vocab-mask) vs plain beam search, and of
decoding with the decoder's key/value cache vs recomputing the prefix at every step (--recompute).

One checkpoint, one test set, one process: every configuration decodes the same batches through
the task's own ``build_generator`` / ``inference_step`` (what fairseq-generate calls), without
process start-up or printing. Configurations are interleaved within each repeat so machine noise
hits them alike (in a shuffled order each time); the time is the minimum over ``--repeats``, and
each ratio is against plain beam search with the same beam size measured in the same run.

Masking changes the scores, and so what is generated and how many beam steps a batch takes: the
table also gives the output length (tokens in the best hypotheses), the number of decoder steps,
and the time per step relative to plain beam search (the cost of the masking itself).

``--recompute`` adds each configuration run without the cache (fairseq's generator then calls the decoder on
the whole prefix at every step, as for a decoder without incremental state): same hypotheses, and what the
cache (``--arch hf_unilm``'s per-layer keys and values, or fairseq's transformer's) is worth.

    bash scripts/run_demo.sh                 # makes demo/data-bin and demo/checkpoints
    python benchmarks/decoding_speed.py      # table + PNG in benchmarks/results/
    python benchmarks/decoding_speed.py --data-bin data-bin/giga --path ckpt.pt --batch-size 128
    python benchmarks/decoding_speed.py --data-bin data/qg-minilm/data-bin --path checkpoints/qg-minilm/checkpoint_best.pt \
        --recompute --out benchmarks/results/decoding_speed_unilm
"""
from __future__ import annotations

import argparse
import copy
import gc
import math
import random
import sys
import time
from pathlib import Path

import torch
from fairseq import checkpoint_utils, options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from measure import ROOT, command_line, pyplot


def configurations(topk: int) -> dict[str, dict]:
    return {
        "plain beam": {},
        f"top-{topk}": {"decoding_topk": topk},
        "source vocab": {"source_vocab_mask": True},
        f"top-{topk} + source vocab": {"decoding_topk": topk, "source_vocab_mask": True},
    }


def load(args):
    """fairseq-generate's configuration, the model and the test batches, loaded once for all runs."""
    argv = [str(args.data_bin), "--user-dir", str(ROOT / "user_dir"), "--task", "sparse_seq2seq",
            "--path", str(args.path), "--gen-subset", args.subset, "--batch-size", str(args.batch_size)]
    argv += ["--cpu"] if args.device == "cpu" else []
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(), argv))
    task = tasks.setup_task(cfg.task)
    task.load_dataset(args.subset)
    models, _ = checkpoint_utils.load_model_ensemble([str(args.path)], task=task)
    for model in models:
        model.eval().to(args.device)
    dataset = task.dataset(args.subset)
    max_positions = utils.resolve_max_positions(task.max_positions(), *(m.max_positions() for m in models))
    itr = task.get_batch_iterator(dataset, max_sentences=args.batch_size, max_positions=max_positions,
                                  ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
    batches = [utils.move_to_cuda(b) if args.device == "cuda" else b for b in itr]
    n = sum(len(b["id"]) for b in batches)
    assert n == len(dataset), f"{n} of {len(dataset)} sentences batched"
    return cfg.task, models, batches, n


def decode(task, generator, models, batches) -> tuple[float, int]:
    """Seconds to decode every batch, and the number of tokens in the best hypotheses.
    The garbage collector is paused while timing (as ``timeit`` does), so that a collection
    triggered by one configuration's allocations is not charged to another."""
    gc.collect()
    gc.disable()
    try:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        hypos = [task.inference_step(generator, models, batch) for batch in batches]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        gc.enable()
    return seconds, sum(len(h[0]["tokens"]) for batch in hypos for h in batch)


def decoder_steps(task, generator, models, batches) -> int:
    """Decoder calls (beam steps) over all batches: masking changes the scores, and with them how
    many steps a batch stays in the beam before every sentence has its finished hypotheses."""
    calls = 0
    ensemble = generator.model
    installed = ensemble.__dict__.get("forward_decoder")  # masked search's observer, if any
    forward = ensemble.forward_decoder

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        return forward(*args, **kwargs)

    ensemble.forward_decoder = counted
    try:
        decode(task, generator, models, batches)
    finally:
        if installed is None:
            del ensemble.forward_decoder
        else:
            ensemble.forward_decoder = installed
    return calls


def measure(args) -> list[dict]:
    task_cfg, models, batches, n = load(args)
    runs = {}
    for beam in args.beams:
        maskings = configurations(args.topk)
        if args.plain_only:
            maskings = {"plain beam": maskings["plain beam"]}
        for name, masking in maskings.items():
            cfg = copy.deepcopy(task_cfg)
            for key, value in masking.items():
                setattr(cfg, key, value)
            task = tasks.setup_task(cfg)
            gen_args = argparse.Namespace(beam=beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
            runs[beam, name] = (task, task.build_generator(models, gen_args))
            if args.recompute:
                generator = task.build_generator(models, gen_args)
                generator.model.has_incremental = False  # the ensemble then calls the decoder on the whole prefix
                runs[beam, f"{name}, no cache"] = (task, generator)
    best = {key: float("inf") for key in runs}
    tokens = {}
    with torch.no_grad():
        for key, (task, generator) in runs.items():  # warm-up
            decode(task, generator, models, batches[:1])
        # a small test set is decoded several times per measurement, so that each lasts long
        # enough (--min-seconds) for the machine's noise to be small against it
        one_pass, _ = decode(*runs[args.beams[0], "plain beam"], models, batches)
        passes = max(1, math.ceil(args.min_seconds / one_pass))
        order, shuffle = list(runs), random.Random(0).shuffle
        for _ in range(args.repeats):
            shuffle(order)  # no configuration always runs first or last
            for key in order:
                task, generator = runs[key]
                seconds, count = decode(task, generator, models, batches * passes)
                best[key], tokens[key] = min(best[key], seconds / passes), count // passes
        steps = {key: decoder_steps(task, generator, models, batches) for key, (task, generator) in runs.items()}
    rows = []
    for (beam, name), seconds in best.items():
        plain = (beam, "plain beam")
        rows.append({"beam": beam, "decoding": name, "sentences": n, "seconds": seconds, "sent_per_s": n / seconds,
                     "ratio": best[plain] / seconds, "tokens": tokens[beam, name], "steps": steps[beam, name],
                     "step_time_ratio": (seconds / steps[beam, name]) / (best[plain] / steps[plain])})
    return rows


def table(rows: list[dict], command: str) -> str:
    lines = [f"`{command}`", "",
             "| beam | decoding | sentences/s | × plain beam | output tokens | decoder steps "
             "| time per step ÷ plain |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['beam']} | {r['decoding']} | {r['sent_per_s']:.1f} | {r['ratio']:.2f} | {r['tokens']} "
              f"| {r['steps']} | {r['step_time_ratio']:.2f} |" for r in rows]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    beams = sorted({r["beam"] for r in rows})
    names = list(dict.fromkeys(r["decoding"] for r in rows))
    fig, ax = pyplot().subplots(figsize=(7, 3.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [next(r["ratio"] for r in rows if r["beam"] == b and r["decoding"] == name) for b in beams]
        ax.bar([b_i + i * width for b_i in range(len(beams))], values, width, label=name)
    ax.axhline(0.95, color="grey", linestyle="--", linewidth=1, label="target 0.95")
    ax.set_xticks([b_i + width * (len(names) - 1) / 2 for b_i in range(len(beams))], [f"beam {b}" for b in beams])
    ax.set_ylabel("sentences/s ÷ plain beam")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-bin", type=Path, default=ROOT / "demo" / "data-bin")
    parser.add_argument("--path", type=Path, default=ROOT / "demo" / "checkpoints" / "checkpoint_best.pt")
    parser.add_argument("--subset", default="test")
    parser.add_argument("--beams", type=lambda s: [int(b) for b in s.split(",")], default=[1, 5], help="e.g. 1,5")
    parser.add_argument("--topk", type=int, default=5, help="--decoding-topk of the masked configurations")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-len-a", type=float, default=0)
    parser.add_argument("--max-len-b", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--min-seconds", type=float, default=0.25,
                        help="decode the test set as many times as this takes, per measurement")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--plain-only", action="store_true",
                        help="only plain beam search, none of the masks (with --recompute: what the cache is worth)")
    parser.add_argument("--recompute", action="store_true",
                        help="also run each configuration without the decoder's cache (the prefix recomputed at every "
                        "step)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "decoding_speed",
                        help="writes OUT.md and OUT.png")
    args = parser.parse_args()
    for path in (args.data_bin, args.path):
        if not path.exists():
            sys.exit(f"error: {path} does not exist; run `bash scripts/run_demo.sh` or pass --data-bin/--path")

    rows = measure(args)
    command = command_line(__file__, None)
    threads = torch.get_num_threads()
    info = f"{rows[0]['sentences']} sentences, batch {args.batch_size}, {args.device}, {threads} threads"
    text = table(rows, command) + f"\n\n{info}; minimum of {args.repeats} interleaved runs of at least " \
        f"{args.min_seconds:g} s each.\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.md')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
