"""Classification heads for ``--task text_classification``, linear or cosine (AM-softmax).

They keep the layout of fairseq's ``RobertaClassificationHead`` (``dense`` → tanh → ``out_proj``, with
dropout), so RoBERTa's checkpoint code (``upgrade_state_dict_named``) recognises them, and they sit in
the model's ``classification_heads`` like RoBERTa's own. Sentence-level heads read the first token
(``<s>``, which the task prepends); token-level heads score every position. ``EncoderWithHeads`` is
what the plugin's encoders for that task share.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from fairseq.models import BaseFairseqModel
from torch import Tensor, nn

from ..options import add_checked_args


def scaled_cosine(features: Tensor, weight: Tensor, scale: float) -> Tensor:
    """``s · cos(features, weight rows)``: the logits AM-softmax is defined on."""
    return scale * F.linear(F.normalize(features, dim=-1), F.normalize(weight, dim=-1))


class CosineLinear(nn.Module):
    """A bias-free linear layer whose outputs are ``s·cos(x, w_c)``; ``cosine_scale`` tells criterions s."""

    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        if not scale > 0:
            raise ValueError(f"--cosine-scale must be > 0, got {scale}")
        self.in_features, self.out_features = in_features, out_features
        self.cosine_scale = scale
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.normal_(self.weight, std=in_features**-0.5)

    def forward(self, x: Tensor) -> Tensor:
        return scaled_cosine(x, self.weight, self.cosine_scale)


class ClassificationHead(nn.Module):
    def __init__(self, input_dim: int, inner_dim: int, num_classes: int, dropout: float, token_level: bool,
                 cosine_scale: float | None = None):
        super().__init__()
        self.token_level = token_level
        self.dense = nn.Linear(input_dim, inner_dim)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = (nn.Linear(inner_dim, num_classes) if cosine_scale is None
                         else CosineLinear(inner_dim, num_classes, cosine_scale))

    @property
    def cosine_scale(self) -> float | None:
        return getattr(self.out_proj, "cosine_scale", None)

    def forward(self, features: Tensor, **unused) -> Tensor:
        """``(B, T, D)`` encoder features → ``(B, C)`` logits, or ``(B, T, C)`` when token-level."""
        x = features if self.token_level else features[:, 0, :]
        x = torch.tanh(self.dense(self.dropout(x)))
        return self.out_proj(self.dropout(x))


class EncoderWithHeads(BaseFairseqModel):
    """What the task's own encoders share (``text_encoder``, ``hf_encoder``): the ``classification_heads`` the
    task fills, the width of their features, the longest input, checked options from the dataclass
    ``config`` (a class attribute), and RoBERTa's ``forward`` contract. Subclasses implement ``features``."""

    config: type

    def __init__(self, feature_dim: int, max_positions: int):
        super().__init__()
        self.feature_dim, self.max_source_positions = feature_dim, max_positions
        self.classification_heads = nn.ModuleDict()

    @classmethod
    def add_args(cls, parser):
        # fairseq builds model options without defaults (architectures fill them in later)
        add_checked_args(parser, cls.config(), delete_default=True)

    def max_positions(self) -> int:
        return self.max_source_positions

    def features(self, src_tokens: Tensor) -> Tensor:
        """``(B, T)`` tokens → ``(B, T, feature_dim)`` features (padding positions included)."""
        raise NotImplementedError

    def forward(self, src_tokens: Tensor, classification_head_name: str | None = None, **unused):
        """The features, like RoBERTa's ``features_only`` output; with ``classification_head_name`` that
        head's logits instead."""
        x = self.features(src_tokens)
        if classification_head_name is not None:
            x = self.classification_heads[classification_head_name](x)
        return x, {}
