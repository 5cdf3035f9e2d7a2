"""User mistakes in the plugin's options, through the real fairseq tools: one line, exit status 2, no
traceback; settings that make a method another one are announced; fairseq's own --tensorboard-logdir."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from conftest import ROOT, TRAIN_COMMON, run_cli
from user_dir.options import Interval, at_least, even_at_least_2, in_range, negative, positive, unset_or

USER_DIR = ("--user-dir", ROOT / "user_dir")


def test_interval_messages():
    assert at_least(1)(0) == "must be >= 1, got 0" and at_least(1)(1) is None
    assert in_range(0, 1)(1.5) == "must be in [0, 1], got 1.5" and in_range(0, 1)(1) is None
    assert in_range(0, 1, high_open=True)(1.0) == "must be in [0, 1), got 1"
    assert positive()(0.0) == "must be > 0, got 0" and negative()(0) == "must be < 0, got 0"
    assert negative()(float("-inf")) is None
    assert in_range(0, 1)(float("nan")) == "must be in [0, 1], got nan"
    assert Interval(low=2, high=5, low_open=True)(2) == "must be in (2, 5], got 2"
    assert unset_or(at_least(1))(-1) is None and unset_or(at_least(1))(0) == "must be >= 1 (or -1), got 0"
    assert even_at_least_2(4) is None and "even integer >= 2" in even_at_least_2(3)


def _refused(proc, tool: str, message: str, parsed: bool) -> None:
    """Exit status 2 with ``<tool>: error: <message>`` as the last line and no traceback; a mistake found
    while parsing the arguments stops before fairseq prints its configuration."""
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stderr.splitlines()[-1] == f"{tool}: error: {message}", proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if parsed:
        assert "fairseq_cli" not in proc.stdout + proc.stderr, "stopped before fairseq started its work"


@pytest.mark.parametrize("flags, message, parsed", [
    (["--criterion", "sparse_softmax", "--sparse-topk", "0"], "--sparse-topk must be >= 1, got 0", True),
    (["--criterion", "as_softmax", "--as-delta", "1.5"], "--as-delta must be in [0, 1], got 1.5", True),
    (["--criterion", "as_softmax", "--as-delta", "-0.1"], "--as-delta must be in [0, 1], got -0.1", True),
    (["--criterion", "as_softmax", "--as-warmup-ratio", "1"], "--as-warmup-ratio must be in [0, 1), got 1", True),
    (["--criterion", "temperature_softmax", "--softmax-temperature", "0"],
     "--softmax-temperature must be > 0, got 0", True),
    (["--criterion", "taylor_softmax", "--taylor-order", "3"],
     "--taylor-order must be an even integer >= 2 (odd orders make the Taylor expansion negative), got 3", True),
    (["--criterion", "sparse_softmax", "--arch", "cosine_transformer_tiny", "--cosine-scale", "-1"],
     "--cosine-scale must be > 0, got -1", True),
    (["--task", "sparse_seq2seq", "--criterion", "as_softmax", "--as-speed", "--as-speed-lambda", "0"],
     "--as-speed-lambda must be > 0, got 0", True),
    (["--criterion", "as_softmax", "--as-warmup-ratio", "0.5", "--max-update", "0"],
     "--as-warmup-ratio is a fraction of --max-update: set --max-update", False),
    (["--criterion", "as_softmax", "--as-warmup-ratio", "0.1", "--as-anneal-ratio", "0.5"],
     "--as-warmup-ratio and --as-anneal-ratio: choose one (both start from a softmax-like delta)", False),
    (["--criterion", "as_softmax", "--as-anneal-from", "0.5"],
     "--as-anneal-from is where --as-anneal-ratio starts: set --as-anneal-ratio", False),
    (["--criterion", "as_softmax", "--as-anneal-ratio", "0.5", "--as-anneal-from", "0.2"],
     "--as-anneal-from 0.2 is below --as-delta 0.3: the annealing only lowers delta, from --as-anneal-from "
     "down to --as-delta", False),
    (["--criterion", "as_softmax", "--as-anneal-ratio", "1.5"], "--as-anneal-ratio must be in [0, 1], got 1.5", True),
    (["--criterion", "sparse_softmax", "--sparse-warmup-ratio", "1"], "--sparse-warmup-ratio must be in [0, 1), got 1",
     True),
    (["--criterion", "sparse_softmax", "--sparse-warmup-ratio", "0.5", "--max-update", "0"],
     "--sparse-warmup-ratio is a fraction of --max-update: set --max-update", False),
    (["--task", "sparse_seq2seq", "--criterion", "softmax", "--as-speed"],
     "--as-speed counts masked samples: train with --criterion as_softmax or as_multilabel", False),
])
def test_training_option_mistakes(flags, message, parsed, toy_data, tmp_path):
    arch = [] if "--arch" in flags else ["--arch", "transformer_tiny"]
    proc = run_cli("fairseq-train", toy_data, *TRAIN_COMMON, *arch, "--max-update", "2", "--save-dir", tmp_path,
                   *flags, check=False)
    _refused(proc, "fairseq-train", message, parsed)
    assert not list(Path(tmp_path).glob("*.pt")), "nothing was trained"


@pytest.mark.parametrize("flags, message, parsed", [
    (["--decoding-topk", "-1"], "--decoding-topk must be >= 0, got -1", True),
    (["--decoding-mask-fill", "0"], "--decoding-mask-fill must be < 0, got 0", True),
    (["--source-vocab-mask", "--source-vocab-allow", "w1 zz"],
     "--source-vocab-allow: not in the target dictionary: zz (the dictionary has 48 symbols)", False),
    (["--decoding-topk", "5", "--sampling", "--nbest", "3"],
     "--decoding-topk / --source-vocab-mask work with plain beam search, not with --sampling. "
     "For top-k sampling use --sampling --sampling-topk K instead of --decoding-topk.", False),
])
def test_decoding_option_mistakes(flags, message, parsed, toy_data, checkpoint):
    proc = run_cli("fairseq-generate", toy_data, *USER_DIR, "--task", "sparse_seq2seq", "--path", checkpoint, "--cpu",
                   "--gen-subset", "test", "--beam", "3", *flags, check=False)
    _refused(proc, "fairseq-generate", message, parsed)
    assert "H-" not in proc.stdout


def _warnings(output: str) -> list[str]:
    """The plugin's warning lines, in fairseq-train's log format (``date | WARNING | logger | message``)
    or Python's default one (``WARNING:logger:message``)."""
    found = []
    for line in output.splitlines():
        if " | WARNING | user_dir." in line:
            found.append(line.split(" | ", 3)[3])
        elif line.startswith("WARNING:user_dir."):
            found.append(line.split(":", 2)[2])
    return found


@pytest.mark.parametrize("flags, warning", [
    (["--criterion", "sparse_softmax", "--sparse-topk", "48"],
     "--sparse-topk 48 >= 48 classes: sparse_softmax keeps every class, so it trains plain softmax cross-entropy"),
    (["--criterion", "as_softmax", "--as-delta", "1"],
     "--as-delta 1: AS-Softmax keeps every class, so it trains plain softmax cross-entropy"),
    (["--criterion", "temperature_softmax"],
     "--softmax-temperature 1: temperature_softmax trains plain softmax cross-entropy"),
    (["--criterion", "sparse_softmax", "--sparse-topk", "47"], None),
])
def test_a_method_that_becomes_another_is_announced(flags, warning, toy_data, tmp_path):
    """The toy dictionary has 48 symbols: k = 48 keeps all of them, k = 47 does not."""
    proc = run_cli("fairseq-train", toy_data, *TRAIN_COMMON, "--arch", "transformer_tiny", "--max-update", "1",
                   "--save-dir", tmp_path, *flags)
    assert _warnings(proc.stdout + proc.stderr) == ([warning] if warning else [])


def test_decoding_topk_covering_the_vocabulary_is_announced(toy_data, checkpoint):
    common = ["fairseq-generate", toy_data, *USER_DIR, "--task", "sparse_seq2seq", "--path", checkpoint, "--cpu",
              "--gen-subset", "test", "--beam", "3"]
    proc = run_cli(*common, "--decoding-topk", "48")
    assert _warnings(proc.stdout + proc.stderr) == [
        "--decoding-topk 48 >= 48 target symbols: no token is masked by it, so decoding is plain beam search"]
    assert _warnings(run_cli(*common, "--decoding-topk", "47").stdout) == []


def _tensorboard_tags(folder: Path) -> set[str]:
    """The scalar names in the TensorBoard event files under ``folder`` (TFRecord framing, read directly)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for path in folder.rglob("events.out.tfevents.*"):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            tags |= {value.tag for value in event.summary.value}
            offset += 12 + length + 4
    return tags


def test_tensorboard_logging_works(toy_data, tmp_path):
    proc = run_cli("fairseq-train", toy_data, *TRAIN_COMMON, "--arch", "transformer_tiny", "--max-update", "3",
                   "--criterion", "as_softmax", "--save-dir", tmp_path / "ckpt", "--tensorboard-logdir", tmp_path / "tb")
    assert "tensorboardX" not in proc.stdout + proc.stderr, "fairseq's 'Please install tensorboardX' line is gone"
    assert {"loss", "nll_loss", "masked_ratio", "as_delta"} <= _tensorboard_tags(tmp_path / "tb" / "train_inner")
