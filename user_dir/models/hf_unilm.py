"""``--arch hf_unilm``: sequence-to-sequence fine-tuning of a pretrained BERT checkpoint as UniLM does it.

Both papers' generation results fine-tune UniLM, one BERT that reads source and target as one sequence through
a self-attention mask: the source is read bidirectionally and never sees the target; each target position sees
the whole source and the target before it, at every layer; segment ids tell the two apart (0 source, 1 target)
where the checkpoint has them. Positions run on from the source into the target.

Which token predicts a target token: as UniLM decodes, a ``[MASK]`` at the target token's own position, which
sees the source and the real target tokens before it (and itself). Training gives every target position such a
mask beside the real tokens, so one pass scores all of them (s2s-ft's "pseudo-masks"); this is the question the
checkpoint was pretrained to answer (fill a [MASK] from its context), not "what comes after this token", which
plain teacher forcing would ask of it. Decoding step ``s`` computes two positions: the real token chosen at step
``s - 1``, whose keys and values join the cache, and the mask at ``s``, whose output is the prediction.

fairseq's encoder-decoder interface is kept, so ``fairseq-train/-generate/-interactive/-validate``, beam search
(``--task sparse_seq2seq`` masks included) and every criterion work unchanged: the *encoder* runs the
transformer over ``[CLS] source [SEP]`` and keeps each layer's keys and values; the *decoder* runs the same
layers over the target positions, attending to those keys and values and to its own cache
(``reorder_incremental_state`` reorders it with the beams).

The output layer is the checkpoint's word embeddings (tied), after its MLM head transform (dense, activation,
LayerNorm) when the checkpoint has one and a fresh one when it has not; the log says which. The embedding
rows are taken in the data dictionary's order (``hf_encoder.hf_ids``: the prep's dictionary lists the
tokenizer's vocabulary), so the output layer is one ``nn.Linear`` over the dictionary and
``--fused-output-layer`` applies as to any fairseq decoder.

Lengths: source (with its CLS and SEP) and target (with its end token) share the checkpoint's position
embeddings. ``--max-target-tokens N`` keeps ``N + 1`` positions for the target and gives the source the rest,
through the model's ``max_positions``: longer examples are refused in one line naming the split and the
limits, or skipped and counted with ``--skip-invalid-size-inputs-valid-test``; decoding stops at the limit.
``data-prep/prepare_squad_qg.py`` and ``prepare_gigaword.py --hf-tokenizer DIR --max-target-tokens N`` cut
the data to fit.
"""

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, FairseqIncrementalDecoder, register_model
from torch import Tensor, nn

from .. import hf_checkpoint
from ..options import UsageError, add_checked_args, at_least, validate
from .hf_encoder import MOVED, HFEncoderConfig, hf_ids

logger = logging.getLogger(__name__)

#: segment (token type) ids of the source and the target, as UniLM
SOURCE, TARGET = 0, 1


@dataclass
class HFUniLMConfig(HFEncoderConfig):
    max_target_tokens: int = field(
        default=hf_checkpoint.MAX_TARGET_TOKENS,
        metadata={"help": "longest target in the checkpoint's tokens (its end token not counted); the source gets "
                  "the rest of the checkpoint's positions. Prepare the data with the same value "
                  "(prepare_*.py --hf-tokenizer DIR --max-target-tokens N)", "check": at_least(1)},
    )


class Transformer(nn.Module):
    """The checkpoint's embeddings and layers, run under an explicit attention mask with extra keys and values
    (the source's, a decoding cache) in front of each layer's own."""

    def __init__(self, body: nn.Module, embed_tokens: nn.Embedding):
        super().__init__()
        config, embeddings = body.config, body.embeddings
        self.embed_tokens = embed_tokens
        self.embed_positions = embeddings.position_embeddings
        # a checkpoint with one segment (RoBERTa-like) has no way to tell target from source
        types = getattr(embeddings, "token_type_embeddings", None)
        self.embed_segments = types if types is not None and types.num_embeddings > TARGET else None
        self.embed_norm, self.embed_dropout = embeddings.LayerNorm, embeddings.dropout
        self.layers = body.encoder.layer
        self.heads = config.num_attention_heads
        self.attention_dropout = config.attention_probs_dropout_prob

    def embed(self, tokens: Tensor, positions: Tensor, segment: int) -> Tensor:
        x = self.embed_tokens(tokens) + self.embed_positions(positions)
        if self.embed_segments is not None:
            x = x + self.embed_segments.weight[segment]
        return self.embed_dropout(self.embed_norm(x))

    def _split(self, x: Tensor) -> Tensor:
        return x.view(x.size(0), x.size(1), self.heads, -1).transpose(1, 2)

    def forward(self, x: Tensor, mask: Tensor, memory: Optional[List[tuple[Tensor, Tensor]]] = None):
        """``x`` (B, L, H) through every layer; position ``i`` attends to the keys ``mask[:, :, i]`` allows
        (``(B or 1, 1, L, M + L)``: the ``M`` memory keys of the layer, then the ``L`` of ``x``). Returns the
        output and each layer's keys and values of ``x`` (B, heads, L, H / heads)."""
        own = []
        for number, layer in enumerate(self.layers):
            attention = layer.attention
            q, k, v = (self._split(f(x)) for f in (attention.self.query, attention.self.key, attention.self.value))
            own.append((k, v))
            if memory is not None:
                k, v = (torch.cat([m, t], dim=2) for m, t in zip(memory[number], (k, v)))
            p = self.attention_dropout if self.training else 0.0
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
            context = context.transpose(1, 2).reshape(x.shape)
            out = attention.output
            x = out.LayerNorm(out.dropout(out.dense(context)) + x)
            hidden = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(x))
            x = layer.output.LayerNorm(layer.output.dropout(layer.output.dense(hidden)) + x)
        return x, own


def target_mask(query_positions: Tensor, query_real: Tensor, key_positions: Tensor) -> Tensor:
    """(Lq, Lk): which real target tokens (at ``key_positions``) a target query sees: the real tokens before its
    position, and a real token also itself. Relative positions, the same for every sentence of the batch."""
    before = key_positions[None, :] < query_positions[:, None]
    return before | ((key_positions[None, :] == query_positions[:, None]) & query_real[:, None])


class UniLMEncoder(FairseqEncoder):
    """``[CLS] source [SEP]`` through the transformer, bidirectionally; keeps each layer's keys and values."""

    def __init__(self, dictionary, transformer: Transformer, max_source_positions: int):
        super().__init__(dictionary)
        self.max_source_positions = max_source_positions
        # shared with the decoder, which registers it: one copy of the weights in the model and its checkpoints
        self.__dict__["transformer"] = transformer
        self.cls = dictionary.bos()  # the hf_ids table maps <s> to the tokenizer's CLS

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, **unused):
        tokens = torch.cat([src_tokens.new_full((src_tokens.size(0), 1), self.cls), src_tokens], dim=1)
        keep = tokens.ne(self.dictionary.pad())
        positions = (keep.cumsum(dim=1) - 1).clamp(min=0)  # sources are left-padded: count the real tokens
        x = self.transformer.embed(tokens, positions, SOURCE)
        _, kv = self.transformer(x, keep[:, None, None, :])
        return {"keys": [k for k, _ in kv], "values": [v for _, v in kv], "source_mask": [keep],
                "source_length": [keep.sum(dim=1)]}

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        return {key: [t.index_select(0, new_order) for t in tensors] for key, tensors in encoder_out.items()}

    def max_positions(self) -> int:
        """The source as the data holds it (its tokens and SEP): with the CLS the model prepends and the target's
        positions it fills the checkpoint's."""
        return self.max_source_positions


class UniLMDecoder(FairseqIncrementalDecoder):
    """The target positions through the same transformer (see the module doc); logits are
    ``output_projection(features)``, so ``--fused-output-layer`` can compute them itself."""

    logits_are_output_projection = True  # what --fused-output-layer relies on (criterions/base.py)

    def __init__(self, dictionary, transformer: Transformer, head: nn.Module, bias: Tensor, mask_token: int,
                 max_target_positions: int):
        super().__init__(dictionary)
        self.transformer, self.head, self.mask_token = transformer, head, mask_token
        width = transformer.embed_tokens.embedding_dim
        self.output_projection = nn.Linear(width, len(dictionary))
        self.output_projection.weight = transformer.embed_tokens.weight
        self.output_projection.bias.data.copy_(bias)
        self.max_target_positions = max_target_positions

    def forward(self, prev_output_tokens: Tensor, encoder_out: Dict[str, List[Tensor]],
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                features_only: bool = False, **unused):
        x = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        return (x if features_only else self.output_layer(x)), {"attn": [None], "inner_states": None}

    def extract_features(self, prev_output_tokens: Tensor, encoder_out: Dict[str, List[Tensor]],
                         incremental_state=None) -> Tensor:
        """The head's features of the mask at each target position (at the last one only when decoding)."""
        steps = prev_output_tokens.size(1)  # prev_output_tokens = [</s>, t1 ... t(n)]: n real tokens, n+1 masks
        device = prev_output_tokens.device
        cache = None if incremental_state is None else self.get_incremental_state(incremental_state, "cache")
        if incremental_state is None:  # every position at once: real tokens 0..n-1, then masks 0..n
            real = prev_output_tokens[:, 1:]
            real_positions, mask_positions = torch.arange(steps - 1, device=device), torch.arange(steps, device=device)
            cached = real_positions[:0]
        else:  # the real token chosen at the last step (none at the first), and the mask at this one
            real = prev_output_tokens[:, max(steps - 1, 1):]
            real_positions = torch.arange(max(steps - 2, 0), steps - 1, device=device)
            mask_positions = torch.arange(steps - 1, steps, device=device)
            cached = torch.arange(0 if cache is None else cache["key0"].size(2), device=device)
        masks = real.new_full((real.size(0), mask_positions.numel()), self.mask_token)
        start = encoder_out["source_length"][0][:, None]
        x = self.transformer.embed(torch.cat([real, masks], dim=1),
                                   start + torch.cat([real_positions, mask_positions]), TARGET)

        query_positions = torch.cat([real_positions, mask_positions])
        is_real = torch.arange(query_positions.numel(), device=device) < real.size(1)
        mask = torch.cat([target_mask(query_positions, is_real, torch.cat([cached, real_positions])),
                          torch.eye(query_positions.numel(), dtype=torch.bool, device=device)[:, real.size(1):]],
                         dim=1)
        source = encoder_out["source_mask"][0][:, None, None, :].expand(-1, 1, query_positions.numel(), -1)
        mask = torch.cat([source, mask[None, None].expand(x.size(0), 1, -1, -1)], dim=-1)
        memory = list(zip(encoder_out["keys"], encoder_out["values"]))
        if cache is not None:
            memory = [(torch.cat([k, cache[f"key{i}"]], dim=2), torch.cat([v, cache[f"value{i}"]], dim=2))
                      for i, (k, v) in enumerate(memory)]
        x, own = self.transformer(x, mask, memory)
        if incremental_state is not None and real.size(1):
            n = real.size(1)
            new = {f"{name}{i}": t[:, :, :n] for i, kv in enumerate(own) for name, t in zip(("key", "value"), kv)}
            if cache is not None:
                new = {name: torch.cat([cache[name], t], dim=2) for name, t in new.items()}
            self.set_incremental_state(incremental_state, "cache", new)
        return self.head(x[:, real.size(1):])

    def output_layer(self, features: Tensor) -> Tensor:
        return self.output_projection(features)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor) -> None:
        cache = self.get_incremental_state(incremental_state, "cache")
        if cache is not None:
            self.set_incremental_state(incremental_state, "cache",
                                       {name: t.index_select(0, new_order) for name, t in cache.items()})

    def max_positions(self) -> int:
        return self.max_target_positions


def load_masked_lm(folder: str):
    """The checkpoint as a masked LM, and whether its MLM head transform came from the checkpoint (a model saved
    without one, such as a sentence-embedding encoder, gets transformers' fresh initialisation)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists the head as missing, which we say in one line
    try:
        model, info = hf_checkpoint.load(folder, "AutoModelForMaskedLM", "--hf-model-dir", UsageError, MOVED,
                                         output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    if model.config.model_type != "bert" or not hasattr(model, "cls"):
        raise UsageError(f"--hf-model-dir {folder}: --arch hf_unilm takes a BERT checkpoint (BERT, MiniLM: "
                         f"config model_type 'bert'); this one is {model.config.model_type!r}")
    fresh = any(key.startswith("cls.predictions.transform.") for key in info["missing_keys"])
    return model, not fresh


@register_model("hf_unilm", dataclass=HFUniLMConfig)
class HFUniLMModel(FairseqEncoderDecoderModel):
    @classmethod
    def add_args(cls, parser):
        # fairseq builds model options without defaults (architectures fill them in later)
        add_checked_args(parser, HFUniLMConfig(), delete_default=True)

    @classmethod
    def build_model(cls, cfg: HFUniLMConfig, task):
        validate(cfg, HFUniLMConfig)
        dictionary = task.source_dictionary
        if dictionary.symbols != task.target_dictionary.symbols:
            raise UsageError("--arch hf_unilm reads source and target with one vocabulary: binarise with "
                             "--joined-dictionary (prepare_*.py --hf-tokenizer does)")
        tokenizer = hf_checkpoint.load(cfg.hf_model_dir, "AutoTokenizer", "--hf-model-dir", UsageError, MOVED)
        if tokenizer.mask_token_id is None:
            raise UsageError(f"--hf-model-dir {cfg.hf_model_dir}: its tokenizer has no [MASK] token, with which "
                             "--arch hf_unilm predicts each target token")
        mlm, pretrained_head = load_masked_lm(cfg.hf_model_dir)
        longest = hf_checkpoint.longest_input(tokenizer, mlm.config)
        if cfg.max_target_tokens > longest - 4:
            raise UsageError(f"--max-target-tokens {cfg.max_target_tokens} leaves no room for a source in the "
                             f"checkpoint's {longest} positions (CLS, a source token, SEP and the target's end)")
        to_hf = hf_ids(dictionary, tokenizer)
        mask = dictionary.index(tokenizer.mask_token)
        if mask == dictionary.unk():
            raise UsageError(f"the data's dictionary has no {tokenizer.mask_token}: prepare the data with "
                             "--hf-tokenizer and the same checkpoint")
        body, predictions = mlm.bert, mlm.cls.predictions
        embed = nn.Embedding(len(dictionary), body.config.hidden_size, padding_idx=dictionary.pad())
        embed.weight.data.copy_(body.embeddings.word_embeddings.weight.data[to_hf])
        del body.embeddings.word_embeddings  # replaced by its rows in the dictionary's order
        logger.info(f"hf_unilm: {'the checkpoint' if pretrained_head else 'a fresh (randomly initialised)'} "
                    f"MLM head transform before the tied output layer (from {cfg.hf_model_dir})")
        transformer, target = Transformer(body, embed), cfg.max_target_tokens + 1  # the target's end token too
        encoder = UniLMEncoder(dictionary, transformer, longest - 1 - target)
        decoder = UniLMDecoder(dictionary, transformer, predictions.transform, predictions.bias.data[to_hf], mask,
                               target)
        return cls(encoder, decoder)
