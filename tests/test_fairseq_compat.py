"""The fairseq fixes in user_dir.fairseq_compat, the criterions on half-precision logits, and what the
sparse_softmax criterion logs of its logits' flat slope."""
from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY
from fairseq.data import Dictionary, data_utils
from fairseq.models import BaseFairseqModel
from fairseq.ngram_repeat_block import NGramRepeatBlock

import user_dir  # noqa: F401  (applies the fixes, registers the criterions)

from conftest import ROOT


def _batches(fn, n=30, bsz=16, mult=8):
    return fn(np.arange(n), num_tokens_fn=lambda i: 5, max_sentences=bsz, required_batch_size_multiple=mult)


def test_batch_by_size_keeps_every_index_once():
    batches = _batches(data_utils.batch_by_size)
    assert sorted(int(i) for b in batches for i in b) == list(range(30))
    assert all(len(b) % 8 == 0 for b in batches[:-1]), "all but the last batch keep the required multiple"


def test_upstream_batch_by_size_still_drops_the_tail():
    """If this fails, fairseq fixed the drop itself and the wrapper in fairseq_compat can go."""
    assert sum(len(b) for b in _batches(data_utils.batch_by_size.__wrapped__)) == 24


def test_batch_by_size_accepts_a_one_shot_iterator():
    batches = data_utils.batch_by_size(iter(range(30)), num_tokens_fn=lambda i: 5, max_sentences=16,
                                       required_batch_size_multiple=8)
    assert sum(len(b) for b in batches) == 30


def _blocked_after_repeat(no_repeat_ngram) -> list[int]:
    """Tokens banned at step 3 of "</s> 5 6 5" in the generator's padded buffer, size-2 blocking."""
    tokens = torch.tensor([[2, 5, 6, 5] + [1] * 6])  # </s> start, generated 5 6 5, then padding
    lprobs = torch.zeros(1, 8)
    no_repeat_ngram(NGramRepeatBlock(2, use_extension=False), tokens, lprobs, 1, 1, 3)
    return (lprobs[0] == -float("inf")).nonzero().flatten().tolist()


def test_no_repeat_ngram_blocks_on_the_generated_tokens():
    assert _blocked_after_repeat(NGramRepeatBlock._no_repeat_ngram) == [6]  # "5 6" already occurred


def test_upstream_no_repeat_ngram_still_reads_the_padding():
    """If this fails, fairseq fixed issue #4709 itself and the wrapper in fairseq_compat can go."""
    assert _blocked_after_repeat(NGramRepeatBlock._no_repeat_ngram.__wrapped__) == []


def test_models_record_the_update_count():
    model = BaseFairseqModel()
    model.set_num_updates(17)
    assert model.num_updates == 17


# fairseq's buffered batch iterator over batches that take torch work to make (matrix products, which run
# with the interpreter lock released); the process exits once it has taken the first. Run with "plugin",
# the plugin is imported first.
_EXIT_WHILE_MAKING_BATCHES = """
import sys
import torch
from fairseq.data import iterators
if sys.argv[1:] == ["plugin"]:
    import user_dir
class Batches:
    def __len__(self):
        return 10**6
    def __iter__(self):
        x = torch.randn(300, 300)
        while True:
            for _ in range(20):
                x = torch.tanh(x @ x)
            yield x
next(iterators.BufferedIterator(100, Batches()))
print("exits")
"""


def _exit_status(script: str, *args: str) -> int:
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert "exits" in proc.stdout, proc.stderr
    return proc.returncode


def _crashes_without_the_plugin(script: str) -> None:
    bare = _exit_status(script)
    if bare == 0:
        pytest.skip("this Python and torch do not abort a thread left inside torch at exit: nothing to show")
    assert bare in (-signal.SIGABRT, -signal.SIGSEGV), f"the reproduction crashes without the plugin, not {bare}"


def test_exit_waits_for_the_batch_thread():
    """fairseq-train ending at --max-update leaves fairseq's batch thread mid-epoch; the process must still exit 0."""
    _crashes_without_the_plugin(_EXIT_WHILE_MAKING_BATCHES)
    assert _exit_status(_EXIT_WHILE_MAKING_BATCHES, "plugin") == 0


# fairseq's group of all ranks, with a gloo worker thread still busy with a finished collective when the script
# ends (a callback on its result that sleeps, as a thread the loaded machine has not run again yet); the thread
# needs the interpreter once more after that. Run with "plugin", the plugin is imported first.
_EXIT_DURING_A_COLLECTIVE = """
import sys
import time
import torch
import torch.distributed as dist
from fairseq.distributed import utils
if sys.argv[1:] == ["plugin"]:
    import user_dir
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
def train():  # fairseq's trainer and model hold the group in reference cycles
    trainer = {"group": utils.get_global_group()}
    trainer["self"] = trainer
    work = dist.all_reduce(torch.ones(1), group=trainer["group"], async_op=True)
    work.get_future().then(lambda _: time.sleep(1))
train()
print("exits")
"""


def test_exit_joins_the_process_groups_threads():
    """fairseq never destroys its process groups, so gloo's worker threads live into the interpreter's shutdown,
    where one that still needs the interpreter aborts the process (a rank of a finished two-process training,
    now and then, on a loaded machine)."""
    _crashes_without_the_plugin(_EXIT_DURING_A_COLLECTIVE)
    assert _exit_status(_EXIT_DURING_A_COLLECTIVE, "plugin") == 0


def test_cudnn_attention_is_off():
    """cuDNN attention builds a graph per batch shape; fairseq's batches come in many (fix 10)."""
    assert not torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fairseq_attention_on_cuda_runs_without_cudnn():
    from fairseq.modules import MultiheadAttention

    attention = MultiheadAttention(256, 4, self_attention=True).cuda().bfloat16()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for length in (7, 9):  # a new shape each call, as fairseq's batches
            x = torch.randn(length, 3, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            attention(x, x, x, need_weights=False)[0].sum().backward()  # as fairseq trains: through SDPA
    names = {event.key for event in profiler.key_averages()}
    assert any("flash_attention" in name or "efficient_attention" in name for name in names), sorted(names)
    assert not any("cudnn_attention" in name for name in names), sorted(names)


class _Task:
    def __init__(self, dictionary):
        self.target_dictionary = self.source_dictionary = dictionary


class _LogitsModel(torch.nn.Module):
    """Stands in for a decoder: returns the given logits; fairseq criterions only call these two."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits
        self.decoder = torch.nn.Module()
        self.decoder.cosine_scale = 10.0

    def forward(self, **net_input):
        return (self.logits,)

    def get_targets(self, sample, net_output):
        return sample["target"]


CRITERION_ARGS = {
    "sparse_softmax": dict(sparse_topk=4, label_smoothing=0.1, sparse_warmup_ratio=0.0, max_update=0),
    "as_softmax": dict(as_delta=0.3, as_warmup_ratio=0.0, max_update=0),
    "temperature_softmax": dict(softmax_temperature=0.8),
    "soft_margin_softmax": dict(softmax_margin=0.3),
    "am_softmax": dict(softmax_margin=0.2),
    "taylor_softmax": dict(taylor_order=2, taylor_gradient="exact"),
    "sm_taylor_softmax": dict(taylor_order=2, softmax_margin=0.2),
    "sparsemax": {},
    "entmax15": {},
}


@pytest.mark.parametrize("name", sorted(CRITERION_ARGS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_criterion_on_half_precision_logits(name, dtype):
    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    cfg = CRITERION_DATACLASS_REGISTRY[name](sentence_avg=False, **CRITERION_ARGS[name])
    criterion = CRITERION_REGISTRY[name].build_criterion(cfg, _Task(d))
    g = torch.Generator().manual_seed(0)
    logits = torch.tanh(torch.randn(2, 5, len(d), generator=g))
    target = torch.randint(4, len(d), (2, 5), generator=g)
    target[1, 3:] = d.pad()
    sample = {"net_input": {}, "target": target, "ntokens": int((target != d.pad()).sum())}

    half = logits.to(dtype).requires_grad_(True)
    loss, sample_size, log = criterion(_LogitsModel(half), sample)
    single = half.detach().float().requires_grad_(True)  # the same values, in float32
    reference, _, ref_log = criterion(_LogitsModel(single), sample)
    assert loss.dtype == torch.float32 and sample_size == 8
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log["nll_loss"], ref_log["nll_loss"], rtol=1e-5, atol=1e-5)
    loss.backward()
    reference.backward()
    assert half.grad.dtype == dtype
    # computed in float32 and rounded to the logits' dtype: within one rounding of the float32 gradient (autograd
    # through sparse_softmax's top k rounds the target's two terms apart when it is among the top k)
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(half.grad.float(), single.grad, rtol=ulp, atol=ulp * single.grad.abs().max())
    assert half.grad[1, 3:].abs().sum() == 0, "padding positions get no gradient"


@pytest.mark.parametrize("length", [5, 40])
def test_sparse_softmax_logs_the_flat_slope_of_counted_rows(length):
    """``flat_slope`` is mean(top k) - target logit over the counted rows (all of them up to 256, then 256 evenly
    spaced ones), by brute force over each row's sorted logits; padding rows are never among them."""
    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    cfg = CRITERION_DATACLASS_REGISTRY["sparse_softmax"](sentence_avg=False, **CRITERION_ARGS["sparse_softmax"])
    criterion = CRITERION_REGISTRY["sparse_softmax"].build_criterion(cfg, _Task(d))
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, length, len(d), generator=g, dtype=torch.float64)
    target = torch.randint(4, len(d), (8, length), generator=g)
    target[1, 3:] = d.pad()
    logits[1, 3:] = 1e6  # padding rows: they would dominate any mean they entered
    sample = {"net_input": {}, "target": target, "ntokens": int((target != d.pad()).sum())}
    _, _, log = criterion(_LogitsModel(logits), sample)

    rows, targets = logits.reshape(-1, len(d)), target.reshape(-1)
    counted = [i for i in range(len(targets)) if targets[i] != d.pad()]
    sampled = counted if len(counted) <= 256 else counted[:: len(counted) // 256][:256]
    k = CRITERION_ARGS["sparse_softmax"]["sparse_topk"]
    slopes = [sum(sorted(rows[i].tolist(), reverse=True)[:k]) / k - rows[i, targets[i]].item() for i in sampled]
    assert int(log["n_slope_rows"]) == len(sampled) == min(len(counted), 256)
    assert float(log["flat_slope_sum"]) == pytest.approx(sum(slopes))
