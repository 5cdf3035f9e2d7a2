"""Every loss against an explicit-loop reference in float64, plus gradcheck and input validation."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sparse_softmax import diagnostics as D
from sparse_softmax import losses as L

IGNORE = 1  # fairseq's padding index: also a legal class, so ignoring must not depend on its value


def _rand(n=12, v=9, seed=0, dtype=torch.float64, scale=3.0, device="cpu"):
    """Logits and targets drawn on the CPU (the same numbers on every device), then moved to ``device``."""
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, v, generator=g, dtype=torch.float64) * scale).to(device, dtype)
    t = torch.randint(0, v, (n,), generator=g).to(device)
    return z, t


def _reduce(rows, valid, reduction, device):
    rows = torch.tensor(rows, dtype=torch.float64, device=device)
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / sum(valid)


# ----- explicit references: one row, one class at a time, plain Python math -----

def ref_sparse_row(z, t, k, eps=0.0):
    vals = sorted(z.tolist(), reverse=True)[:k]
    lse = math.log(sum(math.exp(x) for x in vals))
    return (1 - eps) * (lse - z[t].item()) + eps * (lse - sum(vals) / k)


def ref_as_row(z, t, delta):
    zs = z.tolist()
    big = max(zs)
    e = [math.exp(x - big) for x in zs]
    p = [x / sum(e) for x in e]
    kept = [i for i in range(len(zs)) if i == t or not (p[t] - p[i] > delta)]
    loss = -math.log(math.exp(zs[t]) / sum(math.exp(zs[i]) for i in kept))
    return (0.0 if kept == [t] else loss), kept == [t]


def ref_ce_row(zs, t):
    return math.log(sum(math.exp(x) for x in zs)) - zs[t]


def ref_taylor_f(x, n):
    return sum(x**i / math.factorial(i) for i in range(n + 1))


def ref_multilabel_row(o, y, keep_neg=None, keep_pos=None):
    neg = sum(math.exp(o[i]) for i in range(len(o)) if not y[i] and (keep_neg is None or keep_neg[i]))
    pos = sum(math.exp(-o[i]) for i in range(len(o)) if y[i] and (keep_pos is None or keep_pos[i]))
    return math.log(1 + neg) + math.log(1 + pos)


def ref_as_multilabel_row(o, y, delta):
    e = [math.exp(x) for x in o]
    p = [x / sum(e) for x in e]
    pos = [p[i] for i in range(len(o)) if y[i]]
    neg = [p[i] for i in range(len(o)) if not y[i]]
    min_pos = min(pos) if pos else math.inf
    max_neg = max(neg) if neg else -math.inf
    keep_neg = [min_pos - p[i] <= delta for i in range(len(o))]
    keep_pos = [p[i] - max_neg <= delta for i in range(len(o))]
    kept_any = any((not y[i] and keep_neg[i]) or (y[i] and keep_pos[i]) for i in range(len(o)))
    return ref_multilabel_row(o, y, keep_neg, keep_pos), not kept_any


# ----- sparse softmax -----

@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
@pytest.mark.parametrize("k", [1, 3, 9])
def test_sparse_softmax_matches_reference(k, reduction, device):
    z, t = _rand(device=device)
    t[2] = IGNORE
    t[5] = IGNORE
    valid = [int(x) != IGNORE for x in t]
    got = L.sparse_softmax_loss(z, t, k, ignore_index=IGNORE, reduction=reduction)
    rows = [ref_sparse_row(z[i], int(t[i]), k) if valid[i] else 0.0 for i in range(len(t))]
    torch.testing.assert_close(got, _reduce(rows, valid, reduction, z.device))


def test_sparse_softmax_target_outside_topk_is_not_added():
    z = torch.tensor([[5.0, 4.0, 3.0, -2.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([3])
    loss = L.sparse_softmax_loss(z, t, k=2)
    lse2 = math.log(math.exp(5) + math.exp(4))
    assert loss.item() == pytest.approx(lse2 + 2.0)
    loss.backward()
    p = [math.exp(5 - lse2), math.exp(4 - lse2)]
    torch.testing.assert_close(z.grad, torch.tensor([[p[0], p[1], 0.0, -1.0]], dtype=torch.float64))


def test_sparse_softmax_target_inside_topk_gradient():
    z = torch.tensor([[5.0, 4.0, 3.0, -2.0]], dtype=torch.float64, requires_grad=True)
    L.sparse_softmax_loss(z, torch.tensor([1]), k=2).backward()
    lse2 = math.log(math.exp(5) + math.exp(4))
    expect = [math.exp(5 - lse2), math.exp(4 - lse2) - 1, 0.0, 0.0]
    torch.testing.assert_close(z.grad, torch.tensor([expect], dtype=torch.float64))


def test_sparse_softmax_ties_and_full_k_equals_ce():
    z = torch.tensor([[2.0, 2.0, 2.0, 0.0], [1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    t = torch.tensor([3, 2])
    got = L.sparse_softmax_loss(z, t, k=2, reduction="none")
    expect = [ref_sparse_row(z[i], int(t[i]), 2) for i in range(2)]
    torch.testing.assert_close(got, torch.tensor(expect, dtype=torch.float64, device=z.device))
    torch.testing.assert_close(L.sparse_softmax_loss(z, t, k=4), F.cross_entropy(z, t, reduction="sum"))


def test_sparse_softmax_label_smoothing_reference(device):
    z, t = _rand(seed=3, device=device)
    got = L.sparse_softmax_loss(z, t, 4, reduction="none", label_smoothing=0.1)
    expect = [ref_sparse_row(z[i], int(t[i]), 4, eps=0.1) for i in range(len(t))]
    torch.testing.assert_close(got, torch.tensor(expect, dtype=torch.float64, device=z.device))


def test_scale_profile_is_the_loss_of_scaled_logits():
    """The profile's loss at each scale is sparse_softmax_loss of the logits times that scale (log k at 0), its
    flat slope the loss's derivative there (a forward difference at a small scale; ``flat_slope`` alone gives the
    same), the rank the count of classes above the target; ignored rows are left out."""
    z, t = _rand(n=20, v=11, seed=5)
    t[3] = IGNORE
    t[7] = z[7].argmax()  # one target that is the argmax (rank 0)
    k, scales = 4, torch.tensor([0.0, 1e-6, 0.5, 1.0, 2.5], dtype=torch.float64)
    got = D.scale_profile(z, t, k, scales, ignore_index=IGNORE)
    valid = t != IGNORE
    for j, s in enumerate(scales.tolist()):
        expect = L.sparse_softmax_loss(s * z, t, k, ignore_index=IGNORE, reduction="none")[valid]
        torch.testing.assert_close(got.loss[:, j], expect if s > 0 else torch.full_like(expect, math.log(k)))
    torch.testing.assert_close(got.flat_slope, (got.loss[:, 1] - got.loss[:, 0]) / 1e-6, rtol=1e-4, atol=1e-4)
    ranks = [sum(x > z[i, t[i]].item() for x in z[i].tolist()) for i in range(len(t)) if valid[i]]
    assert got.rank.tolist() == ranks and 0 in ranks
    torch.testing.assert_close(D.flat_slope(z, t, k, ignore_index=IGNORE), got.flat_slope, rtol=0, atol=0)


def test_handover_warning_when_flat_logits_beat_the_model():
    """Silent for a model that scores below log k on the Sparse-softmax loss; for one above it, a line with its
    loss in bits and its flat slope, each checked against the explicit-loop reference."""
    z = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]], dtype=torch.float64).repeat(3, 1)
    assert D.handover_warning(z, torch.tensor([0, 0, 1]), 3, update=7) is None
    assert D.handover_warning(torch.zeros(2, 5, dtype=torch.float64), torch.tensor([0, 4]), 3, update=7) is None, "flat"
    target = torch.tensor([4, 3, 0])
    message = D.handover_warning(z, target, 3, update=7)
    bits = sum(ref_sparse_row(z[i], int(target[i]), 3) for i in range(3)) / 3 / math.log(2)
    slope = ((3.0 - 0.0) + (3.0 - 1.0) + (3.0 - 4.0)) / 3
    assert bits > math.log2(3)
    assert f"at update 7 a model that scores {bits:.2f} bits" in message and f"flat_slope {slope:+.2f}" in message
    assert "log2 3 = 1.58" in message and "\n" not in message


def test_scale_profile_flat_slope_sign_tells_where_the_loss_is_lowest():
    """Targets that beat the mean of the top k (slope < 0): the loss dips below log k at some scale; targets
    outside the top k (slope > 0): it only rises from log k."""
    z = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]], dtype=torch.float64).repeat(2, 1)
    scales = torch.linspace(0, 3, 31, dtype=torch.float64)
    got = D.scale_profile(z, torch.tensor([0, 4]), 3, scales)
    assert got.flat_slope.tolist() == [-1.0, 3.0]
    assert got.loss[0].min() < math.log(3) - 0.5 and bool((got.loss[1] >= math.log(3)).all())


# ----- AS-Softmax -----

@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
@pytest.mark.parametrize("delta", [0.0, 0.05, 0.3, 1.0])
def test_as_softmax_matches_reference(delta, reduction, device):
    z, t = _rand(n=40, v=7, seed=1, scale=4.0, device=device)
    t[0] = IGNORE
    valid = [int(x) != IGNORE for x in t]
    out = L.as_softmax(z, t, delta, ignore_index=IGNORE, reduction=reduction)
    ref = [ref_as_row(z[i], int(t[i]), delta) if valid[i] else (0.0, False) for i in range(len(t))]
    torch.testing.assert_close(out.loss, _reduce([r[0] for r in ref], valid, reduction, z.device))
    torch.testing.assert_close(L.as_softmax_loss(z, t, delta, ignore_index=IGNORE, reduction=reduction), out.loss)
    assert int(out.n_masked) == sum(r[1] for r in ref)
    p = z.softmax(-1)
    every_class_kept = [bool(((p[i, t[i]] - p[i]) <= delta).all()) for i in range(len(t)) if valid[i]]
    assert int(out.n_dense) == sum(every_class_kept)
    if delta < 1.0:
        assert 0 < int(out.n_masked) < len(t), "the case must mix masked and unmasked rows"


def test_as_softmax_delta_one_is_cross_entropy_and_nll_is_plain_ce(device):
    z, t = _rand(n=30, v=11, seed=2, device=device)
    t[4] = -100
    out = L.as_softmax(z, t, 1.0, ignore_index=-100)
    ce = F.cross_entropy(z, t, ignore_index=-100, reduction="sum")
    torch.testing.assert_close(out.loss, ce)
    assert int(out.n_masked) == 0
    torch.testing.assert_close(L.as_softmax(z, t, 0.1, ignore_index=-100).nll, ce)


def test_as_softmax_masked_row_has_zero_loss_and_gradient():
    z = torch.tensor([[10.0, 0.0, 0.0], [0.0, 0.1, 0.2]], dtype=torch.float64, requires_grad=True)
    out = L.as_softmax(z, torch.tensor([0, 2]), 0.5)
    assert int(out.n_masked) == 1 and int(out.n_dense) == 1
    out.loss.backward()
    assert torch.equal(z.grad[0], torch.zeros(3, dtype=torch.float64))
    assert z.grad[1].abs().sum() > 0


def test_as_softmax_strict_inequality_on_ties():
    # p = (0.5, 0.25, 0.25): p_t - p_1 = 0.25 exactly representable; δ = 0.25 keeps class 1.
    z = torch.log(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64))
    t = torch.tensor([0])
    assert L.as_softmax_loss(z, t, 0.25).item() == pytest.approx(-math.log(0.5))
    assert L.as_softmax_loss(z, t, 0.2499).item() == 0.0


def test_as_softmax_gradient_matches_reference_formula(device):
    z, t = _rand(n=25, v=6, seed=4, device=device)
    z.requires_grad_(True)
    L.as_softmax_loss(z, t, 0.2).backward()
    expect = torch.zeros_like(z)
    with torch.no_grad():
        p = z.softmax(-1)
        for i in range(z.shape[0]):
            keep = (p[i, t[i]] - p[i]) <= 0.2
            kept = torch.where(keep, z[i], torch.tensor(float("-inf"), dtype=z.dtype)).softmax(-1)
            expect[i] = kept
            expect[i, t[i]] -= 1
    torch.testing.assert_close(z.grad, expect)


def test_as_softmax_chunking_is_invisible(device):
    z, t = _rand(n=300, v=5000, seed=5, dtype=torch.float32, device=device)  # many rows per chunk boundary
    rows = L.as_softmax_loss(z, t, 0.01, reduction="none")
    whole = torch.stack([L.as_softmax_loss(z[i : i + 1], t[i : i + 1], 0.01) for i in range(len(t))])
    torch.testing.assert_close(rows, whole)


# ----- multi-label -----

def _multilabel_case(n=16, v=7, seed=6, device="cpu"):
    z, _ = _rand(n, v, seed, device=device)
    g = torch.Generator().manual_seed(seed + 100)
    y = torch.rand(n, v, generator=g) < 0.3
    y[0] = False  # no positive label
    y[1] = True  # no negative label
    return z, y.to(device)


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_multilabel_ce_reference(reduction, device):
    z, y = _multilabel_case(device=device)
    rows = [ref_multilabel_row(z[i].tolist(), y[i].tolist()) for i in range(len(z))]
    got = L.multilabel_categorical_crossentropy(z, y.long(), reduction=reduction)
    torch.testing.assert_close(got, _reduce(rows, [True] * len(z), reduction, z.device))


@pytest.mark.parametrize("delta", [0.0, 0.1, 0.4, 1.0])
def test_as_multilabel_reference(delta, device):
    z, y = _multilabel_case(seed=7, device=device)
    ref = [ref_as_multilabel_row(z[i].tolist(), y[i].tolist(), delta) for i in range(len(z))]
    loss, n_masked = L.as_multilabel_loss(z, y, delta, reduction="none", return_masked=True)
    torch.testing.assert_close(loss, torch.tensor([r[0] for r in ref], dtype=torch.float64, device=z.device))
    assert int(n_masked) == sum(r[1] for r in ref)
    assert ref[0][1], "a row without positives keeps no negative"


def test_as_multilabel_delta_one_keeps_everything_with_both_kinds(device):
    z, y = _multilabel_case(seed=8, device=device)
    both = y.any(1) & (~y).any(1)
    torch.testing.assert_close(
        L.as_multilabel_loss(z[both], y[both], 1.0), L.multilabel_categorical_crossentropy(z[both], y[both])
    )


def test_multilabel_no_overflow_in_half_precision():
    """The negative class at 60,000 and the positive at -60,000: log(1 + e^60000) twice, 120,000, where the
    reference code's plain exponentials overflow."""
    z = torch.tensor([[60000.0, -60000.0]], dtype=torch.float16)
    y = torch.tensor([[0, 1]])
    assert float(L.multilabel_categorical_crossentropy(z, y)) == pytest.approx(120000.0, rel=1e-6)


# ----- baselines -----

@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_softmax_reference_with_label_smoothing(eps, device):
    z, t = _rand(seed=8, device=device)
    t[2] = IGNORE

    def row(zs, target):  # (1 - eps) CE + eps * mean_i(-log p_i)
        lse = math.log(sum(math.exp(x) for x in zs))
        return (1 - eps) * (lse - zs[target]) + eps * sum(lse - x for x in zs) / len(zs)

    rows = [row(z[i].tolist(), int(t[i])) if int(t[i]) != IGNORE else 0.0 for i in range(len(t))]
    got = L.softmax_loss(z, t, ignore_index=IGNORE, reduction="none", label_smoothing=eps)
    torch.testing.assert_close(got, torch.tensor(rows, dtype=torch.float64, device=z.device))


def test_temperature_reference(device):
    z, t = _rand(seed=9, device=device)
    rows = [ref_ce_row((z[i] / 2.5).tolist(), int(t[i])) for i in range(len(t))]
    torch.testing.assert_close(L.temperature_softmax_loss(z, t, 2.5, reduction="none"), torch.tensor(rows, dtype=torch.float64, device=z.device))


def _ref_margin_row(zs, t, m, s=1.0):
    num = math.exp(s * (zs[t] - m))
    return -math.log(num / (num + sum(math.exp(s * zs[j]) for j in range(len(zs)) if j != t)))


def test_soft_margin_reference(device):
    z, t = _rand(seed=10, device=device)
    t[3] = IGNORE
    rows = [_ref_margin_row(z[i].tolist(), int(t[i]), 0.7) if int(t[i]) != IGNORE else 0.0 for i in range(len(t))]
    got = L.soft_margin_softmax_loss(z, t, 0.7, ignore_index=IGNORE, reduction="none")
    torch.testing.assert_close(got, torch.tensor(rows, dtype=torch.float64, device=z.device))


def test_am_softmax_reference_and_cosine_check(device):
    z, t = _rand(seed=11, device=device)
    cos = torch.tanh(z)
    rows = [_ref_margin_row(cos[i].tolist(), int(t[i]), 0.35, 30.0) for i in range(len(t))]
    torch.testing.assert_close(L.am_softmax_loss(cos, t, 0.35, 30.0, reduction="none"), torch.tensor(rows, dtype=torch.float64, device=z.device))
    with pytest.raises(ValueError, match="cosine"):
        L.am_softmax_loss(z * 10, t)


@pytest.mark.parametrize("order", [2, 4, 6])
def test_taylor_reference(order, device):
    z, t = _rand(seed=12, device=device)
    t[0] = IGNORE
    rows = []
    for i in range(len(t)):
        f = [ref_taylor_f(x, order) for x in z[i].tolist()]
        rows.append(0.0 if int(t[i]) == IGNORE else -math.log(f[int(t[i])] / sum(f)))
    got = L.taylor_softmax_loss(z, t, order, ignore_index=IGNORE, reduction="none")
    torch.testing.assert_close(got, torch.tensor(rows, dtype=torch.float64, device=z.device))


def test_taylor_inf_gradient_is_p_minus_y(device):
    z, t = _rand(seed=13, device=device)
    z.requires_grad_(True)
    exact_value = L.taylor_softmax_loss(z, t, 2)
    inf_value = L.taylor_softmax_loss(z, t, 2, gradient="inf")
    torch.testing.assert_close(inf_value, exact_value)
    inf_value.backward()
    with torch.no_grad():
        f = 1 + z + z * z / 2
        expect = f / f.sum(-1, keepdim=True) - F.one_hot(t, z.shape[1]).double()
    torch.testing.assert_close(z.grad, expect)


def test_sm_taylor_reference(device):
    z, t = _rand(seed=14, device=device)
    m, n = 0.6, 2
    rows = []
    for i in range(len(t)):
        f = [ref_taylor_f(x, n) for x in z[i].tolist()]
        g = f[int(t[i])] / ref_taylor_f(m, n)
        rows.append(-math.log(g / (g + sum(f) - f[int(t[i])])))
    got = L.sm_taylor_softmax_loss(z, t, n, m, reduction="none")
    torch.testing.assert_close(got, torch.tensor(rows, dtype=torch.float64, device=z.device))
    torch.testing.assert_close(L.sm_taylor_softmax_loss(z, t, 2, 0.0), L.taylor_softmax_loss(z, t, 2))


def _ref_sparsemax(zs):
    s = sorted(zs, reverse=True)
    cumsum, tau = 0.0, 0.0
    for k, x in enumerate(s, 1):
        cumsum += x
        if 1 + k * x > cumsum:
            tau = (cumsum - 1) / k
    return [max(x - tau, 0.0) for x in zs]


def test_sparsemax_reference(device):
    z, t = _rand(seed=15, device=device)
    rows = []
    for i in range(len(t)):
        zs = z[i].tolist()
        p = _ref_sparsemax(zs)
        # Fenchel-Young: Ω*(z) - z_t with Ω(p) = (||p||² - 1)/2 (Martins & Astudillo 2016)
        rows.append(sum(pi * zi for pi, zi in zip(p, zs)) - 0.5 * sum(pi * pi for pi in p) + 0.5 - zs[int(t[i])])
    torch.testing.assert_close(L.sparsemax_loss(z, t, reduction="none"), torch.tensor(rows, dtype=torch.float64, device=z.device))


def test_entmax15_reference(device):
    z, t = _rand(seed=16, device=device)
    rows = []
    for i in range(len(t)):
        zs = [x / 2 for x in z[i].tolist()]  # entmax15(z) = [z/2 - τ]_+², Σ = 1; bisection on τ
        lo, hi = max(zs) - 1, max(zs)
        for _ in range(200):
            tau = (lo + hi) / 2
            lo, hi = (tau, hi) if sum(max(x - tau, 0) ** 2 for x in zs) > 1 else (lo, tau)
        p = [max(x - tau, 0) ** 2 for x in zs]
        # Fenchel-Young with Tsallis-1.5: Ω(p) = (Σ p^1.5 - 1)/(1.5·0.5)
        omega = (sum(pi**1.5 for pi in p) - 1) / 0.75
        rows.append(sum(pi * zi for pi, zi in zip(p, z[i].tolist())) - omega - z[i, int(t[i])].item())
    torch.testing.assert_close(L.entmax15_loss(z, t, reduction="none"), torch.tensor(rows, dtype=torch.float64, device=z.device))


# ----- gradcheck (float64) -----

GRADCHECKED = {
    "sparse": lambda z, t: L.sparse_softmax_loss(z, t, 3, ignore_index=IGNORE, label_smoothing=0.1),
    "as_sum": lambda z, t: L.as_softmax_loss(z, t, 0.2, ignore_index=IGNORE),
    "as_mean": lambda z, t: L.as_softmax_loss(z, t, 0.2, ignore_index=IGNORE, reduction="mean"),
    "as_none": lambda z, t: L.as_softmax_loss(z, t, 0.2, ignore_index=IGNORE, reduction="none"),
    "softmax": lambda z, t: L.softmax_loss(z, t, ignore_index=IGNORE, label_smoothing=0.1),
    "temperature": lambda z, t: L.temperature_softmax_loss(z, t, 0.7, ignore_index=IGNORE),
    "soft_margin": lambda z, t: L.soft_margin_softmax_loss(z, t, 0.5, ignore_index=IGNORE),
    "am": lambda z, t: L.am_softmax_loss(torch.tanh(z), t, 0.35, 10.0, ignore_index=IGNORE),
    "taylor": lambda z, t: L.taylor_softmax_loss(z, t, 4, ignore_index=IGNORE),
    "sm_taylor": lambda z, t: L.sm_taylor_softmax_loss(z, t, 2, 0.3, ignore_index=IGNORE),
    "sparsemax": lambda z, t: L.sparsemax_loss(z, t, ignore_index=IGNORE),
    "entmax15": lambda z, t: L.entmax15_loss(z, t, ignore_index=IGNORE),
}


@pytest.mark.parametrize("name", sorted(GRADCHECKED))
def test_gradcheck(name, device):
    z, t = _rand(n=6, v=5, seed=17, scale=1.5, device=device)
    t[1] = IGNORE
    z.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: GRADCHECKED[name](x, t), (z,))


@pytest.mark.parametrize("fn", [L.multilabel_categorical_crossentropy, lambda z, y: L.as_multilabel_loss(z, y, 0.3)])
def test_gradcheck_multilabel(fn, device):
    z, y = _multilabel_case(n=6, v=5, seed=18, device=device)
    z = (z / 2).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: fn(x, y), (z,))


# ----- dtypes and validation -----

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "fn",
    [
        lambda z, t: L.sparse_softmax_loss(z, t, 3),
        lambda z, t: L.as_softmax_loss(z, t, 0.3),
        lambda z, t: L.taylor_softmax_loss(z, t, 2),
        lambda z, t: L.sparsemax_loss(z, t),
    ],
)
def test_half_precision_computes_in_float32(fn, dtype, device):
    z, t = _rand(n=8, v=50, seed=19, dtype=dtype, device=device)
    z.requires_grad_(True)
    loss = fn(z, t)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, fn(z.detach().float(), t), rtol=1e-5, atol=1e-5)
    loss.backward()
    assert z.grad.dtype == dtype


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda z, t: L.sparse_softmax_loss(z, t, 0), "k must be in"),
        (lambda z, t: L.sparse_softmax_loss(z, t, 10), "k must be in"),
        (lambda z, t: L.as_softmax_loss(z, t, 1.5), "delta must be in"),
        (lambda z, t: L.as_softmax_loss(z, t, -0.1), "delta must be in"),
        (lambda z, t: L.taylor_softmax_loss(z, t, 3), "even"),
        (lambda z, t: L.sparse_softmax_loss(z, t[:-1], 2), "target must have shape"),
        (lambda z, t: L.as_softmax_loss(z[0], t, 0.3), "logits must have shape"),
        (lambda z, t: L.sparse_softmax_loss(z, t + 100, 2), "outside"),
        (lambda z, t: L.as_softmax_loss(z, t, 0.3, reduction="avg"), "reduction"),
        (lambda z, t: L.as_multilabel_loss(z, z[:, :3] > 0, 0.3), "labels must have the shape"),
        (lambda z, t: L.temperature_softmax_loss(z, t, 0.0), "temperature"),
        (lambda z, t: L.softmax_loss(z, t, label_smoothing=1.5), "label_smoothing must be in"),
    ],
)
def test_bad_input_raises_clear_value_error(call, message):
    z, t = _rand(v=9)
    with pytest.raises(ValueError, match=message):
        call(z, t)


def test_as_multilabel_ties_are_kept_at_delta_zero():
    # p_neg1 == min_pos exactly: min_pos - p = 0 <= δ keeps it; the smaller negative is dropped.
    z = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([[1, 0, 0]])
    expect = math.log(1 + math.e) + math.log(1 + math.exp(-1))
    assert L.as_multilabel_loss(z, y, 0.0).item() == pytest.approx(expect)
