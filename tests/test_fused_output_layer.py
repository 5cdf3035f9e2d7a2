"""fused_output_loss against the unfused losses on F.linear(hidden, weight, bias): loss, plain nll,
masked and dense counts and the gradients of hidden, weight and bias; gradcheck in float64; blocks
that do not divide the rows; AS rows of all three kinds in one batch; tied weights; half precision;
no N×V buffer."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import sparse_softmax.losses as L
from sparse_softmax.losses import fused_output_loss, output_layer
from sparse_softmax.losses.dispatch import Tiles

IGNORE = -100
OPTIONS = {
    "cross_entropy": dict(label_smoothing=0.1),
    "sparse_softmax": dict(k=4, label_smoothing=0.1),
    "as_softmax": dict(delta=0.2),
}


def unfused(logits, target, loss, reduction, options):
    """The loss the fused layer must equal, on the logits, as a LossResult."""
    if loss == "as_softmax":
        return L.as_softmax(logits, target, options["delta"], IGNORE, reduction)
    if loss == "sparse_softmax":
        value = L.sparse_softmax_loss(logits, target, options["k"], IGNORE, reduction, options["label_smoothing"])
    else:
        value = L.softmax_loss(logits, target, IGNORE, reduction, options["label_smoothing"])
    nll = L.softmax_loss(logits.detach(), target, IGNORE, reduction)
    counted = int((target != IGNORE).sum())
    counts = [torch.tensor(n, device=target.device) for n in (0, counted if loss == "cross_entropy" else 0)]
    return L.LossResult(value, nll, *counts)


#: Blocks of a few rows (7 of V = 97, or as many as the features have dimensions), scored in parts of 3 rows, so
#: the cases cross block and part boundaries, and no block size divides the rows.
SMALL = Tiles(fused_elements=7 * 97, scored_elements=3 * 97)


def as_mix(n: int, h: int, v: int, dtype=torch.float64, seed: int = 0, device="cpu"):
    """Features whose AS rows are of every kind at δ = 0.2: dense (random, p_t small), masked (the
    target's weight row scaled up: p_t near 1) and sparse (target and one other class near 1/2 each).
    Drawn on the CPU (the same numbers on every device), then moved to ``device``."""
    g = torch.Generator().manual_seed(seed)
    weight = F.normalize(torch.randn(v, h, generator=g, dtype=dtype), dim=-1)  # equal norms: equal logits below
    target = torch.randint(0, v, (n,), generator=g)
    hidden = torch.randn(n, h, generator=g, dtype=dtype) * 0.5
    other = (target + 1 + torch.randint(0, v - 1, (n,), generator=g)) % v
    kind = torch.arange(n) % 3  # 0 dense, 1 masked, 2 sparse
    hidden[kind == 1] = 60 * weight[target[kind == 1]]
    hidden[kind == 2] = 60 * (weight[target[kind == 2]] + weight[other[kind == 2]])
    target[5] = IGNORE
    return hidden.to(device), weight.to(device), target.to(device)


def capped(logits, softcap):
    """Gemma 2's final soft-cap, as its model applies it."""
    return logits if softcap is None else torch.tanh(logits / softcap) * softcap


def compare(hidden, weight, bias, target, loss, reduction, options, rtol=1e-7, atol=1e-9, softcap=None):
    """Run both and compare everything; returns the fused result."""
    inputs = [x.detach().clone().requires_grad_(True) for x in (hidden, weight) + ((bias,) if bias is not None else ())]
    reference = [x.detach().clone().requires_grad_(True) for x in inputs]
    got = fused_output_loss(inputs[0], inputs[1], target, loss, bias=inputs[2] if bias is not None else None,
                            softcap=softcap, ignore_index=IGNORE, reduction=reduction, tiles=SMALL, **options)
    want = unfused(capped(F.linear(*reference), softcap), target, loss, reduction, options)
    for name in ("loss", "nll", "n_masked", "n_dense"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=rtol, atol=atol, msg=name)
    upstream = torch.linspace(0.5, 1.5, target.numel(), dtype=got.loss.dtype, device=target.device) if reduction == "none" else 1.3
    (got.loss * upstream).sum().backward()
    (want.loss * upstream).sum().backward()
    for name, a, b in zip(("hidden", "weight", "bias"), inputs, reference):
        torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol, msg=f"gradient of {name}")
    return got


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
@pytest.mark.parametrize("loss", sorted(OPTIONS))
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_the_unfused_loss_in_float64(loss, reduction, with_bias, device):
    hidden, weight, target = as_mix(n=40, h=32, v=97, device=device)
    bias = torch.randn(97, dtype=torch.float64).to(device) if with_bias else None
    got = compare(hidden, weight, bias, target, loss, reduction, OPTIONS[loss])
    if loss == "as_softmax":
        assert 0 < int(got.n_masked) and 0 < int(got.n_dense) < 39, "the batch mixes masked, sparse and dense rows"


@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("loss", sorted(OPTIONS))
def test_a_soft_cap_matches_the_unfused_loss_on_capped_logits(loss, reduction, device):
    """Gemma 2's ``cap·tanh(z / cap)`` inside the fused layer: a cap of 8 bends the logits of ``as_mix`` (up to
    about 60), so the loss differs from the uncapped one, and every result and gradient is the unfused loss's on the
    capped logits."""
    hidden, weight, target = as_mix(n=40, h=32, v=97, device=device)
    bias = torch.randn(97, dtype=torch.float64).to(device)
    got = compare(hidden, weight, bias, target, loss, reduction, OPTIONS[loss], softcap=8.0)
    plain = fused_output_loss(hidden, weight, target, loss, bias=bias, ignore_index=IGNORE, reduction=reduction,
                              tiles=SMALL, **OPTIONS[loss])
    assert not torch.allclose(got.loss, plain.loss), "the cap changes the loss"


def test_as_rows_of_each_kind_take_their_own_path_and_agree(device):
    """With 97 classes a row keeping at most 6 takes the sparse path: the sparse rows of ``as_mix`` keep 2."""
    hidden, weight, target = as_mix(n=60, h=32, v=97, seed=3, device=device)
    z = F.linear(hidden, weight)
    kept = [(z[i].softmax(-1) >= z[i].softmax(-1)[target[i]] - 0.2).sum().item() for i in range(60) if target[i] >= 0]
    assert {1, 2, 97} <= set(kept), "masked (1), sparse (2) and dense (97) rows are all there"
    compare(hidden, weight, None, target, "as_softmax", "sum", {"delta": 0.2})


def test_sparse_softmax_targets_inside_and_outside_the_top_k_and_ties(device):
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(31, 8, generator=g, dtype=torch.float64).to(device)
    weight[7] = weight[3]  # two classes with equal logits in every row
    hidden = torch.randn(50, 8, generator=g, dtype=torch.float64).to(device)
    z = F.linear(hidden, weight)
    rows = torch.arange(50, device=device)
    target = z.argsort(dim=-1, descending=True)[rows, rows % 8]  # rank 0..7: in and out
    target[::9] = 3  # the tied class itself
    got = fused_output_loss(hidden, weight, target, "sparse_softmax", k=4, tiles=SMALL)
    torch.testing.assert_close(got.loss, L.sparse_softmax_loss(z, target, 4))
    # Which of two tied classes the top k takes may differ; the loss and dL/dh cannot, and their weight rows'
    # gradients together neither.
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    fused_output_loss(h1, w1, target, "sparse_softmax", k=4, tiles=SMALL).loss.backward()
    L.sparse_softmax_loss(F.linear(h2, w2), target, 4).backward()
    torch.testing.assert_close(h1.grad, h2.grad)
    merged = [w.grad.clone() for w in (w1, w2)]
    for m in merged:
        m[3] += m[7]
        m[7] = 0
    torch.testing.assert_close(merged[0], merged[1])


def test_tied_weights_get_both_gradients(device):
    """An output layer tied to the input embeddings: the weight's gradient sums both uses."""
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 53, (30,), generator=g).to(device)
    target = torch.randint(0, 53, (30,), generator=g).to(device)
    target[:3] = IGNORE
    mix = torch.randn(16, 16, generator=g, dtype=torch.float64).to(device)
    grads = []
    for fused in (True, False):
        emb = torch.randn(53, 16, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
        emb = emb.to(device).requires_grad_(True)
        hidden = torch.tanh(emb[tokens] @ mix)
        if fused:
            fused_output_loss(hidden, emb, target, "as_softmax", delta=0.05, ignore_index=IGNORE,
                              tiles=SMALL).loss.backward()
        else:
            L.as_softmax_loss(F.linear(hidden, emb), target, 0.05, ignore_index=IGNORE).backward()
        grads.append(emb.grad)
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("loss", sorted(OPTIONS))
def test_gradcheck(loss, reduction, softcap, device):
    hidden, weight, target = as_mix(n=9, h=4, v=11, seed=7, device=device)
    hidden = hidden / 8  # moderate logits: every AS row kind, no kept/dropped decision on a knife's edge
    bias = torch.randn(11, dtype=torch.float64).to(device)
    options = {**OPTIONS[loss], "k": 3} if loss == "sparse_softmax" else OPTIONS[loss]

    def fn(h, w, b):
        return fused_output_loss(h, w, target, loss, bias=b, softcap=softcap, ignore_index=IGNORE,
                                 reduction=reduction, tiles=SMALL, **options).loss

    inputs = tuple(x.clone().requires_grad_(True) for x in (hidden, weight, bias))
    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("loss", sorted(OPTIONS))
def test_half_precision_inputs(loss, dtype, device):
    """Logits in the inputs' dtype (as the layer computes them), scored in float32; gradients come back
    in the inputs' dtype, within two roundings of that dtype of the exact gradient (float64, from the
    same half-precision logits), as the unfused path's. (The dense products run in the inputs' dtype,
    as autograd's do, one per block, summed in float32.)"""
    hidden, weight, target = as_mix(n=30, h=16, v=97, dtype=torch.float32, seed=8, device=device)
    hidden, weight = hidden.to(dtype).requires_grad_(True), weight.to(dtype).requires_grad_(True)
    if loss == "sparse_softmax":  # half logits tie often; a tie at the k-th makes either class a top k: not compared
        top = F.linear(hidden, weight).float().topk(OPTIONS[loss]["k"] + 1, dim=1).values
        target = torch.where(top[:, -1] == top[:, -2], IGNORE, target)
    got = fused_output_loss(hidden, weight, target, loss, ignore_index=IGNORE, tiles=SMALL, **OPTIONS[loss])
    assert got.loss.dtype == torch.float32
    h2, w2 = hidden.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
    want = unfused(F.linear(h2, w2), target, loss, "sum", OPTIONS[loss])
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.nll, want.nll, rtol=1e-5, atol=1e-4)
    got.loss.backward()
    want.loss.backward()
    assert hidden.grad.dtype == weight.grad.dtype == dtype
    logits = F.linear(hidden.detach(), weight.detach()).double().requires_grad_(True)
    (grad,) = torch.autograd.grad(unfused(logits, target, loss, "sum", OPTIONS[loss]).loss, logits)
    exact = {"hidden": grad @ weight.detach().double(), "weight": grad.t() @ hidden.detach().double()}
    for name, fused_grad, unfused_grad in (("hidden", hidden.grad, h2.grad), ("weight", weight.grad, w2.grad)):
        bound = 2 * torch.finfo(dtype).eps * exact[name].abs().max()
        for path, grad in (("fused", fused_grad), ("unfused", unfused_grad)):
            error = (grad.double() - exact[name]).abs().max()
            assert error <= bound, f"{path} gradient of {name}: error {error:.3g} > {bound:.3g}"


class Allocations(TorchDispatchMode):
    """What ops do to memory while active (forward and backward alike): the largest tensor storage any op
    returns (an ``out=`` tensor an op resized too), and the tensors ops create, as (dtype, shape): those with
    storage of their own, so neither a view of a tensor an op was given nor one it wrote into (in place,
    ``out=``)."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.made: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *(t.untyped_storage().nbytes() for t in tensors)])
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                 if isinstance(t, torch.Tensor)}
        self.made += [(t.dtype, tuple(t.shape)) for t in tensors if t.untyped_storage().data_ptr() not in given]
        return out


@pytest.mark.parametrize("loss", sorted(OPTIONS))
def test_no_buffer_of_all_the_logits_is_ever_made(loss):
    tiles = Tiles(fused_elements=64 * 500, scored_elements=3 * 97)  # blocks of 64 of the 1000 rows
    hidden, weight, target = as_mix(n=1000, h=8, v=500, dtype=torch.float32, seed=9)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    with Allocations() as tracker:
        fused_output_loss(hidden, weight, target, loss, ignore_index=IGNORE, tiles=tiles,
                          **OPTIONS[loss]).loss.backward()
    assert tracker.largest <= 64 * 500 * 4, f"{tracker.largest} bytes: more than one block of logits"
    with Allocations() as tracker:
        unfused(F.linear(hidden, weight), target, loss, "sum", OPTIONS[loss]).loss.backward()
    assert tracker.largest >= 1000 * 500 * 4, "the check can see an N×V buffer"


@pytest.mark.parametrize("loss", ["cross_entropy", "as_softmax"])
def test_half_precision_weight_gradient_is_summed_where_it_lies(loss):
    """Half inputs: each block's weight-gradient product (in the inputs' dtype) is added to the one float32
    V×H sum as it is read, not first copied to float32: a copy a block would move more bytes than the
    product itself on a GPU."""
    hidden, weight, target = as_mix(n=1000, h=8, v=500, dtype=torch.float32, seed=9)
    with Allocations() as tracker:
        fused_output_loss(hidden.bfloat16(), weight.bfloat16().requires_grad_(True), target, loss,
                          ignore_index=IGNORE, tiles=Tiles(fused_elements=64 * 500), **OPTIONS[loss])  # 16 blocks  # "sum": the gradients come in the forward
    sums = [made for made in tracker.made if made == (torch.float32, (500, 8))]
    assert len(sums) == 1, f"{len(sums)} float32 V×H tensors made"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("loss", ["cross_entropy", "as_softmax"])
def test_half_precision_weight_gradient_is_added_by_the_product_on_cuda(loss):
    """On CUDA, with a torch whose ``addmm`` takes ``out_dtype``, cuBLAS adds each block's half-precision
    weight-gradient product to the float32 sum as it writes it: no V×H tensor but that sum is ever made."""
    hidden, weight, target = as_mix(n=1000, h=8, v=500, dtype=torch.float32, seed=9, device="cuda")
    hidden, weight = hidden.bfloat16(), weight.bfloat16().requires_grad_(True)
    with Allocations() as tracker:
        fused_output_loss(hidden, weight, target, loss, ignore_index=IGNORE, tiles=Tiles(fused_elements=64 * 500),
                          **OPTIONS[loss])  # 16 blocks of the 1000 rows
    if not output_layer.mixed_addmm("cuda"):
        pytest.skip(f"torch {torch.__version__}'s addmm does not add a bf16 product to a float32 sum")
    sums = [made for made in tracker.made if made[1] == (500, 8)]
    assert sums == [(torch.float32, (500, 8))], f"V×H tensors made: {sums}"


@pytest.mark.parametrize("call, message", [
    (lambda h, w, t: fused_output_loss(h, w, t, "sparsemax"), "loss must be one of"),
    (lambda h, w, t: fused_output_loss(h, w[:, :3], t, "cross_entropy"), "hidden must be"),
    (lambda h, w, t: fused_output_loss(h, w.float(), t, "cross_entropy"), "share one floating-point dtype"),
    (lambda h, w, t: fused_output_loss(h, w, t, "cross_entropy", bias=torch.zeros(3, dtype=w.dtype)), "bias must be"),
    (lambda h, w, t: fused_output_loss(h, w, t[:-1], "cross_entropy"), "target must have shape"),
    (lambda h, w, t: fused_output_loss(h, w, t + 100, "cross_entropy"), "outside"),
    (lambda h, w, t: fused_output_loss(h, w, t, "sparse_softmax", k=0), "k must be in"),
    (lambda h, w, t: fused_output_loss(h, w, t, "as_softmax", delta=1.5), "delta must be in"),
    (lambda h, w, t: fused_output_loss(h, w, t, "as_softmax", label_smoothing=0.1), "no label_smoothing"),
    (lambda h, w, t: fused_output_loss(h, w, t, "cross_entropy", reduction="avg"), "reduction"),
    (lambda h, w, t: fused_output_loss(h, w, t, "cross_entropy", impl="cuda"), "impl must be one of"),
    (lambda h, w, t: fused_output_loss(h, w, t, "cross_entropy", softcap=0.0), "softcap must be > 0 or None"),
    (lambda h, w, t: fused_output_loss(h, w, t, "sparse_softmax", softcap=30.0, impl="triton"),
     "no kernel computes soft-capped logits"),
    (lambda h, w, t: fused_output_loss(h, w, t, "cross_entropy", label_smoothing=0.1, impl="triton"),
     "impl='triton' cannot run here: no kernel computes cross_entropy with label_smoothing"),
])
def test_bad_input_raises_clear_value_error(call, message):
    hidden, weight, target = as_mix(n=10, h=4, v=20)
    target[5] = 0
    with pytest.raises(ValueError, match=message):
        call(hidden, weight, target)
