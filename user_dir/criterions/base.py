"""The shared shell of every token-level criterion: fairseq bookkeeping around a loss function.

Subclasses implement ``token_loss(logits, target, model)`` with a function from ``user_dir.losses``;
this class gets raw logits and targets from a seq2seq sample, ignores padding, reports a plain
softmax ``nll_loss`` of the same logits (so runs compare with ``cross_entropy`` and
``label_smoothed_cross_entropy``), and aggregates the logs.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, NamedTuple, Optional

import torch
from fairseq.criterions import FairseqCriterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II
from torch import Tensor


@dataclass
class TokenLossConfig(FairseqDataclass):
    sentence_avg: bool = II("optimization.sentence_avg")
    ignore_prefix_size: int = field(default=0, metadata={"help": "ignore the first N target tokens (e.g. a language tag)"})


class TokenLoss(NamedTuple):
    loss: Tensor  # summed over non-padding tokens (per token when reduce=False)
    nll: Optional[Tensor] = None  # plain CE of the same logits, if the loss computed it anyway
    counts: Optional[Dict[str, Tensor]] = None  # extra summable counts to log (e.g. masked tokens)


class TokenLossCriterion(FairseqCriterion):
    # Logged ratios: metric name -> (numerator count, denominator count), both in logging outputs.
    ratios: dict[str, tuple[str, str]] = {}

    def __init__(self, task, sentence_avg: bool, ignore_prefix_size: int = 0):
        super().__init__(task)
        self.sentence_avg = sentence_avg
        self.ignore_prefix_size = ignore_prefix_size

    def token_loss(self, logits: Tensor, target: Tensor, model, reduction: str) -> TokenLoss:
        raise NotImplementedError

    def model_logits(self, model, sample) -> Tensor:
        """Raw (pre-softmax) decoder logits ``(B, T, V)``."""
        if getattr(getattr(model, "decoder", None), "adaptive_softmax", None) is not None:
            raise ValueError(f"criterion {self.__class__.__name__} needs full logits; --adaptive-softmax-cutoff is not supported")
        return model(**sample["net_input"])[0]

    def forward(self, model, sample, reduce: bool = True):
        logits = self.model_logits(model, sample)
        target = model.get_targets(sample, None)
        if self.ignore_prefix_size > 0:
            logits = logits[:, self.ignore_prefix_size :, :]
            target = target[:, self.ignore_prefix_size :]
        logits = logits.reshape(-1, logits.size(-1))
        target = target.reshape(-1)
        out = self.token_loss(logits, target, model, "sum" if reduce else "none")
        nll = out.nll
        if nll is None:
            with torch.no_grad():
                nll = plain_nll(logits, target, self.padding_idx, "sum" if reduce else "none")
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": out.loss.data,
            "nll_loss": nll.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        logging_output.update({k: v.data if torch.is_tensor(v) else v for k, v in (out.counts or {}).items()})
        return out.loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        def total(key):
            return sum(float(log.get(key, 0)) for log in logging_outputs)

        sample_size, ntokens = total("sample_size"), total("ntokens")
        metrics.log_scalar("loss", total("loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: 2 ** meters["nll_loss"].avg)
        for name, (num, den) in cls.ratios.items():
            metrics.log_scalar(name, total(num) / max(total(den), 1), total(den), round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def plain_nll(logits: Tensor, target: Tensor, padding_idx: int, reduction: str) -> Tensor:
    """Softmax cross-entropy in float32, padding ignored; what fairseq reports as nll_loss."""
    rows = torch.logsumexp(logits.float(), dim=-1) - logits.gather(1, target[:, None]).squeeze(1).float()
    rows = rows.masked_fill(target == padding_idx, 0.0)
    return rows if reduction == "none" else rows.sum()
