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
Wall-clock is fairseq's own ``wall`` (whole seconds since the run started, validations included); a last table
gives the seconds of training alone (``classification_runs.py``).
The plots show validation accuracy per update, per second and per epoch, the validation softmax
cross-entropy per update, and, for AS-Softmax, the masked-sample ratio and the accumulation steps per
update (the AS paper's Figure 1). Test scores also come as CLINC150 is read (Larson et al. 2019): accuracy on the
150 intents and recall of ``oos``, whose share is 18 % of the test split and 3 % of the validation split.

Where the papers leave a method's hyper-parameter open (T-softmax's temperature, label smoothing's epsilon,
AM-softmax's margin: ``CLINC150.choices``), each value runs on seed 1 and the value with the best validation accuracy
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
import sys
from pathlib import Path

from sparse_softmax.userinput import exit_on_error
from user_dir import hf_checkpoint

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / part) for part in ("benchmarks", "experiments")]
from classification_runs import (AS_SPEED, FITTED, Benchmark, add_arguments, check_arguments,  # noqa: E402
                                 prepared, run_methods, write_results)
from measure import ROOT  # noqa: E402  (benchmarks/)

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
    AS_SPEED: ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-speed", "--as-speed-lambda", "1.0",
               "--as-speed-max-steps", "4"],
}
METHODS[FITTED] = METHODS[AS_SPEED]
CLINC150 = Benchmark(
    methods=METHODS,
    # hyper-parameters the papers leave open, each with the values tried on seed 1's validation (see the module doc)
    choices={"temperature_softmax": ("--softmax-temperature", ["0.5", "2"]),
             "label_smoothing": ("--label-smoothing", ["0.1", "0.2"]),
             "am_softmax": ("--softmax-margin", ["0.2", "0.35"])},
    metric="accuracy",
    # fairseq-validate's scores of the best checkpoint on the test split (the last two by --out-of-scope-label oos)
    test_scores=("accuracy", "macro_f1", "in_scope_accuracy", "out_of_scope_recall"),
    task_flags=["--out-of-scope-label", "oos"],
)
#: the default --methods: the four of the committed from-scratch tables
CORE = ["softmax", "sparse_softmax", "as_softmax", AS_SPEED]
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


def prepare(args) -> Path:
    tokens = (["--hf-tokenizer", args.hf_model_dir] if args.hf_model_dir
              else ["--lowercase", "--spm-vocab-size", "4000"])
    return prepared(args, ["prepare_classification.py", "--dataset", "clinc150", "--input", args.clinc_json, *tokens],
                    [args.clinc_json], "pass --clinc-json path/to/data_full.json")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for data, runs, table and plots (default: "
                        "experiments/clinc150/scratch, or experiments/clinc150/NAME for --hf-model-dir .../NAME)")
    parser.add_argument("--clinc-json", type=Path, default=DEFAULT_JSON, help="CLINC150 data_full.json")
    parser.add_argument("--full", action="store_true", help="larger encoder, 20 epochs (hours on a CPU)")
    parser.add_argument("--hf-model-dir", type=Path, help="fine-tune this pretrained Hugging Face encoder "
                        "(a save_pretrained folder) instead of training text_encoder from scratch")
    add_arguments(parser, CLINC150, CORE, {
        "epochs": "6, --full: 20, --hf-model-dir: 3", "lr": "0.001, --hf-model-dir: 5e-5",
        "batch_size": "64, --hf-model-dir: 32", "validate_every": "50, --hf-model-dir: 100"})
    args = parser.parse_args(argv)
    if args.hf_model_dir and args.full:
        parser.error("--full is the larger from-scratch encoder; --hf-model-dir fine-tunes a pretrained one")
    if args.hf_model_dir and (message := hf_checkpoint.problem(args.hf_model_dir, "--hf-model-dir")):
        parser.error(f"{message}; scripts/extract_minilm.py writes MiniLM's")
    setting = SETTINGS["pretrained" if args.hf_model_dir else "full" if args.full else "default"]
    check_arguments(parser, args, setting)
    args.out = args.out or Path(__file__).parent / (args.hf_model_dir.resolve().name if args.hf_model_dir else "scratch")
    with exit_on_error(parser):
        results, tried = run_methods(CLINC150, args, setting["model"], prepare(args))
    write_results(CLINC150, args, __file__, argv, results, tried)


if __name__ == "__main__":
    main()
