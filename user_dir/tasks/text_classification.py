"""``--task text_classification``: single-label, multi-label and token classification with any of the
plugin's criterions, scored over whole splits (accuracy, micro/macro-F1, entity F1).

Data is fairseq's RoBERTa layout, as ``data-prep/prepare_classification.py`` and
``data-prep/prepare_conll.py`` write it: ``DATA/input0`` (text) and ``DATA/label`` (labels), both
binarised with ``fairseq-preprocess --only-source``. A label line holds one label, a space-separated
label set (``--multi-label``), or one label per input token (``--token-level``; sub-word pieces after
the first of a word carry ``--ignore-label`` and are neither trained nor scored). What differs between
the three kinds (targets, criterion rows, metrics) is in ``label_kinds.py``; the task picks one at start.

Models: fairseq's RoBERTa (``--arch roberta_base`` with ``--encoder-layers`` etc. to shrink it), the
plugin's ``--arch text_encoder``, or a pretrained Hugging Face encoder (``--arch hf_encoder``); the task adds
a classification head (linear, or cosine logits for ``--criterion am_softmax`` with ``--classifier cosine``) to
the model's ``classification_heads``.
Criterions get their rows from ``loss_batch``; the task logs per-class (or per-entity) counts with
every batch and turns their sums into the split's metrics, which ``--best-checkpoint-metric`` can
name (``accuracy``, ``macro_f1``, ``micro_f1``, ``entity_f1``, and with ``--out-of-scope-label``
``in_scope_accuracy`` and ``out_of_scope_recall``; with ``--maximize-best-checkpoint-metric``).
``fairseq-validate --valid-subset test`` scores a checkpoint on the test split.
"""

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq.data import (BaseWrapperDataset, Dictionary, IdDataset, NestedDictionaryDataset, NumelDataset,
                          NumSamplesDataset, PrependTokenDataset, RightPadDataset, SortDataset, data_utils)
from fairseq.dataclass import ChoiceEnum
from fairseq.logging import metrics
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II, MISSING

from ..as_speed import ASSpeedConfig, ASSpeedTask
from ..criterions.base import LossBatch
from ..models.heads import ClassificationHead
from ..options import CheckedArgs, UsageError, at_least, in_range, positive, unset_or, validate
from .label_kinds import IGNORE, LabelKind, MultiLabel, SingleLabel, TokenLabels

logger = logging.getLogger(__name__)


@dataclass
class TextClassificationConfig(ASSpeedConfig):
    data: str = field(
        default=MISSING, metadata={"help": "folder with input0/ and label/ (fairseq-preprocess --only-source)"}
    )
    num_classes: int = field(
        default=-1,
        metadata={"help": "number of classes; checked against the label dictionary (-1: take it from there)",
                  "check": unset_or(at_least(1))},
    )
    multi_label: bool = field(
        default=False, metadata={"help": "each example has a set of labels (space-separated on its label line)"}
    )
    token_level: bool = field(
        default=False, metadata={"help": "one label per input token (e.g. CoNLL NER); scored by entity F1"}
    )
    ignore_label: str = field(
        default="X",
        metadata={"help": "--token-level: the label of pieces that are not scored (a word's pieces after its first)"},
    )
    out_of_scope_label: str = field(
        default="",
        metadata={"help": "single-label: the class of out-of-scope examples (CLINC150's 'oos'); validations then also "
                  "log in_scope_accuracy and out_of_scope_recall, the metrics CLINC150 is read by (Larson et al. "
                  "2019), which --best-checkpoint-metric can name"},
    )
    predict_top_n: int = field(
        default=0,
        metadata={"help": "--multi-label: predict the N best-scored classes instead of those scored > 0 "
                  "(Su's loss puts the decision boundary at 0); N >= the number of classes predicts every class "
                  "(a warning says so)", "check": at_least(0)},
    )
    classifier: ChoiceEnum(["linear", "cosine"]) = field(
        default="linear",
        metadata={"help": "output layer of the head: 'linear', or 'cosine' for s·cos logits (needed by am_softmax)"},
    )
    cosine_scale: float = field(
        default=30.0, metadata={"help": "--classifier cosine: the scale s", "check": positive()}
    )
    classifier_inner_dim: int = field(
        default=-1, metadata={"help": "head's hidden size (-1: the encoder's)", "check": unset_or(at_least(1))}
    )
    classifier_dropout: float = field(
        default=0.1, metadata={"help": "dropout in the classification head", "check": in_range(0, 1)}
    )
    classification_head_name: str = field(default="text_classification_head", metadata={"help": "head name"})
    seed: int = II("common.seed")


class LabelDataset(BaseWrapperDataset):
    """Binarised label lines → training targets, in the form the data's label kind gives them."""

    def __init__(self, labels, to_class: torch.Tensor, num_classes: int, kind: LabelKind, where: str):
        super().__init__(labels)
        self.to_class, self.num_classes, self.kind, self.where = to_class, num_classes, kind, where

    def __getitem__(self, index):
        classes = self.to_class[self.dataset[index][:-1].long()]  # drop the </s> fairseq-preprocess appends
        if bool((classes == -1).any()):
            raise ValueError(f"{self.where}: example {index} has a label outside the label dictionary's classes")
        return self.kind.target(classes, self.num_classes)

    def collater(self, samples):
        return self.kind.collate(samples)


@register_task("text_classification", dataclass=TextClassificationConfig)
class TextClassificationTask(CheckedArgs, ASSpeedTask, FairseqTask):
    cfg: TextClassificationConfig

    def __init__(self, cfg: TextClassificationConfig, data_dictionary: Dictionary, label_dictionary: Dictionary):
        validate(cfg, TextClassificationConfig)
        super().__init__(cfg)
        self.dictionary, self.label_dictionary = data_dictionary, label_dictionary
        if cfg.multi_label and cfg.token_level:
            raise UsageError("--multi-label and --token-level cannot be combined")
        if cfg.predict_top_n and not cfg.multi_label:
            raise UsageError("--predict-top-n applies to --multi-label data")
        if cfg.out_of_scope_label and (cfg.multi_label or cfg.token_level):
            raise UsageError("--out-of-scope-label applies to single-label data")
        self.labels: LabelKind = (TokenLabels(cfg.ignore_label) if cfg.token_level else MultiLabel(cfg.predict_top_n)
                                  if cfg.multi_label else SingleLabel(cfg.out_of_scope_label))
        not_classes = set(label_dictionary.symbols[: label_dictionary.nspecial]) | self.labels.not_classes
        # fairseq-preprocess pads dictionaries to a multiple of 8 with madeupwordNNNN entries
        self.class_names = [s for s in label_dictionary.symbols
                            if s not in not_classes and not s.startswith("madeupword")]
        self.to_class = torch.full((len(label_dictionary),), -1, dtype=torch.long)
        for i, name in enumerate(self.class_names):
            self.to_class[label_dictionary.index(name)] = i
        for name in self.labels.not_classes & label_dictionary.indices.keys():
            self.to_class[label_dictionary.index(name)] = IGNORE
        if cfg.num_classes not in (-1, len(self.class_names)):
            raise UsageError(f"--num-classes {cfg.num_classes}, but the label dictionary "
                             f"{os.path.join(cfg.data, 'label', 'dict.txt')} has {len(self.class_names)} classes")
        self.labels.set_classes(self.class_names)
        if cfg.predict_top_n >= self.num_classes:
            logger.warning(f"--predict-top-n {cfg.predict_top_n} >= {self.num_classes} classes: every class is "
                           "predicted for every example")

    @classmethod
    def setup_task(cls, cfg: TextClassificationConfig, **kwargs):
        def load(side: str) -> Dictionary:
            path = os.path.join(cfg.data, side, "dict.txt")
            if not os.path.exists(path):
                raise UsageError(f"{path}: no such file: --task text_classification reads DATA/input0 and "
                                 "DATA/label (data-prep/prepare_classification.py writes them)")
            return Dictionary.load(path)

        return cls(cfg, load("input0"), load("label"))

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.label_dictionary

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def load_dataset(self, split: str, combine: bool = False, **kwargs):
        def load(side: str, dictionary: Dictionary):
            path = os.path.join(self.cfg.data, side, split)
            dataset = data_utils.load_indexed_dataset(path, dictionary, combine=combine)
            if dataset is None:
                raise UsageError(f"no binarised {split} split at {path}.{{bin,idx}}")
            return dataset, path

        inputs, input_path = load("input0", self.dictionary)
        labels, label_path = load("label", self.label_dictionary)
        if len(inputs) != len(labels):
            raise UsageError(f"{input_path} has {len(inputs)} examples but {label_path} has {len(labels)}")
        label_counts = np.asarray(labels.sizes) - 1  # </s>
        bad = self.labels.bad_examples(label_counts, np.asarray(inputs.sizes) - 1)
        if len(bad):
            raise UsageError(f"{label_path}: example {bad[0]} (line {bad[0] + 1} of the text file) has "
                             f"{label_counts[bad[0]]} labels; expected {self.labels.expected} "
                             f"({len(bad)} such examples)")
        src_tokens = PrependTokenDataset(inputs, self.dictionary.bos())
        dataset = NestedDictionaryDataset(
            {
                "id": IdDataset(),
                "net_input": {
                    "src_tokens": RightPadDataset(src_tokens, pad_idx=self.dictionary.pad()),
                    "src_lengths": NumelDataset(src_tokens, reduce=False),
                },
                "target": LabelDataset(labels, self.to_class, self.num_classes, self.labels, label_path),
                "nsentences": NumSamplesDataset(),
                "ntokens": NumelDataset(src_tokens, reduce=True),
            },
            sizes=[src_tokens.sizes],
        )
        with data_utils.numpy_seed(self.cfg.seed):
            order = np.random.permutation(len(dataset))
        self.datasets[split] = SortDataset(dataset, sort_order=[order])
        return self.datasets[split]

    def build_model(self, cfg, from_checkpoint: bool = False):
        model = super().build_model(cfg, from_checkpoint)
        heads = getattr(model, "classification_heads", None)
        if heads is None:
            arch = getattr(cfg, "arch", None) or cfg._name
            raise UsageError(f"--arch {arch}: --task text_classification needs a model with classification heads "
                             "(roberta_*, text_encoder or hf_encoder)")
        dim = getattr(model, "feature_dim", None) or cfg.encoder_embed_dim  # fairseq's RoBERTa has no feature_dim
        inner = self.cfg.classifier_inner_dim if self.cfg.classifier_inner_dim > 0 else dim
        scale = self.cfg.cosine_scale if self.cfg.classifier == "cosine" else None
        heads[self.cfg.classification_head_name] = ClassificationHead(
            dim, inner, self.num_classes, self.cfg.classifier_dropout, self.labels.token_level, scale
        )
        return model

    def loss_batch(self, model, sample) -> LossBatch:
        """The rows criterions score, and this batch's metric counts."""
        head = model.classification_heads[self.cfg.classification_head_name]
        features, _ = model(**sample["net_input"], features_only=True)
        logits, target = head(features), sample["target"]
        with torch.no_grad():
            counts = self.labels.metric_counts(logits, target, self.class_names)
        logits, target, ignore, n_rows = self.labels.rows(logits, target)
        return LossBatch(logits, target, ignore, n_rows, n_rows, head.cosine_scale, counts)

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        metrics.log_scalar_sum("_rows", sum(float(log.get("n_rows", 0)) for log in logging_outputs))
        if any(self.labels.count_keys[0] in log for log in logging_outputs):
            for key in self.labels.count_keys:
                metrics.log_scalar_sum(key, sum(log[key] for log in logging_outputs if key in log))
            self.labels.log_derived()
