"""``--task sparse_seq2seq``: fairseq's translation task plus masked decoding (and AS-Speed training).

Training and data are exactly ``--task translation`` (``fairseq-preprocess`` output, same
options). At generation time ``--decoding-topk K`` and ``--source-vocab-mask`` replace the beam
search by ``user_dir.search.MaskedBeamSearch``; a checkpoint trained with ``--task translation``
can be decoded with this task too.
"""
import logging
import math
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from sparse_softmax.decoding import source_vocab

from ..as_speed import ASSpeedConfig, ASSpeedTask
from ..options import CheckedArgs, UsageError, at_least, negative, validate
from ..search import MaskedBeamSearch, install

logger = logging.getLogger(__name__)


@dataclass
class MaskedDecodingConfig(FairseqDataclass):
    """The options this task adds to ``--task translation``."""

    decoding_topk: int = field(
        default=0,
        metadata={
            "help": "masked decoding: before each beam step keep only the K most probable next tokens "
            "and renormalise over them (Sparse-softmax decodes beam 5 with K=5); 0 = off. The mask is "
            "taken on the model's distribution before --min-len/--max-len/--prefix-size/"
            "--no-repeat-ngram-size/--unkpen act; K >= vocabulary size is plain beam search (a warning "
            "says so at start)",
            "check": at_least(0),
        },
    )
    source_vocab_mask: bool = field(
        default=False,
        metadata={
            "help": "only generate tokens that occur in the sentence's source, plus EOS and "
            "--source-vocab-allow; the distribution is renormalised over them (with --decoding-topk: "
            "the top K among them)"
        },
    )
    source_vocab_allow: str = field(
        default="",
        metadata={
            "help": "space-separated target-dictionary symbols that --source-vocab-mask always allows "
            "besides EOS (e.g. punctuation or 'UNK' for Gigaword)"
        },
    )
    decoding_mask_fill: float = field(
        default=-math.inf,
        metadata={
            "help": "score of masked tokens: -inf (default) never generates them; a large negative "
            "number (e.g. -10000; -inf itself is written --decoding-mask-fill=-inf) lets the beam fall back "
            "on them when fewer than 2 x beam tokens are kept",
            "check": negative(),
        },
    )


@dataclass
class SparseSeq2SeqConfig(TranslationConfig, MaskedDecodingConfig, ASSpeedConfig):
    pass


@register_task("sparse_seq2seq", dataclass=SparseSeq2SeqConfig)
class SparseSeq2SeqTask(CheckedArgs, ASSpeedTask, TranslationTask):
    cfg: SparseSeq2SeqConfig

    def __init__(self, cfg: SparseSeq2SeqConfig, src_dict, tgt_dict):
        validate(cfg, SparseSeq2SeqConfig)
        super().__init__(cfg, src_dict, tgt_dict)
        missing = [s for s in cfg.source_vocab_allow.split() if s not in tgt_dict.indices]
        if missing:
            raise UsageError(f"--source-vocab-allow: not in the target dictionary: {' '.join(missing)} "
                             f"(the dictionary has {len(tgt_dict)} symbols)")
        if cfg.decoding_topk >= len(tgt_dict):
            logger.warning(f"--decoding-topk {cfg.decoding_topk} >= {len(tgt_dict)} target symbols: no token is "
                           "masked by it, so decoding is " + ("--source-vocab-mask alone" if cfg.source_vocab_mask
                                                              else "plain beam search"))
        self.always_allowed = [tgt_dict.eos()] + [tgt_dict.index(s) for s in cfg.source_vocab_allow.split()]
        self.src_to_tgt = None  # source id -> target id; None when the dictionaries are the same
        if src_dict.symbols != tgt_dict.symbols:
            self.src_to_tgt = torch.tensor([tgt_dict.indices.get(s, tgt_dict.pad()) for s in src_dict.symbols])

    @property
    def masked_decoding(self) -> bool:
        return self.cfg.decoding_topk > 0 or self.cfg.source_vocab_mask

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
        if self.masked_decoding:
            _check_beam_search(args, prefix_allowed_tokens_fn)
        generator = super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
        if not self.masked_decoding:
            return generator
        search = MaskedBeamSearch(
            self.target_dictionary, self.cfg.decoding_topk, self.cfg.decoding_mask_fill, self.cfg.source_vocab_mask
        )
        return install(generator, search)

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        """fairseq stops on an example longer than the model takes with a bare ``Exception`` (a traceback), where
        it does not skip it (training always skips, with a counted warning): we say it in one line instead."""
        if ignore_invalid_inputs:
            return super().filter_indices_by_size(indices, dataset, max_positions, ignore_invalid_inputs)
        kept, ignored = dataset.filter_indices_by_size(indices, max_positions)
        if len(ignored):
            split = next((name for name, d in self.datasets.items() if d is dataset), "the input")
            raise UsageError(
                f"{len(ignored)} examples of {split} are longer than the model takes (source, target tokens at "
                f"most {tuple(max_positions)}; e.g. example {ignored[0]}: {tuple(dataset.size(ignored[0]))}): "
                "prepare the data to fit (prepare_*.py --hf-tokenizer cuts it for --arch hf_unilm), or skip such "
                "examples, counted, with --skip-invalid-size-inputs-valid-test")
        return kept

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        if self.cfg.source_vocab_mask:
            if not isinstance(getattr(generator, "search", None), MaskedBeamSearch):
                raise RuntimeError("--source-vocab-mask needs a generator built by this task's build_generator")
            src_tokens = sample["net_input"]["src_tokens"]
            src_to_tgt = None if self.src_to_tgt is None else self.src_to_tgt.to(src_tokens.device)
            tgt = self.target_dictionary
            generator.search.set_allowed(source_vocab(src_tokens, len(tgt), tgt.pad(), self.always_allowed, src_to_tgt))
        return super().inference_step(generator, models, sample, prefix_tokens=prefix_tokens, constraints=constraints)


def _check_beam_search(args, prefix_allowed_tokens_fn) -> None:
    """Masked decoding is a beam search: refuse the other search strategies instead of ignoring the mask."""
    others = {
        "--sampling": getattr(args, "sampling", False),
        "--diverse-beam-groups": getattr(args, "diverse_beam_groups", -1) > 0,
        "--diversity-rate": getattr(args, "diversity_rate", -1) > -1,
        "--match-source-len": getattr(args, "match_source_len", False),
        "--constraints": getattr(args, "constraints", None),
        "--score-reference": getattr(args, "score_reference", False),
        "prefix_allowed_tokens_fn": prefix_allowed_tokens_fn or getattr(args, "prefix_allowed_tokens_fn", None),
    }
    chosen = [flag for flag, on in others.items() if on]
    if chosen:
        raise UsageError(
            f"--decoding-topk / --source-vocab-mask work with plain beam search, not with {', '.join(chosen)}. "
            "For top-k sampling use --sampling --sampling-topk K instead of --decoding-topk."
        )
