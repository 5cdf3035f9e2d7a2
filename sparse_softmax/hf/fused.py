"""The fused output layer for Hugging Face models: ``compute_loss_func=FusedTrainerLoss(model, "sparse_softmax", k=10)``.

A language model's output layer over a large vocabulary makes the largest tensors of a training step: the
(tokens × V) logits and their float32 gradient. ``FusedTrainerLoss`` hands the decoder's last hidden state to
``fused_output_loss`` instead, which computes the loss and its gradients from it and the output layer's weight block by
block without ever holding the logits (for sparse_softmax, a backward that touches only k + 1 of the V columns).

How it reaches the weight decides where it works. The Trainer runs the model without labels and calls the loss after
the model's forward, when a sharding engine has put the output layer's weight away again (FSDP reshards a unit after
its forward, DeepSpeed ZeRO-3 partitions it). So the loss is computed *inside the output layer's forward*: the model's
own call of the layer passes its input through, and the loss then calls the layer a second time with the labels.
The engines make a module's weight whole for its forward and send the gradients of that forward to their reduction
(FSDP2 and DeepSpeed ZeRO-3 by module hooks, whether the layer is a unit of its own or inside the root; DDP through
the graph), so one path is exact under each, with no code for any of them; the price, with the layer a sharded unit of its own,
is one more gather of its weight for the second call. A weight still sharded inside the layer's forward (tensor
parallelism) is refused in one line.

Built with the model, it wraps the output layer (``model.get_output_embeddings()``: an ``nn.Linear``, or PEFT's
``ModulesToSaveWrapper`` around the trained copy, ``modules_to_save=["lm_head"]``) on that one instance: while the
model trains with gradients, the layer's first call returns the hidden state it read (``outputs.logits`` is then that
hidden state). In evaluation, under ``torch.no_grad()`` and in ``generate()`` the layer computes its logits as before,
and the loss scores those as ``TrainerLoss`` does; the weights, ``state_dict`` and ``save_pretrained`` are untouched.

It supports the architectures whose logits are the output layer's (``SUPPORTED``; an encoder-decoder's decoder
scaling, as T5's, comes before the layer and is kept), and those that change them after it in a way the fused layer
computes too (``TRANSFORMS``): a fixed bias (BART's ``final_logits_bias``), a final soft-cap ``c·tanh(z / c)``
(Gemma 2, 3) or a scale (Granite, Cohere). While the layer hands the hidden state over, the model's transform is set
to do nothing, and the fused layer applies it. Any other architecture is refused in one line: the fused layer would
train another loss than the model's. Labels are shifted as the model's own loss shifts them (a decoder-only model's
position i predicts token i + 1; an encoder-decoder's decoder is fed shifted labels already), -100 is ignored and
``num_items_in_batch`` is honoured as by ``TrainerLoss``, whose schedules and AS-Speed callbacks work unchanged.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..losses import LossResult, fused_output_loss
from .loss import AS_LOSSES, TrainerLoss

DECODERS = ("bert", "cohere", "cohere2", "falcon", "gemma", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "granite",
            "llama", "mistral", "olmo", "olmo2", "olmo3", "opt", "phi", "phi3", "qwen2", "qwen3", "starcoder2")
#: model_type → kind: the architectures whose logits are the output layer's, or its as ``TRANSFORMS`` says. "bert" is
#: BERT as a decoder (``BertLMHeadModel``, ``is_decoder``: its prediction head's transform comes before the output layer);
#: "encoder-decoder" is ``EncoderDecoderModel`` (BERT2BERT) over such a decoder.
SUPPORTED = {**dict.fromkeys(DECODERS, "decoder"),
             **dict.fromkeys(("bart", "encoder-decoder", "marian", "mbart", "pegasus", "t5"), "encoder-decoder")}


#: what a transform's value is while the model hands the hidden state over ("add": a zero of the value's kind)
_NEUTRAL = {"softcap": None, "divide": 1.0, "multiply": 1.0}


class Transform(NamedTuple):
    """What a model does to its output layer's logits ``z``, from a value it reads at each forward."""

    holder: str  # "config" or "model": whose attribute the value is
    attribute: str
    kind: str  # "add": z + value; "softcap": value·tanh(z / value), none if None; "divide": z / value; "multiply"


#: model_type → its transform of the logits. The value is read when the loss is computed, so a moved buffer or a
#: changed config counts.
TRANSFORMS = {
    **dict.fromkeys(("bart", "mbart", "marian", "pegasus"), Transform("model", "final_logits_bias", "add")),
    **dict.fromkeys(("gemma2", "gemma3_text"), Transform("config", "final_logit_softcapping", "softcap")),
    "granite": Transform("config", "logits_scaling", "divide"),
    **dict.fromkeys(("cohere", "cohere2"), Transform("model", "logit_scale", "multiply")),
}
#: TrainerLoss name → fused_output_loss's
FUSED_LOSSES = {"softmax": "cross_entropy", "sparse_softmax": "sparse_softmax", "as_softmax": "as_softmax"}


class FusedTrainerLoss(TrainerLoss):
    """``TrainerLoss`` computed from the model's last hidden state by ``fused_output_loss``.

    Args:
        model: a ``transformers`` model of a ``SUPPORTED`` architecture (or a PEFT model of one); its output layer is
            wrapped here.
        name: "softmax" (cross-entropy), "sparse_softmax" or "as_softmax".
        **options: as ``TrainerLoss``'s (``k``, ``delta``, ``label_smoothing``, ``warmup_ratio``, ``anneal_ratio``,
            ``anneal_from``, ``ignore_index``; ``impl`` and ``tiles`` reach ``fused_output_loss``). ``causal_lm`` is
            the model's own: whether its labels are shifted.

    Raises:
        ValueError: an architecture, an output layer or a loss the fused layer does not compute exactly, in one line.
    """

    def __init__(self, model: nn.Module, name: str, **options):
        if name not in FUSED_LOSSES:
            raise ValueError(f"the fused output layer computes {', '.join(FUSED_LOSSES)}, not {name!r}: use "
                             "TrainerLoss, which scores the logits")
        if "causal_lm" in options:
            raise ValueError("FusedTrainerLoss takes causal_lm from the model's config")
        model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model's own
        model_type = _checked_model_type(model)
        self.layer = model.get_output_embeddings()  # what the model calls, and engines wrap
        linear = _trained_linear(self.layer, model_type)
        super().__init__(name, causal_lm=SUPPORTED[model_type] == "decoder", **options)
        self.linear = linear
        self._deferred = False  # the last forward handed over its hidden state, not its logits
        self._transform = TRANSFORMS.get(model_type)
        self._model = model
        self._set_aside = None  # the transform's value while the model's forward hands the hidden state over
        if self._transform is not None:
            model.register_forward_pre_hook(self._transform_off)
            model.register_forward_hook(self._transform_on, always_call=True)
        layer_forward = linear.forward

        def forward(hidden: Tensor, scoring: Callable[[Tensor, Tensor, Tensor | None], LossResult] | None = None):
            if scoring is not None:  # the loss's call: the engine has made the weight whole for this forward
                return scoring(hidden, linear.weight, linear.bias)
            self._deferred = linear.training and torch.is_grad_enabled()
            if self._deferred:
                return _HandedOver.apply(hidden, linear.weight, linear.bias)
            return layer_forward(hidden)

        linear.forward = forward

    def _loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """The sum over the rows, from the hidden state ``logits`` holds when the output layer handed it over."""
        if not self._deferred:
            return super()._loss(logits, target)
        self._deferred = False
        name, options = self._scheduled(self.linear.out_features)
        scale, extra_bias, softcap = self._terms()

        def scoring(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> LossResult:
            _check_whole(weight)
            if extra_bias is not None:
                bias = extra_bias.to(weight.dtype) if bias is None else bias + extra_bias.to(weight.dtype)
            if scale != 1:  # scale·(h·Wᵀ + b) = (scale·h)·Wᵀ + scale·b
                hidden, bias = hidden * scale, None if bias is None else bias * scale
            hidden = hidden.to(weight.dtype)
            if self.name == "sparse_softmax" and torch.is_grad_enabled():
                self._watch_sparse(lambda rows: _capped(F.linear(hidden[rows], weight, bias), softcap), target,
                                   self.options["k"])
            return fused_output_loss(hidden, weight, target, FUSED_LOSSES[name], bias=bias, softcap=softcap,
                                     ignore_index=self.ignore_index, reduction="sum", **options)

        out = self.layer(logits, scoring=scoring)  # by keyword: a tensor-parallel input hook passes on one positional
        return self._recorded(name, options, target, out if name in AS_LOSSES else out.loss)

    def _terms(self) -> tuple[float, Tensor | None, float | None]:
        """The model's transform of the logits as the fused layer's terms: (scale, a bias added to the layer's,
        soft-cap)."""
        if self._transform is None:
            return 1.0, None, None
        value = getattr(self._holder(), self._transform.attribute)
        kind = self._transform.kind
        if kind == "add":
            return 1.0, value.reshape(-1), None
        if kind == "softcap":
            return 1.0, None, value
        return (1 / value if kind == "divide" else value), None, None

    def _holder(self):
        return self._model.config if self._transform.holder == "config" else self._model

    def _transform_off(self, model: nn.Module, args) -> None:
        """Before a forward that hands the hidden state over, the model's transform set to do nothing."""
        if model.training and torch.is_grad_enabled():
            holder, attribute = self._holder(), self._transform.attribute
            self._set_aside = getattr(holder, attribute)
            kind = self._transform.kind
            setattr(holder, attribute, self._set_aside.new_zeros(()) if kind == "add" else _NEUTRAL[kind])

    def _transform_on(self, model: nn.Module, args, output) -> None:
        if self._set_aside is not None:
            setattr(self._holder(), self._transform.attribute, self._set_aside)
            self._set_aside = None


def _checked_model_type(model: nn.Module) -> str:
    """The model's ``model_type``, if the fused layer computes its loss exactly; else a one-line ``ValueError``."""
    config = model.config
    model_type = getattr(config, "model_type", type(model).__name__)
    if model_type not in SUPPORTED:
        raise ValueError(f"the fused output layer supports {', '.join(sorted(SUPPORTED))}, not {model_type!r}: "
                         "use TrainerLoss")
    decoder_config = getattr(config, "decoder", config) if model_type == "encoder-decoder" else config
    decoder_type = getattr(decoder_config, "model_type", None)
    if decoder_type == "bert" and not decoder_config.is_decoder:
        raise ValueError("this BERT is not a decoder (is_decoder=False): a masked LM, which the fused loss does "
                         "not train; use TrainerLoss")
    plain = [kind for kind in DECODERS if kind not in TRANSFORMS]  # the config of a transform would be the decoder's
    if model_type == "encoder-decoder" and decoder_type not in plain:
        raise ValueError(f"the fused output layer supports an encoder-decoder whose decoder is one of "
                         f"{', '.join(plain)}, not {decoder_type!r}: use TrainerLoss")
    return model_type


def _trained_linear(layer: nn.Module, model_type: str) -> nn.Linear:
    """The ``nn.Linear`` that computes the logits: the output layer, or the copy PEFT trains in its place
    (``ModulesToSaveWrapper``, which passes its arguments on to the active adapter's copy)."""
    if hasattr(layer, "modules_to_save") and hasattr(layer, "original_module"):
        linear = layer.modules_to_save[layer.active_adapters[0]]
    else:
        linear = layer
    # a subclass that keeps nn.Linear's forward (FSDP2's FSDPLinear) computes the same logits
    if not isinstance(linear, nn.Linear) or type(linear).forward is not nn.Linear.forward:
        raise ValueError(f"{model_type}'s output layer is a {type(linear).__name__}, not an nn.Linear")
    return linear


def _check_whole(weight: Tensor) -> None:
    """Refuses, in one line, an output layer whose weight is still sharded inside its own forward."""
    if hasattr(weight, "full_tensor"):
        raise ValueError("the output layer's weight is a DTensor inside its forward (sharded by tensor parallelism, "
                         "not FSDP): the fused output layer needs the whole weight; use TrainerLoss")


def _capped(logits: Tensor, softcap: float | None) -> Tensor:
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


class _HandedOver(torch.autograd.Function):
    """The hidden state the output layer hands over, tied in autograd's graph to the layer's weight and bias, with no
    gradient through the tie: DistributedDataParallel finds the parameters a forward used in the graph of its outputs,
    and would otherwise count them unused and then see their gradient arrive from the loss's call ("marked as ready
    twice"). A detached alias, not a view: FSDP2 warns of a module that returns a view of its input."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return hidden.detach()

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None, None
