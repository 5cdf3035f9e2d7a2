"""The fused output layer for Hugging Face models: ``compute_loss_func=FusedTrainerLoss(model, "sparse_softmax", k=10)``.

A language model's output layer over a large vocabulary makes the largest tensors of a training step: the
(tokens × V) logits and their float32 gradient. ``FusedTrainerLoss`` hands the decoder's last hidden state and the
output layer's weight and bias to ``fused_output_loss`` instead, which computes the loss and its gradients block by
block without ever holding the logits (for sparse_softmax, a backward that touches only k + 1 of the V columns).

Built with the model, it makes the model's output layer (``model.get_output_embeddings()``, an ``nn.Linear``) pass its
input through while the model trains with gradients: ``outputs.logits`` is then the hidden state the layer would have
read, which the loss scores. In evaluation, under ``torch.no_grad()`` and in ``generate()`` the layer computes its
logits as before, and the loss scores those as ``TrainerLoss`` does; the weights, ``state_dict`` and
``save_pretrained`` are untouched (only the layer's ``forward`` is wrapped, on that one instance).

It supports the architectures whose logits are the output layer's and nothing more (``SUPPORTED``; an
encoder-decoder's decoder scaling, as T5's, comes before the layer and is kept), and those that add a fixed bias after
it (BART's ``final_logits_bias``, which becomes the fused layer's bias). One that changes the logits otherwise (a final
soft-cap, a logit scale) is refused in one line: the fused layer would train another loss than the model's. Labels are
shifted as the model's own loss shifts them (a decoder-only model's position i predicts token i + 1; an
encoder-decoder's decoder is fed shifted labels already), -100 is ignored and ``num_items_in_batch`` is honoured as by
``TrainerLoss``, whose schedules and AS-Speed callbacks work unchanged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..losses import fused_output_loss
from .loss import AS_LOSSES, TrainerLoss

#: model_type → kind: the architectures whose logits are ``lm_head(hidden)``, plus ``final_logits_bias`` for those in
#: ``FINAL_BIAS``. "bert" is BERT as a decoder (``BertLMHeadModel``, ``is_decoder``: its prediction head's transform
#: comes before the output layer); "encoder-decoder" is ``EncoderDecoderModel`` (BERT2BERT) over such a decoder.
SUPPORTED = {"llama": "decoder", "mistral": "decoder", "qwen2": "decoder", "qwen3": "decoder", "gpt2": "decoder",
             "bert": "decoder", "t5": "encoder-decoder", "encoder-decoder": "encoder-decoder",
             "bart": "encoder-decoder", "mbart": "encoder-decoder", "marian": "encoder-decoder",
             "pegasus": "encoder-decoder"}
#: The architectures that add the buffer ``final_logits_bias`` to the output layer's logits: the fused layer takes it
#: as the layer's bias, and the model adds a zero in its place while it hands the hidden state over.
FINAL_BIAS = {"bart", "mbart", "marian", "pegasus"}
#: model_type → what it does to the logits after the output layer, which the fused layer cannot reproduce.
REFUSED = {"gemma2": "a final logit soft-cap", "gemma3": "a final logit soft-cap", "gemma3_text": "a final logit soft-cap",
           "cohere": "a logit scale", "granite": "a logit scale"}
#: TrainerLoss name → fused_output_loss's
FUSED_LOSSES = {"softmax": "cross_entropy", "sparse_softmax": "sparse_softmax", "as_softmax": "as_softmax"}


class FusedTrainerLoss(TrainerLoss):
    """``TrainerLoss`` computed from the model's last hidden state by ``fused_output_loss``.

    Args:
        model: a ``transformers`` model of a ``SUPPORTED`` architecture; its output layer is wrapped here.
        name: "softmax" (cross-entropy), "sparse_softmax" or "as_softmax".
        **options: as ``TrainerLoss``'s (``k``, ``delta``, ``label_smoothing``, ``warmup_ratio``, ``anneal_ratio``,
            ``anneal_from``, ``ignore_index``; ``impl`` and ``tiles`` reach ``fused_output_loss``). ``causal_lm`` is
            the model's own: whether its labels are shifted.

    Raises:
        ValueError: an architecture or a loss the fused layer does not compute exactly, in one line.
    """

    def __init__(self, model: nn.Module, name: str, **options):
        if name not in FUSED_LOSSES:
            raise ValueError(f"the fused output layer computes {', '.join(FUSED_LOSSES)}, not {name!r}: use "
                             "TrainerLoss, which scores the logits")
        if "causal_lm" in options:
            raise ValueError("FusedTrainerLoss takes causal_lm from the model's config")
        config = model.config
        model_type = getattr(config, "model_type", type(model).__name__)
        if model_type in REFUSED:
            raise ValueError(f"{model_type} applies {REFUSED[model_type]} to the logits after its output layer, which "
                             "the fused output layer does not: use TrainerLoss")
        if model_type not in SUPPORTED:
            raise ValueError(f"the fused output layer supports {', '.join(sorted(SUPPORTED))}, not {model_type!r}: "
                             "use TrainerLoss")
        decoder_config = getattr(config, "decoder", config) if model_type == "encoder-decoder" else config
        decoder_type = getattr(decoder_config, "model_type", None)
        if decoder_type == "bert" and not decoder_config.is_decoder:
            raise ValueError("this BERT is not a decoder (is_decoder=False): a masked LM, which the fused loss does "
                             "not train; use TrainerLoss")
        if model_type == "encoder-decoder" and SUPPORTED.get(decoder_type) != "decoder":
            raise ValueError(f"the fused output layer supports an encoder-decoder whose decoder is one of "
                             f"{', '.join(k for k, v in sorted(SUPPORTED.items()) if v == 'decoder')}, not "
                             f"{decoder_type!r}: use TrainerLoss")
        head = model.get_output_embeddings()
        if type(head) is not nn.Linear:
            raise ValueError(f"{model_type}'s output layer is a {type(head).__name__}, not an nn.Linear")
        super().__init__(name, causal_lm=SUPPORTED[model_type] == "decoder", **options)
        self.head = head
        self._deferred = False  # the last forward handed over its hidden state, not its logits
        # the model that adds final_logits_bias (read when used: moving the model replaces the buffer), and the buffer
        # while a zero stands in its place
        self._final_bias_of = model if model_type in FINAL_BIAS else None
        self._set_aside: Tensor | None = None
        if self._final_bias_of is not None:
            model.register_forward_pre_hook(self._zero_final_bias)
            model.register_forward_hook(self._restore_final_bias, always_call=True)
        layer_forward = head.forward

        def forward(hidden: Tensor) -> Tensor:
            self._deferred = head.training and torch.is_grad_enabled()
            return _HandedOver.apply(hidden, head.weight, head.bias) if self._deferred else layer_forward(hidden)

        head.forward = forward

    def _loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """The sum over the rows, from the hidden state ``logits`` holds when the output layer handed it over."""
        if not self._deferred:
            return super()._loss(logits, target)
        self._deferred = False
        hidden, weight, bias = logits, self.head.weight, self._bias()
        name, options = self._scheduled(weight.size(0))
        if self.name == "sparse_softmax" and torch.is_grad_enabled():
            self._watch_sparse(lambda rows: F.linear(hidden[rows], weight, bias), target, self.options["k"])
        out = fused_output_loss(hidden.to(weight.dtype), weight, target, FUSED_LOSSES[name], bias=bias,
                                ignore_index=self.ignore_index, reduction="sum", **options)
        return self._recorded(name, options, target, out if name in AS_LOSSES else out.loss)

    def _bias(self) -> Tensor | None:
        """The bias of the logits: the output layer's, and ``final_logits_bias`` where the model adds it."""
        bias = self.head.bias
        if self._final_bias_of is not None:
            final = self._final_bias_of.final_logits_bias.reshape(-1).to(self.head.weight.dtype)
            bias = final if bias is None else bias + final
        return bias

    def _zero_final_bias(self, model: nn.Module, args) -> None:
        """Before a forward that hands the hidden state over, a zero in place of ``final_logits_bias``."""
        if model.training and torch.is_grad_enabled():
            self._set_aside = model.final_logits_bias
            model.final_logits_bias = self._set_aside.new_zeros(())

    def _restore_final_bias(self, model: nn.Module, args, output) -> None:
        if self._set_aside is not None:
            model.final_logits_bias, self._set_aside = self._set_aside, None


class _HandedOver(torch.autograd.Function):
    """The hidden state the output layer hands over, tied in autograd's graph to the layer's weight and bias, with no
    gradient through the tie: the loss uses them after the model's forward, and DistributedDataParallel, which finds
    the parameters a forward used in the graph of its outputs, would otherwise count them unused and then see their
    gradient arrive ("marked as ready twice")."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None, None
