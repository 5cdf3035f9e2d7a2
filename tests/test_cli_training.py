"""End to end through the real CLIs: fairseq-preprocess -> fairseq-train -> fairseq-generate."""
from __future__ import annotations

import math
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import BIN, N_TEST, ROOT, TRAIN_COMMON, json_logs, output_lines, run_cli, run_script, train_two_ranks
from test_criterion_wiring import OPTIONS, SCALE, core_loss, criterion_flags

# Every criterion trains a few updates with the options test_criterion_wiring checks, and its logged loss must be
# the core loss of the saved model's logits: the options reach the core through the real command line. The
# papers' two methods also train long enough to learn and to decode.
TRAINED = ("sparse_softmax", "as_softmax")
UPDATES = 40  # for the papers' methods; the others train 2
ARCH = {"am_softmax": ["--arch", "cosine_transformer_tiny", "--cosine-scale", str(SCALE)]}  # cosine logits


def _train(data, save_dir, flags, max_update):
    arch = ["--arch", "transformer_tiny"] if "--arch" not in flags else []
    return run_cli("fairseq-train", data, *TRAIN_COMMON, *arch, *flags,
                   "--max-update", str(max_update), "--save-dir", save_dir)


def valid_logits(checkpoint) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint's decoder logits (float64) for every target token of the validation split, one sentence at a
    time (no padding), and the targets."""
    from fairseq import checkpoint_utils

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    model = models[0].eval()
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    logits, targets = [], []
    with torch.no_grad():
        for i in range(len(dataset)):
            sample = dataset.collater([dataset[i]])
            logits.append(model(**sample["net_input"])[0][0].double())
            targets.append(sample["target"][0])
    return torch.cat(logits), torch.cat(targets)


@pytest.mark.parametrize("criterion", sorted(OPTIONS))
def test_train_logs_the_core_loss(criterion, toy_data, tmp_path):
    updates = UPDATES if criterion in TRAINED else 2
    out = _train(toy_data, tmp_path, ARCH.get(criterion, []) + criterion_flags(criterion, OPTIONS[criterion]),
                 updates)
    logs = json_logs(out, "train_inner")
    assert len(logs) == updates, f"expected one log per update, got {len(logs)}"
    losses = [float(r["loss"]) for r in logs]
    nlls = [float(r["nll_loss"]) for r in logs]
    assert all(math.isfinite(x) for x in losses + nlls)
    # fairseq-train validates when it stops; checkpoint_last.pt holds the weights it validated
    valid = json_logs(out, "valid")[-1]
    assert int(valid["valid_num_updates"]) == updates
    z, t = valid_logits(tmp_path / "checkpoint_last.pt")
    bits = len(t) * math.log(2)
    assert float(valid["valid_loss"]) == pytest.approx(float(core_loss(criterion, z, t, OPTIONS[criterion])) / bits,
                                                       abs=1e-3)
    assert float(valid["valid_nll_loss"]) == pytest.approx(float(F.cross_entropy(z, t, reduction="sum")) / bits,
                                                           abs=1e-3)
    if criterion not in TRAINED:
        return
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), f"loss did not decrease: {losses}"
    assert np.mean(nlls[-5:]) < np.mean(nlls[:5]), f"nll did not decrease: {nlls}"
    gen = run_cli("fairseq-generate", toy_data, "--user-dir", ROOT / "user_dir", "--path", tmp_path / "checkpoint_last.pt",
                  "--cpu", "--beam", "3", "--batch-size", "16", "--gen-subset", "test")
    hypotheses = output_lines(gen.stdout, "H")
    assert sorted(hypotheses) == list(range(N_TEST)) and all(len(h) == 1 for h in hypotheses.values())


# loss -> its warm-up flags, the logged value that shows the phase, and that value during and after the warm-up
WARMUPS = {
    "as_softmax": (["--criterion", "as_softmax", "--as-delta", "0.3", "--as-warmup-ratio", "0.5"], "as_delta", 1.0, 0.3),
    "sparse_softmax": (["--criterion", "sparse_softmax", "--sparse-topk", "5", "--sparse-warmup-ratio", "0.5"],
                       "sparse_warmup", 1.0, 0.0),
}


@pytest.mark.parametrize("loss", sorted(WARMUPS))
def test_the_warmup_resumes_from_a_checkpoint(loss, toy_data, tmp_path):
    flags, key, warm, after = WARMUPS[loss]
    # Stop after one epoch (5 updates here), then resume the same run up to --max-update 20.
    first = _train(toy_data, tmp_path, flags + ["--max-epoch", "1"], max_update=20)
    second = _train(toy_data, tmp_path, flags, max_update=20)
    before = json_logs(first, "train_inner")
    after_logs = json_logs(second, "train_inner")
    assert 0 < len(before) < 10, "the first run must stop inside the warm-up"
    assert [int(r["num_updates"]) for r in after_logs] == list(range(len(before) + 1, 21)), "training did not resume"
    for record in before + after_logs:
        update_index = int(record["num_updates"]) - 1  # logged after the update it describes
        assert float(record[key]) == pytest.approx(warm if update_index < 10 else after), record
    if loss == "as_softmax":
        assert all(0.0 <= float(r["masked_ratio"]) <= 1.0 for r in before + after_logs)
        assert all(float(r["masked_ratio"]) == 0.0 for r in before), "δ = 1 masks nothing"
    else:  # the warm-up trains softmax cross-entropy, which nll_loss also is; then the loss over the top k is lower
        assert all(float(r["loss"]) == float(r["nll_loss"]) for r in before)
        assert all(float(r["loss"]) < float(r["nll_loss"]) for r in after_logs if int(r["num_updates"]) > 10)
        # a tiny model after 10 updates scores above log k on the top-k loss: told once, at the hand-over
        told = [run.stdout.count("hands over") for run in (first, second)]
        assert told == [0, 1] and "warm-up hands over at update 10 " in second.stdout, told


def test_as_delta_annealing_through_fairseq_train(toy_data, tmp_path):
    """δ falls from 1 to 0.2 over the first half of 10 updates (0.16 less per update), then stays."""
    out = _train(toy_data, tmp_path, ["--criterion", "as_softmax", "--as-delta", "0.2", "--as-anneal-ratio", "0.5"],
                 max_update=10)
    logged = [float(r["as_delta"]) for r in json_logs(out, "train_inner")]
    assert logged == pytest.approx([1.0, 0.84, 0.68, 0.52, 0.36] + [0.2] * 5, abs=1e-3)  # logs round to 3 digits


def test_checkpoint_needs_the_plugin_to_load(toy_data, tmp_path):
    _train(toy_data, tmp_path, ["--criterion", "sparse_softmax"], max_update=2)
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "checkpoint_last.pt")  # torch's default; fairseq-generate works via the plugin


def test_two_process_data_parallel_training_on_cpu(toy_data, tmp_path):
    outputs = train_two_ranks(toy_data, *TRAIN_COMMON, "--arch", "transformer_tiny", "--criterion", "as_softmax",
                              "--max-update", "6", "--save-dir", tmp_path)
    logs = json_logs(outputs[0], "train_inner")
    assert [int(r["num_updates"]) for r in logs] == list(range(1, 7))
    assert "distributed init (rank 1)" in outputs[1], "the second process must have joined the group"


def test_plugin_help_documents_every_option():
    """``python -m user_dir.help`` lists each criterion's and task's options with their help strings."""
    import dataclasses

    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY

    import user_dir  # noqa: F401  (registers the criterions whose dataclasses are compared below)
    from user_dir.as_speed import ASSpeedConfig
    from user_dir.models.hf_unilm import HFUniLMConfig
    from user_dir.models.text_encoder import TextEncoderConfig
    from user_dir.tasks.sparse_seq2seq import MaskedDecodingConfig
    from user_dir.tasks.text_classification import TextClassificationConfig

    out = subprocess.run([str(BIN / "python"), "-m", "user_dir.help"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    names = sorted(OPTIONS) + ["multilabel_softmax", "as_multilabel"]
    sections = [(f"criterion {name}", CRITERION_DATACLASS_REGISTRY[name]) for name in names]
    sections += [("task sparse_seq2seq", MaskedDecodingConfig), ("task sparse_seq2seq", ASSpeedConfig),
                 ("task text_classification", TextClassificationConfig), ("model text_encoder", TextEncoderConfig),
                 ("model hf_unilm", HFUniLMConfig)]
    for title, dc in sections:
        section = out.split(f"=== {title}\n")[1].split("===")[0]
        for f in dataclasses.fields(dc):
            if f.name == "_name" or str(f.default).startswith("${"):  # fairseq's own options (--sentence-avg, ...)
                continue
            flag = f.name if f.name == "data" else "--" + f.name.replace("_", "-")  # data is positional
            assert f.metadata.get("help"), f"{flag} of {title} has no help string"
            assert flag in section, f"{flag} missing from the help of {title}"
            assert " ".join(f.metadata["help"].split()[:3]) in " ".join(section.split()), f"help of {flag}"
    assert "--cosine-scale" in out.split("=== model cosine_transformer\n")[1]


def test_plot_training_log_refuses_what_it_cannot_read(tmp_path):
    (tmp_path / "text.log").write_text("2026 | INFO | fairseq_cli.train | epoch 001 | loss 3.2\n")
    (tmp_path / "broken.log").write_text('x | train_inner | {"loss": 1\n')
    for log, message in ((tmp_path / "none.log", "none.log: no such file"),
                         (tmp_path / "text.log", "text.log: no train_inner records (use --log-format json"),
                         (tmp_path / "broken.log", "broken.log:1: unreadable train_inner record")):
        proc = run_script("scripts/plot_training_log.py", log, "--out", tmp_path / "x.png", check=False)
        assert proc.returncode == 2 and f"plot_training_log.py: error: {log.parent}/{message}" in proc.stderr
        assert not (tmp_path / "x.png").exists()


def test_train_progress_shows_one_line_per_epoch_and_keeps_the_whole_log(tmp_path):
    """scripts/train_progress.py (the demo's training output) on fairseq's json records."""
    records = [
        '2026-01-01 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "9.1", "num_updates": "10"}',
        '2026-01-01 | INFO | valid | {"epoch": 1, "valid_loss": "8.2", "valid_nll_loss": "8.0", '
        '"valid_num_updates": "20"}',
        '2026-01-01 | INFO | train | {"epoch": 1, "train_loss": "8.7", "train_num_updates": "20", "train_wall": "3"}',
        '2026-01-01 | INFO | valid | {"epoch": 2, "valid_loss": "8.4", "valid_nll_loss": "8.1", '
        '"valid_num_updates": "40"}',
        '2026-01-01 | INFO | train | {"epoch": 2, "train_loss": "8.3", "train_num_updates": "40", "train_wall": "6"}',
        "2026-01-01 | INFO | fairseq_cli.train | done training in 6.1 seconds"]
    log = tmp_path / "logs" / "train.log"
    proc = subprocess.run([str(BIN / "python"), ROOT / "scripts" / "train_progress.py", "--log", log, "--max-update",
                           "40"], input="\n".join(records) + "\n", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "epoch   1 | update 20/40 | train loss 8.700 | valid loss 8.200, nll 8.000 | 3 s",
        "epoch   2 | update 40/40 | train loss 8.300 | valid loss 8.400, nll 8.100 | 6 s",
        f"best valid loss 8.200 (epoch 1); the whole log: {log}"]
    assert log.read_text().splitlines() == records


def test_a_training_that_fails_stops_the_pipeline_with_its_error(tmp_path):
    """As the demo runs it: fairseq-train's error, not a silent success, when its output goes through
    train_progress.py under ``set -o pipefail``."""
    script = (f"set -euo pipefail\n{BIN / 'fairseq-train'} {tmp_path / 'missing-data-bin'} "
              f"--user-dir {ROOT / 'user_dir'} --task sparse_seq2seq --arch transformer_tiny --cpu --max-tokens 100 "
              "2>&1 "
              f"| {BIN / 'python'} {ROOT / 'scripts' / 'train_progress.py'} --log {tmp_path / 'train.log'}\n"
              "echo 'went on'\n")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert proc.returncode != 0 and "went on" not in proc.stdout
    assert "fairseq-train stopped before it finished" in proc.stderr
    assert str(tmp_path / "missing-data-bin") in proc.stderr  # fairseq's own error, shown
