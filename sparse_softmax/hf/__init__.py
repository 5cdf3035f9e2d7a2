"""Hugging Face adapters (needs ``transformers``): every loss as ``Trainer``'s ``compute_loss_func``
(``TrainerLoss``; ``FusedTrainerLoss``: softmax, sparse_softmax and as_softmax from the last hidden state, by the fused
output layer), the schedules as ``TrainerCallback``s (``LossScheduleCallback``: warm-ups and δ annealing;
``ASSpeedCallback``), and the papers' decoding as ``LogitsProcessor``s for ``generate()`` (``TopKRenormalise``,
``SourceVocabularyMask``). ``examples/hf_seq2seq.py`` uses them all."""
from .callbacks import ASSpeedCallback, LossScheduleCallback
from .fused import FusedTrainerLoss
from .generation import SourceVocabularyMask, TopKRenormalise
from .loss import LOSSES, TrainerLoss

__all__ = ["ASSpeedCallback", "FusedTrainerLoss", "LOSSES", "LossScheduleCallback", "SourceVocabularyMask",
           "TopKRenormalise", "TrainerLoss"]
