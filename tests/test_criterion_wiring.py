"""Every fairseq criterion against the core function it wraps, on the same float64 logits: the loss, the plain
nll, the sample size and the logged counts equal what the core function gives for the options as the user set
them, on the counted rows alone (padding dropped before the reference sees the logits). A criterion that hands
the core a wrong option (1/T for T, no label smoothing, another δ), switches at another update, or lets padding
in gives another number. No training: these run in the fast tier."""
from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from fairseq.criterions import CRITERION_DATACLASS_REGISTRY, CRITERION_REGISTRY
from fairseq.data import Dictionary

import user_dir  # noqa: F401  (registers the criterions)
from conftest import ROOT, logged
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


def build(name: str, d: Dictionary, task=None, **options):
    """Criterion ``name`` with ``options`` (config fields; no --sentence-avg and no schedule unless given) for
    ``task`` (default: a seq2seq task over ``d``)."""
    config = CRITERION_DATACLASS_REGISTRY[name]
    schedule = {"max_update": 0} if "max_update" in config.__dataclass_fields__ else {}
    cfg = config(**{"sentence_avg": False, **schedule, **options})
    return CRITERION_REGISTRY[name].build_criterion(cfg, task or _Task(d))


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


# ---------------------------------------------------------------------- the rest of a criterion's contract

def test_the_logged_sizes_and_the_sentence_average():
    """ntokens and nsentences reach the log as fairseq's trainer reads them; --sentence-avg divides by sentences."""
    d = dictionary()
    logits, target, sample = batch(d)
    _, _, log = build("softmax", d)(model_at(logits), sample)
    assert (log["ntokens"], log["nsentences"]) == (10, 2)
    loss, sample_size, log = build("softmax", d, sentence_avg=True)(model_at(logits), sample)
    assert sample_size == log["sample_size"] == 2 and int(log["n_rows"]) == 10


def test_ignore_prefix_size_drops_the_first_target_tokens():
    d = dictionary()
    logits, target, sample = batch(d)
    z, t = counted(logits[:, 1:], target[:, 1:], d)
    loss, _, log = build("sparse_softmax", d, ignore_prefix_size=1, **OPTIONS["sparse_softmax"])(model_at(logits),
                                                                                                  sample)
    assert int(log["n_rows"]) == len(t) == 8
    torch.testing.assert_close(loss, core_loss("sparse_softmax", z, t, OPTIONS["sparse_softmax"]), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_unreduced_losses_are_the_rows_of_the_summed_one(name):
    """``reduce=False`` (fairseq's per-token scoring): one loss and one nll per row, padding 0, summing to the
    reduced ones."""
    d = dictionary()
    logits, target, sample = batch(d)
    criterion = build(name, d, **OPTIONS[name])
    rows, _, rows_logged = criterion(model_at(logits), sample, reduce=False)
    assert rows.shape == (12,) and (rows[target.reshape(-1) == d.pad()] == 0).all()
    loss, _, logged = criterion(model_at(logits), sample)
    torch.testing.assert_close(rows.sum(), loss, rtol=1e-12, atol=1e-12)
    if "nll_loss" in logged:  # the logged nll is unreduced too
        assert rows_logged["nll_loss"].shape == (12,)
        torch.testing.assert_close(rows_logged["nll_loss"].sum(), logged["nll_loss"], rtol=1e-12, atol=1e-12)


def test_reduce_metrics_weights_each_batch_by_its_size():
    """Across batches the logged loss is per target token (per sample_size), nll_loss per counted row, ppl 2^nll,
    the criterion's ratios count-weighted; each rounded as fairseq prints it. A one-token batch weighs 1."""
    from fairseq import metrics

    d = dictionary()
    logits, target, sample = batch(d)
    one = target.clone()
    one.view(-1)[1:] = d.pad()
    criterion = build("sparse_softmax", d, **OPTIONS["sparse_softmax"])
    logs = [criterion(model_at(logits), {**sample, "target": t, "ntokens": int((t != d.pad()).sum())})[2]
            for t in (target, one)]
    rows = [counted(logits, t, d) for t in (target, one)]
    with metrics.aggregate() as agg:
        for log in logs:
            type(criterion).reduce_metrics([log])
    smoothed = agg.get_smoothed_values()
    loss = sum(float(L.sparse_softmax_loss(z, t, 4, label_smoothing=0.1)) for z, t in rows)
    nll = sum(float(torch.nn.functional.cross_entropy(z, t, reduction="sum")) for z, t in rows)
    slope = sum(float((z.topk(4, dim=1).values.mean(dim=1) - z.gather(1, t[:, None]).squeeze(1)).sum())
                for z, t in rows)
    assert smoothed["loss"] == round(loss / 11 / math.log(2), 3)
    assert smoothed["nll_loss"] == round(nll / 11 / math.log(2), 3)
    assert smoothed["ppl"] == pytest.approx(2 ** (nll / 11 / math.log(2)), rel=1e-9)
    assert smoothed["flat_slope"] == round(slope / 11, 4) and smoothed["sparse_warmup"] == 0


def test_sparse_softmax_warns_once_when_its_warmup_hands_over_a_model_flat_logits_beat(caplog):
    """The handover warning is the core's ``handover_warning`` for the batch, said at the first training update
    after the warm-up only: not in it, not in validation, not twice, not without a warm-up."""
    from sparse_softmax.diagnostics import handover_warning

    d = dictionary()
    logits, target, sample = batch(d)
    z, t = counted(logits, target, d)
    message = handover_warning(z, t, 4, 5)
    assert message is not None  # random logits: flat ones beat them
    options = {**OPTIONS["sparse_softmax"], "sparse_warmup_ratio": 0.5, "max_update": 10}
    criterion = build("sparse_softmax", d, **options)
    no_warmup = build("sparse_softmax", d, **OPTIONS["sparse_softmax"], max_update=10)
    for run, update, training in [(criterion, 4, True), (criterion, 5, False), (no_warmup, 0, True),
                                  (criterion, 5, True), (criterion, 5, True)]:
        model = model_at(logits, update).train(training)
        run(model, sample)
    warnings = logged(caplog, "user_dir.criterions.sparse_softmax")
    assert warnings == [message]


@pytest.mark.parametrize("name, options, same", [
    ("sparse_softmax", {"sparse_topk": V}, f"--sparse-topk {V} >= {V} classes: sparse_softmax keeps every class, "
                                            "so it trains plain softmax cross-entropy"),
    ("sparse_softmax", {"sparse_topk": V - 1}, None),
    ("as_softmax", {"as_delta": 1.0}, "--as-delta 1: AS-Softmax keeps every class, so it trains plain softmax "
                                      "cross-entropy"),
    ("as_softmax", {"as_delta": 0.3}, None),
    ("temperature_softmax", {"softmax_temperature": 1.0},
     "--softmax-temperature 1: temperature_softmax trains plain softmax cross-entropy"),
    ("temperature_softmax", {"softmax_temperature": 2.0}, None),
    ("soft_margin_softmax", {"softmax_margin": 0.0}, "--softmax-margin 0: soft_margin_softmax trains plain softmax "
                                                     "cross-entropy"),
    ("soft_margin_softmax", {"softmax_margin": 0.1}, None),
    ("sm_taylor_softmax", {"softmax_margin": 0.0}, "--softmax-margin 0: sm_taylor_softmax trains taylor_softmax "
                                                   "(exact gradient)"),
    ("sm_taylor_softmax", {"softmax_margin": 0.1}, None),
])
def test_options_that_make_another_method_are_said_at_start(name, options, same, caplog):
    with caplog.at_level("WARNING", logger="user_dir.criterions.base"):
        build(name, dictionary(), **options)
    assert logged(caplog, "user_dir.criterions.base") == ([same] if same else [])


def test_top_k_is_compared_with_the_classes_not_the_label_dictionary(caplog):
    """A classification task's label dictionary holds fairseq's special symbols beside the classes, so
    ``--sparse-topk`` is weighed against the task's ``num_classes``."""
    d = dictionary()
    task = _ClassificationTask(d, False)
    task.num_classes = 5
    with caplog.at_level("WARNING", logger="user_dir.criterions.base"):
        build("sparse_softmax", d, task, sparse_topk=5)
    assert len(d) > 5 and logged(caplog, "user_dir.criterions.base") == [
        "--sparse-topk 5 >= 5 classes: sparse_softmax keeps every class, so it trains plain softmax cross-entropy"]


@pytest.mark.parametrize("name, options, message", [
    ("sparse_softmax", {"sparse_warmup_ratio": 0.1}, "--sparse-warmup-ratio is a fraction of --max-update: set "
                                                     "--max-update"),
    ("as_softmax", {"as_warmup_ratio": 0.1}, "--as-warmup-ratio is a fraction of --max-update: set --max-update"),
    ("as_softmax", {"as_anneal_ratio": 0.1}, "--as-anneal-ratio is a fraction of --max-update: set --max-update"),
    ("as_softmax", {"as_warmup_ratio": 0.1, "as_anneal_ratio": 0.5, "max_update": 10},
     "--as-warmup-ratio and --as-anneal-ratio: choose one (both start from a softmax-like delta)"),
    ("as_softmax", {"as_anneal_from": 0.5}, "--as-anneal-from is where --as-anneal-ratio starts: set --as-anneal-ratio"),
])
def test_schedule_mistakes_are_refused_naming_the_flags(name, options, message):
    from user_dir.options import UsageError

    with pytest.raises(UsageError) as refused:
        build(name, dictionary(), **options)
    assert str(refused.value) == message


class _ClassificationTask(_Task):
    """Stands in for --task text_classification: it supplies the rows (``loss_batch``) and says whether its
    labels are multi-hot."""

    def __init__(self, dictionary, multi_label: bool, rows=None):
        super().__init__(dictionary)
        self.cfg = type("Config", (), {"_name": "text_classification", "multi_label": multi_label})()
        self.rows = rows

    def loss_batch(self, model, sample):
        from user_dir.criterions.base import LossBatch

        assert sample is self.sample and model is self.model  # the criterion asks with the batch it was given
        logits, labels = self.rows
        return LossBatch(logits, labels, None, labels.new_tensor(len(labels)), len(labels))


@pytest.mark.parametrize("name, task_multi_label, message", [
    ("softmax", True, "SoftmaxCriterion is a single-label loss but the task is multi-label: use --criterion "
                      "multilabel_softmax or as_multilabel"),
    ("multilabel_softmax", False, "MultilabelSoftmaxCriterion is a multi-label loss but the task is single-label: "
                                  "use a single-label criterion (cross-entropy, sparse_softmax, as_softmax, ...)"),
])
def test_a_criterion_for_the_other_kind_of_labels_is_refused(name, task_multi_label, message):
    from user_dir.options import UsageError

    d = dictionary()
    with pytest.raises(UsageError) as refused:
        build(name, d, _ClassificationTask(d, task_multi_label))
    assert str(refused.value) == message


@pytest.mark.parametrize("name, options, update, delta", [
    ("multilabel_softmax", {}, 0, None),
    ("as_multilabel", {"as_delta": 0.3}, 0, 0.3),
    ("as_multilabel", {"as_delta": 0.3, "as_anneal_ratio": 0.5, "max_update": 10}, 1, 0.86),  # 1.0 → 0.3 over 5
])
def test_multi_label_criteria_are_their_core_loss_on_the_tasks_rows(name, options, update, delta):
    """The rows come from the task (``loss_batch``); the loss and AS's masked rows are the core's on multi-hot
    labels at the schedule's δ, one loss per row under ``reduce=False``, and no softmax nll is logged (a label set
    has no single target)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, V, generator=g, dtype=torch.float64) * 3
    labels = (torch.rand(6, V, generator=g) < 0.3).long()
    labels[0] = 0
    labels[0, 2] = 1
    logits[0, 2] = 30.0  # far ahead: AS keeps none of the other classes
    d = dictionary()
    task = _ClassificationTask(d, True, (logits, labels))
    criterion = build(name, d, task, **options)
    task.sample, task.model = {"ntokens": 6, "nsentences": 6, "target": labels}, model_at(logits, update)
    loss, sample_size, log = criterion(task.model, task.sample)
    rows = criterion(task.model, task.sample, reduce=False)[0]
    assert sample_size == 6 and "nll_loss" not in log
    if name == "multilabel_softmax":
        want = L.multilabel_categorical_crossentropy(logits, labels, "none")
    else:
        want, masked = L.as_multilabel_loss(logits, labels, delta, "none", return_masked=True)
        assert int(log["n_masked"]) == int(masked) >= 1
        assert float(log["delta_x_rows"]) == pytest.approx(delta * 6)
    torch.testing.assert_close(rows, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, want.sum(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- --fused-output-layer

H = 5  # the stand-in decoder's feature size


class _FeaturesModel(torch.nn.Module):
    """Stands in for a seq2seq model whose decoder computes its logits as a plain linear ``output_projection`` of
    its features (as a plugin decoder promises with ``logits_are_output_projection``); like fairseq's models it
    returns the features when called with ``features_only``, and it checks that it is given the sample's input."""

    def __init__(self, features, projection, source, update: int = 0):
        super().__init__()
        self.features, self.source, self.num_updates = features, source, update
        self.decoder = torch.nn.Module()
        self.decoder.output_projection = projection
        self.decoder.logits_are_output_projection = True

    def forward(self, src_tokens, features_only: bool = False):
        assert src_tokens is self.source
        return (self.features if features_only else self.decoder.output_projection(self.features),)

    def get_targets(self, sample, net_output):
        return sample["target"]


@pytest.mark.parametrize("name, options, update", [
    ("softmax", OPTIONS["softmax"], 0),
    ("sparse_softmax", OPTIONS["sparse_softmax"], 0),
    ("sparse_softmax", {**OPTIONS["sparse_softmax"], "sparse_warmup_ratio": 0.5, "max_update": 10}, 4),
    ("as_softmax", OPTIONS["as_softmax"], 0),
    ("as_softmax", {**OPTIONS["as_softmax"], "as_warmup_ratio": 0.5, "max_update": 10}, 4),
])
def test_the_fused_output_layer_is_the_core_loss_of_the_projected_features(name, options, update):
    """With --fused-output-layer the criterion scores the decoder's features through its output projection: the
    loss, its gradient (features, weight, bias), the nll, every logged count and the rows under ``reduce=False``
    are those of the core loss on the logits the projection makes (in a warm-up: the softmax)."""
    d = dictionary()
    _, target, sample = batch(d)
    g = torch.Generator().manual_seed(3)
    features = (torch.randn(2, 6, H, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    projection = torch.nn.Linear(H, V, dtype=torch.float64)
    with torch.no_grad():
        projection.weight.copy_(torch.randn(V, H, generator=g, dtype=torch.float64))
        projection.bias.copy_(torch.randn(V, generator=g, dtype=torch.float64))
    source = torch.zeros(2, 3, dtype=torch.long)
    sample = {**sample, "net_input": {"src_tokens": source}}
    loss, sample_size, log = build(name, d, fused_output_layer=True, **options)(
        _FeaturesModel(features, projection, source, update), sample)
    loss.backward()
    fused_grads = [features.grad, projection.weight.grad, projection.bias.grad]
    features.grad = projection.weight.grad = projection.bias.grad = None

    z, t = counted(projection(features), target, d)
    warm = "sparse_warmup_ratio" in options or "as_warmup_ratio" in options
    want = L.softmax_loss(z, t, label_smoothing=options.get("label_smoothing", 0.0)) if warm else \
        core_loss(name, z, t, options)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
    for fused, plain in zip(fused_grads, [features.grad, projection.weight.grad, projection.bias.grad]):
        torch.testing.assert_close(fused, plain, rtol=1e-10, atol=1e-12)
    assert sample_size == 10
    torch.testing.assert_close(log["nll_loss"], torch.nn.functional.cross_entropy(z, t, reduction="sum"),
                               rtol=1e-10, atol=1e-12)
    _, _, unfused = build(name, d, **options)(model_at(projection(features).detach(), update), sample)
    assert log.keys() == unfused.keys()
    for key in log.keys() - {"loss", "nll_loss"}:
        assert float(log[key]) == pytest.approx(float(unfused[key]), rel=1e-10), key
    rows = build(name, d, fused_output_layer=True, **options)(
        _FeaturesModel(features, projection, source, update), sample, reduce=False)[0]
    unfused_rows = build(name, d, **options)(model_at(projection(features).detach(), update), sample, reduce=False)[0]
    torch.testing.assert_close(rows, unfused_rows, rtol=1e-10, atol=1e-12)  # fairseq's per-token scoring


def test_the_fused_output_layer_refuses_what_it_cannot_score():
    """A decoder that does not promise plain linear logits, and a classification task, are refused in one line."""
    from user_dir.options import UsageError

    d = dictionary()
    _, _, sample = batch(d)
    model = _FeaturesModel(torch.zeros(2, 6, H), torch.nn.Linear(H, V), None)
    del model.decoder.logits_are_output_projection
    with pytest.raises(UsageError) as refused:
        build("softmax", d, fused_output_layer=True)(model, {**sample, "net_input": {"src_tokens": None}})
    assert str(refused.value) == ("--fused-output-layer needs a decoder whose logits are its plain linear "
                                  "output_projection; Module is not a fairseq transformer decoder")
    with pytest.raises(UsageError) as refused:
        build("softmax", d, _ClassificationTask(d, False), fused_output_layer=True)
    assert str(refused.value) == ("--fused-output-layer scores a seq2seq decoder's features against its output "
                                  "projection; --task text_classification scores classification heads over a few "
                                  "classes instead")


def transformer_decoder(d: Dictionary, cls=None):
    """A one-layer fairseq TransformerDecoder over ``d`` (or an instance of its subclass ``cls``)."""
    from fairseq.models.transformer import TransformerConfig, TransformerDecoder

    cfg = TransformerConfig()
    cfg.decoder.layers, cfg.decoder.attention_heads, cfg.decoder.ffn_embed_dim = 1, 1, 16
    cfg.decoder.embed_dim = cfg.decoder.input_dim = cfg.decoder.output_dim = H
    return (cls or TransformerDecoder)(cfg, d, torch.nn.Embedding(len(d), H, padding_idx=d.pad()), no_encoder_attn=True)


def test_the_fused_output_layer_takes_a_fairseq_decoder_with_plain_linear_logits():
    """A stock TransformerDecoder passes; one that computes its own logits, or has no linear projection, is
    refused, and so is another decoder unless it promises plain linear logits."""
    from fairseq.models.transformer import TransformerDecoder

    from user_dir.criterions.base import check_plain_output_layer
    from user_dir.options import UsageError

    class OwnLogits(TransformerDecoder):
        def output_layer(self, features):
            return super().output_layer(features) * 2

    d = dictionary()
    check_plain_output_layer(transformer_decoder(d))
    adaptive = transformer_decoder(d)
    adaptive.output_projection = None  # as with --adaptive-softmax-cutoff
    promised = torch.nn.Module()
    promised.logits_are_output_projection = True
    check_plain_output_layer(promised)
    start = "--fused-output-layer needs a decoder whose logits are its plain linear output_projection; "
    for decoder, problem in [
        (transformer_decoder(d, OwnLogits), "OwnLogits computes its logits in its own output_layer (e.g. cosine "
                                            "logits for am_softmax)"),
        (adaptive, "TransformerDecoder has no linear output_projection"),
        (torch.nn.GRU(H, H), "GRU is not a fairseq transformer decoder"),
    ]:
        with pytest.raises(UsageError) as refused:
            check_plain_output_layer(decoder)
        assert str(refused.value) == start + problem


def test_an_adaptive_softmax_decoder_is_refused():
    from user_dir.options import UsageError

    d = dictionary()
    logits, _, sample = batch(d)
    model = model_at(logits)
    model.decoder.adaptive_softmax = torch.nn.Module()
    with pytest.raises(UsageError) as refused:
        build("sparse_softmax", d, **OPTIONS["sparse_softmax"])(model, sample)
    assert str(refused.value) == ("criterion SparseSoftmaxCriterion needs full logits; --adaptive-softmax-cutoff is "
                                  "not supported")


@pytest.mark.parametrize("name, options, message", [
    ("am_softmax", {"softmax_margin": -0.1}, "--softmax-margin must be >= 0, got -0.1"),
    ("sm_taylor_softmax", {"softmax_margin": -0.1}, "--softmax-margin must be >= 0, got -0.1"),
    ("taylor_softmax", {"taylor_order": 3}, "--taylor-order must be an even integer >= 2 (odd orders make the Taylor "
                                            "expansion negative), got 3"),
    ("sm_taylor_softmax", {"taylor_order": 0}, "--taylor-order must be an even integer >= 2 (odd orders make the "
                                               "Taylor expansion negative), got 0"),
])
def test_the_margin_and_order_fields_refuse_what_the_losses_do_not_define(name, options, message):
    from user_dir.options import UsageError

    with pytest.raises(UsageError) as refused:
        build(name, dictionary(), **options)
    assert str(refused.value) == message


def test_the_documented_defaults_are_the_configs():
    """docs/criterions.md's table gives each criterion's options with their defaults (``--flag value``): they are
    its config's."""
    table = (ROOT / "docs" / "criterions.md").read_text().split("| `--criterion` |")[1].split("\n\n")[0]
    checked = set()
    for row in table.splitlines()[2:]:
        cells = row.strip(" |").split(" | ")
        criterions, options = cells[0], cells[-1]
        for name in re.findall(r"`(\w+)`", criterions):
            if name in ("cross_entropy", "label_smoothed_cross_entropy"):  # fairseq's own
                continue
            defaults = {f.name: f.default for f in dataclasses.fields(CRITERION_DATACLASS_REGISTRY[name])}
            for flag, value in re.findall(r"`--([\w-]+) ([\w.]+)", options):
                if flag == "cosine-scale":  # the model's and the task's option
                    continue
                default = defaults[flag.replace("-", "_")]
                assert (default == float(value)) if isinstance(default, (int, float)) else default == value, \
                    f"{name} --{flag}: the docs say {value}, the config {default}"
                checked.add((name, flag))
    assert len(checked) == 17, sorted(checked)  # every `--flag value` of the table


def test_am_softmax_without_cosine_logits_is_refused():
    from user_dir.options import UsageError

    d = dictionary()
    logits, _, sample = batch(d)
    model = model_at(logits)
    del model.decoder.cosine_scale
    with pytest.raises(UsageError) as refused:
        build("am_softmax", d)(model, sample)
    assert str(refused.value) == ("--criterion am_softmax needs cosine logits: train with --arch cosine_transformer "
                                  "(or cosine_transformer_tiny), or --classifier cosine with --task "
                                  "text_classification")


@pytest.mark.parametrize("delta, said", [
    (1.0, "--as-delta 1: AS-Softmax keeps every class, so it trains Su's multi-label loss (multilabel_softmax)"),
    (0.9, None),
])
def test_as_multilabel_says_when_it_is_su_s_loss(delta, said, caplog):
    d = dictionary()
    with caplog.at_level("WARNING", logger="user_dir.criterions.base"):
        build("as_multilabel", d, _ClassificationTask(d, True), as_delta=delta)
    assert logged(caplog, "user_dir.criterions.base") == ([said] if said else [])
