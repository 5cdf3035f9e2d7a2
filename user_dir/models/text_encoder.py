"""``--arch text_encoder``: a small transformer encoder for classification experiments on a CPU.

RoBERTa from fairseq (``--arch roberta_base`` shrunk by flags) works with ``--task text_classification``
too; this model is the self-contained small default for CPU runs of minutes: token and position
embeddings and a pre-LayerNorm stack of ``torch.nn.TransformerEncoderLayer`` (2 × 128 by default), with
no LM head, pooler or segment embeddings to configure. At equal sizes it is not faster than the shrunk
RoBERTa (``benchmarks/classifier_speed.py``: 0.86–0.93× its sentences per second on 2 CPU cores); its
speed comes from its size. The task adds its classification heads to ``classification_heads``, exactly
as for RoBERTa, and reads the first position (``<s>``) for sentence-level labels.
"""

from dataclasses import dataclass, field

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.models import register_model
from torch import Tensor, nn

from ..options import UsageError, at_least, in_range, validate
from .heads import EncoderWithHeads


@dataclass
class TextEncoderConfig(FairseqDataclass):
    encoder_layers: int = field(default=2, metadata={"help": "number of transformer layers", "check": at_least(1)})
    encoder_embed_dim: int = field(default=128, metadata={"help": "model (embedding) dimension", "check": at_least(1)})
    encoder_ffn_embed_dim: int = field(default=256, metadata={"help": "feed-forward inner dimension",
                                                              "check": at_least(1)})
    encoder_attention_heads: int = field(default=4, metadata={"help": "attention heads per layer (must divide "
                                                                      "--encoder-embed-dim)", "check": at_least(1)})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings, attention and feed-forward",
                                                  "check": in_range(0, 1)})
    max_positions: int = field(default=256, metadata={"help": "longest input in tokens (<s> included); "
                                                              "fairseq refuses or reports longer ones",
                                                      "check": at_least(2)})


@register_model("text_encoder", dataclass=TextEncoderConfig)
class TextEncoderModel(EncoderWithHeads):
    config = TextEncoderConfig

    def __init__(self, cfg: TextEncoderConfig, dictionary):
        dim = cfg.encoder_embed_dim
        super().__init__(dim, cfg.max_positions)
        self.padding_idx = dictionary.pad()
        self.embed_tokens = nn.Embedding(len(dictionary), dim, padding_idx=self.padding_idx)
        self.embed_positions = nn.Embedding(cfg.max_positions, dim)
        nn.init.normal_(self.embed_tokens.weight, std=dim**-0.5)
        nn.init.normal_(self.embed_positions.weight, std=dim**-0.5)
        self.dropout = nn.Dropout(cfg.dropout)
        layer = nn.TransformerEncoderLayer(dim, cfg.encoder_attention_heads, cfg.encoder_ffn_embed_dim, cfg.dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, cfg.encoder_layers, enable_nested_tensor=False)
        self.layer_norm = nn.LayerNorm(dim)

    @classmethod
    def build_model(cls, cfg: TextEncoderConfig, task):
        validate(cfg, TextEncoderConfig)
        if cfg.encoder_embed_dim % cfg.encoder_attention_heads:
            raise UsageError(f"--encoder-attention-heads {cfg.encoder_attention_heads} must divide "
                             f"--encoder-embed-dim {cfg.encoder_embed_dim}")
        return cls(cfg, task.source_dictionary)

    def features(self, src_tokens: Tensor) -> Tensor:
        positions = torch.arange(src_tokens.size(1), device=src_tokens.device)
        x = self.dropout(self.embed_tokens(src_tokens) + self.embed_positions(positions))
        return self.layer_norm(self.layers(x, src_key_padding_mask=src_tokens.eq(self.padding_idx)))
