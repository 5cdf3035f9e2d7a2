"""Half-precision training and the GPU path through the real CLIs: fairseq-train in bf16 (CPU and CUDA)
and fp16 (CUDA: fairseq's fp16 optimizer needs it) with the sparse criterions, and masked decoding with
fairseq-generate on CUDA. The CUDA cases skip where there is no CUDA device; the CPU cases of masked
decoding are in test_cli_decoding.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import N_TEST, ROOT, TRAIN_COMMON, json_logs, output_lines, run_cli

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
ON_DEVICE = {"cpu": list(TRAIN_COMMON), "cuda": [flag for flag in TRAIN_COMMON if flag != "--cpu"]}
CRITERIA = {
    "sparse_softmax": ["--criterion", "sparse_softmax", "--sparse-topk", "5", "--label-smoothing", "0.1"],
    "sparse_softmax fused": ["--criterion", "sparse_softmax", "--sparse-topk", "5", "--fused-output-layer"],
    "as_softmax warm-up": ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-warmup-ratio", "0.3"],
    "as_softmax fused": ["--criterion", "as_softmax", "--as-delta", "0.3", "--fused-output-layer"],
    "AS-Speed": ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-speed", "--update-freq", "2"],
}
UPDATES = 20  # enough for the loss to fall in bf16; the float32 paths are tested at length elsewhere


def _train(data, save_dir, device, *flags):
    return run_cli("fairseq-train", data, *ON_DEVICE[device], "--task", "sparse_seq2seq", "--arch", "transformer_tiny",
                   "--max-update", str(UPDATES), "--save-dir", save_dir, *flags)


@pytest.mark.parametrize("device, precision", [("cpu", "--bf16"), pytest.param("cuda", "--bf16", marks=needs_cuda),
                                               pytest.param("cuda", "--fp16", marks=needs_cuda)])
@pytest.mark.parametrize("criterion", sorted(CRITERIA))
def test_half_precision_training_has_finite_falling_loss(criterion, device, precision, toy_data, tmp_path):
    logs = json_logs(_train(toy_data, tmp_path, device, precision, *CRITERIA[criterion]), "train_inner")
    assert len(logs) >= UPDATES - 5, f"{len(logs)} logged updates"  # fp16 may skip a few on overflow
    losses = [float(r["loss"]) for r in logs]
    assert all(math.isfinite(x) for x in losses), losses
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), f"loss did not decrease: {losses}"


@pytest.fixture(scope="module")
def gpu_checkpoint(toy_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("cuda")
    _train(toy_data, save_dir, "cuda", "--bf16", *CRITERIA["sparse_softmax"])
    return save_dir / "checkpoint_last.pt"


def _generate(data, checkpoint, *flags) -> dict[int, list[list[str]]]:
    out = run_cli("fairseq-generate", data, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                  "--path", checkpoint, "--gen-subset", "test", "--batch-size", "16", *flags)
    return output_lines(out.stdout, "H")


@needs_cuda
@pytest.mark.parametrize("flags", [["--decoding-topk", "5"], ["--decoding-topk", "5", "--source-vocab-mask"],
                                   ["--source-vocab-mask"]])
def test_masked_generation_gives_one_hypothesis_per_input(flags, toy_data, gpu_checkpoint):
    hypotheses = _generate(toy_data, gpu_checkpoint, "--beam", "5", *flags)
    assert sorted(hypotheses) == list(range(N_TEST)) and all(len(h) == 1 for h in hypotheses.values())


@needs_cuda
def test_topk_at_least_vocab_is_plain_beam_search_on_the_gpu(toy_data, gpu_checkpoint):
    plain = _generate(toy_data, gpu_checkpoint, "--beam", "5")
    assert _generate(toy_data, gpu_checkpoint, "--beam", "5", "--decoding-topk", "100000") == plain
    assert _generate(toy_data, gpu_checkpoint, "--beam", "5", "--decoding-topk", "2") != plain
