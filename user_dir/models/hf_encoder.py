"""``--arch hf_encoder``: a pretrained Hugging Face encoder (BERT, RoBERTa, MiniLM, DeBERTa: whatever
``transformers.AutoModel`` loads) fine-tuned inside fairseq, with the task's classification heads on top.

The checkpoint is a local folder as ``save_pretrained`` writes it (``config.json``, the weights, the
tokenizer files); nothing is downloaded. The data must be tokenised with that folder's tokenizer
(``data-prep/prepare_classification.py --hf-tokenizer DIR``): its fairseq dictionary lists the tokenizer's
tokens, and this model maps every dictionary index back to the tokenizer's id (``<s>``, ``</s>``,
``<pad>``, ``<unk>`` to its CLS, SEP, PAD and UNK), so the encoder sees exactly the ids the tokenizer gives
for the same text. fairseq's checkpoints hold the fine-tuned weights; loading one (``fairseq-validate``,
``--restore-file``) reads the folder's configuration and tokenizer again, so it needs the same files: where
they are elsewhere, ``--model-overrides "{'hf_model_dir': 'DIR'}"`` says where.
"""

from dataclasses import dataclass, field

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.models import register_model
from omegaconf import MISSING
from torch import Tensor, nn

from .. import hf_checkpoint
from ..options import UsageError, validate
from .heads import EncoderWithHeads


@dataclass
class HFEncoderConfig(FairseqDataclass):
    hf_model_dir: str = field(
        default=MISSING,
        metadata={"help": "folder of a pretrained Hugging Face encoder as save_pretrained writes it (config.json, "
                  "weights, tokenizer files); the data must be tokenised with its tokenizer "
                  "(prepare_classification.py --hf-tokenizer); nothing is downloaded"},
    )


#: the missing-folder error's hint: a checkpoint keeps the folder's path from where it was trained
MOVED = "; a checkpoint trained elsewhere takes --model-overrides \"{'hf_model_dir': 'DIR'}\""


def hf_ids(dictionary, tokenizer) -> Tensor:
    """Each fairseq dictionary index's id in the tokenizer's vocabulary (see the module doc)."""
    vocab = tokenizer.get_vocab()
    specials = {dictionary.bos(): tokenizer.cls_token_id, dictionary.eos(): tokenizer.sep_token_id,
                dictionary.pad(): tokenizer.pad_token_id, dictionary.unk(): tokenizer.unk_token_id}
    if None in specials.values():
        raise UsageError(f"the tokenizer ({type(tokenizer).__name__}) has no CLS, SEP, PAD or UNK token: "
                         "--arch hf_encoder needs an encoder that marks sentences with them")
    # fairseq-preprocess pads dictionaries to a multiple of 8 with madeupwordNNNN entries; they never occur
    unknown = [s for i, s in enumerate(dictionary.symbols)
               if i not in specials and s not in vocab and not s.startswith("madeupword")]
    if unknown:
        raise UsageError(f"{len(unknown)} symbols of the data's dictionary (e.g. {' '.join(unknown[:3])}) are not "
                         "in the tokenizer's vocabulary: prepare the data with --hf-tokenizer and the same folder")
    return torch.tensor([specials.get(i, vocab.get(s, tokenizer.unk_token_id))
                         for i, s in enumerate(dictionary.symbols)])


@register_model("hf_encoder", dataclass=HFEncoderConfig)
class HFEncoderModel(EncoderWithHeads):
    config = HFEncoderConfig

    def __init__(self, encoder: nn.Module, to_hf: Tensor, padding_idx: int, max_positions: int):
        super().__init__(encoder.config.hidden_size, max_positions)
        self.encoder = encoder
        self.register_buffer("to_hf", to_hf, persistent=False)
        self.padding_idx = padding_idx

    @classmethod
    def build_model(cls, cfg: HFEncoderConfig, task):
        validate(cfg, HFEncoderConfig)
        tokenizer = hf_checkpoint.load(cfg.hf_model_dir, "AutoTokenizer", "--hf-model-dir", UsageError, MOVED)
        encoder = hf_checkpoint.load(cfg.hf_model_dir, "AutoModel", "--hf-model-dir", UsageError, MOVED)
        dictionary = task.source_dictionary
        return cls(encoder, hf_ids(dictionary, tokenizer), dictionary.pad(),
                   hf_checkpoint.longest_input(tokenizer, encoder.config))

    def features(self, src_tokens: Tensor) -> Tensor:
        mask = src_tokens.ne(self.padding_idx)
        return self.encoder(input_ids=self.to_hf[src_tokens], attention_mask=mask).last_hidden_state
