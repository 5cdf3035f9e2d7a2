"""Every fairseq criterion against the core function it wraps, on the same float64 logits: the loss, the plain
nll, the sample size and the logged counts equal what the core function gives for the options as the user set
them, on the counted rows alone (padding dropped before the reference sees the logits). A criterion that hands
the core a wrong option (1/T for T, no label smoothing, another δ), switches at another update, or lets padding
in gives another number. No training: these run in the fast tier."""
from __future__ import annotations

import math

import pytest
import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY
from fairseq.data import Dictionary

import user_dir  # noqa: F401  (registers the criterions)
from sparse_softmax import losses as L
from test_fairseq_compat import _LogitsModel, _Task

V, SCALE = 12, 10.0  # classes; the stand-in decoder's cosine scale (am_softmax)
#: criterion -> the options it is tested with (its config fields, none at its default)
OPTIONS = {
    "softmax": {"label_smoothing": 0.1},
    "temperature_softmax": {"softmax_temperature": 0.8},
    "soft_margin_softmax": {"softmax_margin": 0.3},
    "am_softmax": {"softmax_margin": 0.2},
    "taylor_softmax": {"taylor_order": 4},
    "sm_taylor_softmax": {"taylor_order": 2, "softmax_margin": 0.2},
    "sparsemax": {},
    "entmax15": {},
    "sparse_softmax": {"sparse_topk": 4, "label_smoothing": 0.1},
    "as_softmax": {"as_delta": 0.3},
}


def core_loss(name: str, z: torch.Tensor, t: torch.Tensor, options: dict, scale: float = SCALE) -> torch.Tensor:
    """The core loss that criterion ``name`` with ``options`` (its config fields; the unset ones at their defaults)
    stands for, summed over the rows of logits ``z`` (N × C; for am_softmax the cosine head's s·cos with s =
    ``scale``) and targets ``t`` (N)."""
    o = {"label_smoothing": 0.0, "taylor_gradient": "exact", **options}
    match name:
        case "softmax":
            return L.softmax_loss(z, t, label_smoothing=o["label_smoothing"])
        case "temperature_softmax":
            return L.temperature_softmax_loss(z, t, o["softmax_temperature"])
        case "soft_margin_softmax":
            return L.soft_margin_softmax_loss(z, t, o["softmax_margin"])
        case "am_softmax":
            return L.am_softmax_loss(z / scale, t, o["softmax_margin"], scale)
        case "taylor_softmax":
            return L.taylor_softmax_loss(z, t, o["taylor_order"], o["taylor_gradient"])
        case "sm_taylor_softmax":
            return L.sm_taylor_softmax_loss(z, t, o["taylor_order"], o["softmax_margin"])
        case "sparsemax":
            return L.sparsemax_loss(z, t)
        case "entmax15":
            return L.entmax15_loss(z, t)
        case "sparse_softmax":
            return L.sparse_softmax_loss(z, t, o["sparse_topk"], label_smoothing=o["label_smoothing"])
        case "as_softmax":
            return L.as_softmax_loss(z, t, o["as_delta"])
    raise KeyError(name)


def criterion_flags(name: str, options: dict) -> list[str]:
    """``--criterion name`` and ``options`` as command-line flags."""
    return ["--criterion", name, *(x for key, value in options.items() for x in (f"--{key.replace('_', '-')}",
                                                                                  str(value)))]


def dictionary() -> Dictionary:
    d = Dictionary()
    for i in range(V - len(d)):
        d.add_symbol(f"w{i}")
    assert len(d) == V
    return d


def batch(d: Dictionary, seed: int = 0):
    """Float64 logits (2 sentences × 6 positions × V, within ±SCALE) with padding at the second's end, wide enough
    apart that AS keeps one, some or every class on different rows; and the fairseq sample."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 6, V, generator=g, dtype=torch.float64) * 3
    target = torch.randint(d.nspecial, V, (2, 6), generator=g)
    logits[0, 0, target[0, 0]] += 12  # a row AS masks (the target far ahead)
    logits[0, 1] *= 0.01  # a dense one
    logits = logits.clamp(-0.99 * SCALE, 0.99 * SCALE)  # cosine logits for am_softmax, s·cos
    target[1, 4:] = d.pad()
    sample = {"net_input": {}, "target": target, "ntokens": int((target != d.pad()).sum())}
    return logits, target, sample


def build(name: str, d: Dictionary, **options):
    config = CRITERION_DATACLASS_REGISTRY[name]
    schedule = {"max_update": 0} if "max_update" in config.__dataclass_fields__ else {}  # no schedule unless given
    cfg = config(sentence_avg=False, **{**schedule, **options})
    return CRITERION_REGISTRY[name].build_criterion(cfg, _Task(d))


def counted(logits, target, d):
    keep = target.reshape(-1) != d.pad()
    return logits.reshape(-1, V)[keep], target.reshape(-1)[keep]


def model_at(logits, update: int = 0):
    model = _LogitsModel(logits)
    model.decoder.cosine_scale = SCALE
    model.num_updates = update
    return model


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_criterion_is_its_core_loss_on_the_counted_rows(name):
    d = dictionary()
    logits, target, sample = batch(d)
    z, t = counted(logits, target, d)
    loss, sample_size, log = build(name, d, **OPTIONS[name])(model_at(logits), sample)
    assert sample_size == log["sample_size"] == sample["ntokens"] == len(t) == 10
    assert int(log["n_rows"]) == 10
    torch.testing.assert_close(loss, core_loss(name, z, t, OPTIONS[name]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log["nll_loss"], torch.nn.functional.cross_entropy(z, t, reduction="sum"),
                               rtol=1e-12, atol=1e-12)


def test_the_gradient_reaches_the_counted_rows_only():
    d = dictionary()
    # with Taylor's infinite-order gradient too: the option changes the backward alone
    for name, options in [*OPTIONS.items(), ("taylor_softmax", {"taylor_order": 2, "taylor_gradient": "inf"})]:
        logits, target, sample = batch(d, seed=1)
        z = logits.clone().requires_grad_(True)
        build(name, d, **options)(model_at(z), sample)[0].backward()
        rows, t = counted(logits, target, d)
        rows = rows.clone().requires_grad_(True)
        core_loss(name, rows, t, options).backward()
        grad = z.grad.reshape(-1, V)
        keep = target.reshape(-1) != d.pad()
        torch.testing.assert_close(grad[keep], rows.grad, rtol=1e-10, atol=1e-12, msg=name)
        assert (grad[~keep] == 0).all(), f"{name}: padding has a gradient"


def test_as_softmax_counts_its_masked_and_dense_rows_by_the_papers_rule():
    """n_masked: rows where only the target survives ``p_t - p_i > δ``; n_dense: rows that keep every class."""
    d = dictionary()
    logits, target, sample = batch(d)
    z, t = counted(logits, target, d)
    p = z.softmax(dim=-1)
    kept = (p.gather(1, t[:, None]) - p) <= 0.3
    _, _, log = build("as_softmax", d, **OPTIONS["as_softmax"])(model_at(logits), sample)
    assert int(log["n_masked"]) == int((kept.sum(dim=1) == 1).sum()) >= 1
    assert int(log["n_dense"]) == int(kept.all(dim=1).sum()) >= 1
    assert float(log["delta_x_rows"]) == pytest.approx(0.3 * 10)


@pytest.mark.parametrize("update, warm", [(0, True), (4, True), (5, False), (9, False)])
def test_sparse_softmax_warmup_switches_at_its_share_of_max_update(update, warm):
    """--sparse-warmup-ratio 0.5 of --max-update 10: softmax (label-smoothed over every class) for updates 0-4,
    then Sparse-softmax over the top k; n_warmup_rows says which."""
    d = dictionary()
    logits, target, sample = batch(d)
    z, t = counted(logits, target, d)
    options = {**OPTIONS["sparse_softmax"], "sparse_warmup_ratio": 0.5, "max_update": 10}
    loss, _, log = build("sparse_softmax", d, **options)(model_at(logits, update), sample)
    want = L.softmax_loss(z, t, label_smoothing=0.1) if warm else L.sparse_softmax_loss(z, t, 4, label_smoothing=0.1)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    assert int(log["n_warmup_rows"]) == (10 if warm else 0)


@pytest.mark.parametrize("options, deltas", [
    ({"as_warmup_ratio": 0.3}, {0: 1.0, 2: 1.0, 3: 0.3, 9: 0.3}),  # δ = 1 for the first 3 of 10 updates
    ({"as_anneal_ratio": 0.5, "as_anneal_from": 0.9}, {0: 0.9, 1: 0.78, 5: 0.3, 9: 0.3}),  # 0.9 → 0.3 over 5
])
def test_as_softmax_schedule_reaches_the_core(options, deltas):
    d = dictionary()
    logits, target, sample = batch(d)
    z, t = counted(logits, target, d)
    criterion = build("as_softmax", d, **{**OPTIONS["as_softmax"], "max_update": 10, **options})
    for update, delta in deltas.items():
        loss, _, log = criterion(model_at(logits, update), sample)
        torch.testing.assert_close(loss, L.as_softmax_loss(z, t, delta), rtol=1e-12, atol=1e-12,
                                   msg=f"update {update}")
        assert float(log["delta_x_rows"]) == pytest.approx(delta * 10)


def test_sparse_softmax_logs_the_flat_slope_of_its_rows():
    d = dictionary()
    logits, target, sample = batch(d)
    z, t = counted(logits, target, d)
    _, _, log = build("sparse_softmax", d, **OPTIONS["sparse_softmax"])(model_at(logits), sample)
    slope = (z.topk(4, dim=1).values.mean(dim=1) - z.gather(1, t[:, None]).squeeze(1)).sum()
    assert int(log["n_slope_rows"]) == 10
    assert float(log["flat_slope_sum"]) == pytest.approx(float(slope))


def test_reduce_metrics_reports_bits_per_token():
    """fairseq's convention: loss and nll_loss per target token in base 2."""
    from fairseq import metrics

    d = dictionary()
    logits, target, sample = batch(d)
    z, t = counted(logits, target, d)
    criterion = build("sparse_softmax", d, **OPTIONS["sparse_softmax"])
    _, _, log = criterion(model_at(logits), sample)
    with metrics.aggregate() as agg:
        type(criterion).reduce_metrics([log, log])
    smoothed = agg.get_smoothed_values()
    want = float(L.sparse_softmax_loss(z, t, 4, label_smoothing=0.1)) / 10 / math.log(2)
    assert smoothed["loss"] == pytest.approx(want, abs=1e-3)
    nll = float(torch.nn.functional.cross_entropy(z, t)) / math.log(2)
    assert smoothed["nll_loss"] == pytest.approx(nll, abs=1e-3)


# ---------------------------------------------------------------------- TrainerLoss (Hugging Face)

#: TrainerLoss's names for the criterions' options
HF_NAMES = {"sparse_topk": "k", "as_delta": "delta", "softmax_temperature": "temperature", "softmax_margin": "margin",
            "taylor_order": "order", "taylor_gradient": "gradient"}


def hf_batch(seed: int = 0):
    """Logits (2 × 6 × V) as a model's output and labels with -100 at the second sequence's end."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 6, V, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, V, (2, 6), generator=g)
    labels[1, 4:] = -100
    return logits.clamp(-0.99, 0.99), logits, labels  # cosines for am_softmax, logits for the others


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("causal_lm", [False, True])
def test_trainer_loss_is_its_core_loss_per_counted_row(name, causal_lm):
    """The loss ``TrainerLoss`` returns for the Trainer: the core loss of the counted rows (labels shifted one to
    the left for a causal LM, as the model's own loss), divided by ``num_items_in_batch``, or by the rows counted
    when the Trainer passes none."""
    from sparse_softmax.hf import TrainerLoss

    options = {HF_NAMES.get(key, key): value for key, value in OPTIONS[name].items()}
    if name == "am_softmax":
        options["scale"] = SCALE
    cosines, logits, labels = hf_batch()
    scores = cosines if name == "am_softmax" else logits
    if causal_lm:
        z, t = scores[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1)
    else:
        z, t = scores.reshape(-1, V), labels.reshape(-1)
    z, t = z[t != -100], t[t != -100]
    want = core_loss(name, z * SCALE if name == "am_softmax" else z, t, OPTIONS[name])
    loss_fn = TrainerLoss(name, causal_lm=causal_lm, **options)
    torch.testing.assert_close(loss_fn({"logits": scores}, labels), want / len(t), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss_fn({"logits": scores}, labels, num_items_in_batch=40), want / 40,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("update, warm", [(0, True), (4, True), (5, False)])
def test_trainer_loss_warmup_switches_at_its_share_of_the_steps(update, warm):
    from sparse_softmax.hf import TrainerLoss

    _, logits, labels = hf_batch()
    z, t = logits.reshape(-1, V), labels.reshape(-1)
    z, t = z[t != -100], t[t != -100]
    loss_fn = TrainerLoss("sparse_softmax", k=4, label_smoothing=0.1, warmup_ratio=0.5)
    loss_fn.update, loss_fn.max_update = update, 10  # what LossScheduleCallback sets before each update
    want = L.softmax_loss(z, t, label_smoothing=0.1) if warm else L.sparse_softmax_loss(z, t, 4, label_smoothing=0.1)
    torch.testing.assert_close(loss_fn({"logits": logits}, labels), want / len(t), rtol=1e-12, atol=1e-12)


def test_trainer_loss_counts_as_softmax_rows_and_delta():
    from sparse_softmax.hf import TrainerLoss

    _, logits, labels = hf_batch()
    logits[0, 0, labels[0, 0]] += 12  # a masked row
    z, t = logits.reshape(-1, V), labels.reshape(-1)
    z, t = z[t != -100], t[t != -100]
    p = z.softmax(dim=-1)
    loss_fn = TrainerLoss("as_softmax", delta=0.3, anneal_ratio=0.5, anneal_from=0.9)
    loss_fn.update, loss_fn.max_update = 1, 10  # δ = 0.9 - (0.9 - 0.3) · 1/5
    loss_fn({"logits": logits}, labels)
    p_delta = 0.9 - 0.6 / 5
    kept = (p.gather(1, t[:, None]) - p) <= p_delta
    assert int(loss_fn.totals["rows"]) == 10
    assert int(loss_fn.totals["masked"]) == int((kept.sum(dim=1) == 1).sum()) >= 1
    assert float(loss_fn.totals["delta_x_rows"]) == pytest.approx(p_delta * 10)
