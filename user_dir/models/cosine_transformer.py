"""``--arch cosine_transformer``: a transformer whose output logits are scaled cosines.

AM-softmax is defined on cos(θ) between normalised decoder features and normalised output
embeddings. Producing ``s·cos`` in the model itself, rather than only inside the criterion, keeps
training and decoding on the same scores: ``fairseq-generate`` then ranks hypotheses by the
distribution the model was trained on (the margin is training-only).
"""
from __future__ import annotations

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerModel
from fairseq.models.transformer.transformer_legacy import tiny_architecture

from ..options import checked_type, positive
from .heads import scaled_cosine


class CosineTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, cosine_scale: float, no_encoder_attn: bool = False):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        if self.adaptive_softmax is not None:
            raise ValueError("cosine_transformer does not support --adaptive-softmax-cutoff")
        self.cosine_scale = cosine_scale

    def output_layer(self, features):
        return scaled_cosine(features, self.output_projection.weight, self.cosine_scale)


@register_model("cosine_transformer")
class CosineTransformerModel(TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        cls.add_own_args(parser)

    @staticmethod
    def add_own_args(parser):
        parser.add_argument("--cosine-scale", type=checked_type(float, positive(), "--cosine-scale"), metavar="S",
                            help="logits are S·cos(features, output embedding); AM-softmax's scale s (default 30)")

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        return CosineTransformerDecoder(cfg, tgt_dict, embed_tokens, args.cosine_scale, cfg.no_cross_attention)


@register_model_architecture("cosine_transformer", "cosine_transformer")
def cosine_transformer(args):
    from fairseq.models.transformer.transformer_legacy import base_architecture

    args.cosine_scale = getattr(args, "cosine_scale", 30.0)
    base_architecture(args)


@register_model_architecture("cosine_transformer", "cosine_transformer_tiny")
def cosine_transformer_tiny(args):
    args.cosine_scale = getattr(args, "cosine_scale", 30.0)
    tiny_architecture(args)
