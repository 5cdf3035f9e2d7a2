"""--fused-output-layer through the real fairseq-train / fairseq-generate: the same logged values as
the unfused criterion on the same seed, resuming, decoding, AS-Speed, two processes, and refusals."""
from __future__ import annotations

import pytest

from conftest import N_TEST, ROOT, TRAIN_COMMON, json_logs, output_lines, run_cli, train_two_ranks

CRITERIA = {
    "sparse_softmax": ["--criterion", "sparse_softmax", "--sparse-topk", "5", "--label-smoothing", "0.1",
                       "--update-freq", "2", "--sparse-warmup-ratio", "0.5"],
    "as_softmax": ["--criterion", "as_softmax", "--as-delta", "0.3", "--as-warmup-ratio", "0.5"],
    "softmax": ["--criterion", "softmax", "--label-smoothing", "0.1"],
}
# Shared input/output embeddings: the output layer's weight also gets the embedding gradient.
MODEL = ["--arch", "transformer_tiny", "--share-all-embeddings"]
LOGGED = ("loss", "nll_loss", "masked_ratio", "dense_ratio", "as_delta", "sparse_warmup", "flat_slope")


def train(data, save_dir, *flags, updates=6):
    return run_cli("fairseq-train", data, *TRAIN_COMMON, *MODEL, *flags, "--max-update", str(updates),
                   "--save-dir", save_dir)


@pytest.mark.parametrize("criterion", sorted(CRITERIA))
def test_logs_equal_the_unfused_run(criterion, toy_data, tmp_path):
    """Same seed, same batches: the first updates log the same values to the printed precision (the two
    paths compute the same logits, up to the order of float32 sums)."""
    plain = json_logs(train(toy_data, tmp_path / "plain", *CRITERIA[criterion]), "train_inner")
    fused = json_logs(train(toy_data, tmp_path / "fused", *CRITERIA[criterion], "--fused-output-layer"),
                      "train_inner")
    assert len(plain) == len(fused) == 6
    for a, b in zip(plain, fused):
        assert {k for k in LOGGED if k in a} == {k for k in LOGGED if k in b}
        for key in (k for k in LOGGED if k in a):
            assert float(a[key]) == pytest.approx(float(b[key]), abs=2e-3), (key, a, b)
    if criterion == "as_softmax":
        assert [float(r["as_delta"]) for r in fused] == [1.0] * 3 + [0.3] * 3, "warm-up, then δ"
    if criterion == "sparse_softmax":
        assert [float(r["sparse_warmup"]) for r in fused] == [1.0] * 3 + [0.0] * 3, "softmax warm-up, then top k"
        assert all("flat_slope" in r for r in plain + fused), "logged in the warm-up too, by both paths"


def test_a_fused_run_resumes_and_its_checkpoint_decodes(toy_data, tmp_path):
    flags = [*CRITERIA["as_softmax"], "--fused-output-layer"]
    first = json_logs(train(toy_data, tmp_path, *flags, "--max-epoch", "1", updates=20), "train_inner")
    second = json_logs(train(toy_data, tmp_path, *flags, updates=20), "train_inner")
    assert [int(r["num_updates"]) for r in second] == list(range(len(first) + 1, 21)), "training did not resume"
    gen = run_cli("fairseq-generate", toy_data, "--user-dir", ROOT / "user_dir", "--task", "sparse_seq2seq",
                  "--path", tmp_path / "checkpoint_last.pt", "--cpu", "--beam", "3", "--decoding-topk", "3",
                  "--batch-size", "16", "--gen-subset", "test")
    assert sorted(output_lines(gen.stdout, "H")) == list(range(N_TEST))


def test_as_speed_with_the_fused_layer(toy_data, tmp_path):
    out = train(toy_data, tmp_path, "--task", "sparse_seq2seq", "--criterion", "as_softmax", "--as-delta", "0.5",
                "--as-speed", "--as-speed-max-steps", "3", "--fused-output-layer", updates=12)
    steps = [int(r["accum_steps"]) for r in json_logs(out, "train_inner")]
    assert steps[0] == 1 and steps == sorted(steps), steps


def test_two_processes_with_the_fused_layer(toy_data, tmp_path):
    outputs = train_two_ranks(toy_data, *TRAIN_COMMON, *MODEL, "--criterion", "sparse_softmax", "--fused-output-layer",
                              "--max-update", "4", "--save-dir", tmp_path)
    assert [int(r["num_updates"]) for r in json_logs(outputs[0], "train_inner")] == [1, 2, 3, 4]


def test_refused_for_a_decoder_with_its_own_output_layer(toy_data, tmp_path):
    proc = run_cli("fairseq-train", toy_data, *TRAIN_COMMON, "--arch", "cosine_transformer_tiny", "--criterion",
                   "sparse_softmax", "--fused-output-layer", "--max-update", "2", "--save-dir", tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == (
        "fairseq-train: error: --fused-output-layer needs a decoder whose logits are its plain linear "
        "output_projection; CosineTransformerDecoder computes its logits in its own output_layer (e.g. cosine "
        "logits for am_softmax)")
    assert not list(tmp_path.iterdir()), "found in the first step, yet no crash.pt: a usage error is no crash"


def test_refused_with_fairseqs_sharded_backend(toy_data, tmp_path):
    proc = run_cli("fairseq-train", toy_data, *TRAIN_COMMON, *MODEL, "--criterion", "sparse_softmax",
                   "--fused-output-layer", "--ddp-backend", "fully_sharded", "--max-update", "2", "--save-dir",
                   tmp_path / "run", check=False)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == (
        "fairseq-train: error: --fused-output-layer trains with --ddp-backend c10d, legacy_ddp or no_c10d, not "
        "fully_sharded (fairscale's sharding, which it is not tested under): the Hugging Face FusedTrainerLoss trains "
        "sharded, under FSDP2 or ZeRO-3")
    assert not (tmp_path / "run").exists()
