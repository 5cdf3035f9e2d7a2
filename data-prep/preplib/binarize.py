"""Text splits → sentencepiece pieces → ``fairseq-preprocess`` data-bin with a joined dictionary.

The path every data set takes (Gigaword, SQuAD QG): a sentencepiece model trained on the training
source and target text (or the user's), each split encoded, then fairseq-preprocess, and finally the
number of sentences in each binarised split compared with the number of lines that went in. The
output folder always ends up with the ``spm.model`` and ``dict.txt`` it was encoded with (a given
model and dictionary are copied in), so it is complete on its own.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable

from . import hf_tokenizer as hf
from .textio import PrepError, require_file

SPLITS = ("train", "valid", "test")
SIDES = ("src", "tgt")


@dataclass
class SentencePieceOptions:
    vocab_size: int = 32000
    model_type: str = "unigram"
    character_coverage: float = 1.0
    sample: int = 2_000_000  # training sentences sampled by sentencepiece (Gigaword has 7.6M)
    user_symbols: tuple[str, ...] = ()  # always one piece each, e.g. the QG separator [SEP]


def train_sentencepiece(files: list[Path], prefix: Path, options: SentencePieceOptions) -> Path:
    """Train on ``files`` (one sentence per line) and return the ``.model`` path.

    ``hard_vocab_limit=False`` lets a small corpus (tests, the demo) end up with fewer pieces than
    asked instead of failing; the size actually reached is what the dictionary gets.
    """
    import sentencepiece as spm

    try:
        spm.SentencePieceTrainer.train(
            input=[str(f) for f in files], model_prefix=str(prefix), vocab_size=options.vocab_size,
            model_type=options.model_type, character_coverage=options.character_coverage,
            input_sentence_size=options.sample, shuffle_input_sentence=True, hard_vocab_limit=False,
            # fairseq's dictionary adds its own <s> <pad> </s> <unk>; sentencepiece keeps its unk only.
            bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, minloglevel=2,
            user_defined_symbols=list(options.user_symbols),
        )
    except RuntimeError as err:
        # e.g. "Vocabulary size is smaller than required_chars. 5 vs 33.": one piece per character is needed
        too_small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(err))
        if too_small:
            raise PrepError(f"--spm-vocab-size {options.vocab_size} is too small for this training text: "
                            f"sentencepiece needs at least {too_small.group(1)} pieces (one per distinct "
                            "character, plus its own)") from None
        raise PrepError(f"sentencepiece could not train on {', '.join(map(str, files))}: {err}") from None
    return prefix.with_suffix(".model")


def encode_file(model: Path, source: Path, target: Path) -> tuple[int, int]:
    """Write ``source`` as space-separated pieces to ``target``; returns (lines, unknown pieces):
    characters the model has never seen become its ``<unk>``, which fairseq reads as its own."""
    import sentencepiece as spm

    from tqdm import tqdm

    processor = spm.SentencePieceProcessor(model_file=str(model))
    lines = unknown = 0
    with open(source, encoding="utf-8") as fin, open(target, "w", encoding="utf-8") as fout, \
            tqdm(desc=f"encode {source.name}", unit=" lines", disable=None, mininterval=1) as bar:
        while batch := [line.rstrip("\n") for line in islice(fin, 10_000)]:
            for ids in processor.encode(batch):
                unknown += ids.count(processor.unk_id())
                fout.write(" ".join(processor.id_to_piece(ids)) + "\n")
            lines += len(batch)
            bar.update(len(batch))
    return lines, unknown


def fairseq_preprocess(options: list[str], dest: Path, expected: dict[str, int], workers: int) -> None:
    """Run fairseq-preprocess with ``options`` into ``dest``, then read back each binarised dataset named
    in ``expected`` (its path prefix in ``dest`` → the lines that went in): a count that differs is an error."""
    dest.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "fairseq_cli.preprocess", *options, "--destdir", str(dest), "--workers", str(workers)]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PrepError(f"fairseq-preprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    for prefix, lines in expected.items():
        got = len(MMapIndexedDataset(str(dest / prefix)))
        if got != lines:
            raise PrepError(f"{dest / prefix}: {got} sentences binarised from {lines} lines")


def split_prefixes(prefix: Callable[[str], Path], splits) -> list[str]:
    """``--trainpref P --validpref P ...`` for the splits present."""
    return [arg for split in splits for arg in (f"--{split}pref", str(prefix(split)))]


def spm_dictionary(model: Path, path: Path) -> Path:
    """A fairseq dictionary listing every piece of a sentencepiece model (count 1 each), so that no piece
    the model can produce is mapped to <unk> by fairseq, whichever splits are binarised."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model))
    reserved = {"<unk>", "<s>", "</s>", "<pad>"}
    with open(path, "w", encoding="utf-8") as f:
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if piece not in reserved and not processor.is_control(i):
                f.write(f"{piece} 1\n")
    return path


def encode_splits(out: Path, splits: list[str], sides: tuple[str, ...], *, spm_model: Path | None,
                  dictionary: Path | None, options: SentencePieceOptions) -> dict:
    """``{out}/{split}.{side}`` → ``{out}/{split}.spm.{side}`` for every split and text side.

    Without ``spm_model`` a model is trained on the training text of all ``sides`` (``{out}/spm.model``);
    without ``dictionary`` the fairseq dictionary lists the model's pieces. Returns the model, the
    dictionary, lines per split (the sides of a split are written together, so they agree) and the
    characters unknown to the model per file.
    """
    import sentencepiece as spm

    given = {"spm_model_from": spm_model, "dictionary_from": dictionary}
    if spm_model is None:
        if "train" not in splits:
            raise PrepError("no training split to train sentencepiece on: pass --spm-model")
        spm_model = train_sentencepiece([out / f"train.{side}" for side in sides], out / "spm", options)
    else:
        spm_model = Path(shutil.copyfile(require_file(spm_model, "--spm-model"), out / "spm.model"))
    pieces = spm.SentencePieceProcessor(model_file=str(spm_model)).get_piece_size()
    if given["spm_model_from"] is None and pieces < options.vocab_size:
        print(f"warning: sentencepiece reached {pieces} pieces, not the {options.vocab_size} of --spm-vocab-size "
              "(the training text holds no more): the model and dictionary have that many", file=sys.stderr)
    if dictionary is None:
        dictionary = spm_dictionary(spm_model, out / "dict.txt")
    else:
        dictionary = Path(shutil.copyfile(require_file(dictionary, "--dict"), out / "dict.txt"))
    lines, unknown = {}, {}
    for split in splits:
        for side in sides:
            lines[split], unknown[f"{split}.{side}"] = encode_file(
                spm_model, out / f"{split}.{side}", out / f"{split}.spm.{side}")
    return {"spm_model": spm_model.name, "spm_pieces": pieces, "dictionary": dictionary.name,
            **{key: path for key, path in given.items() if path is not None},
            "binarised_sentences": lines, "unknown_pieces": {k: v for k, v in unknown.items() if v}}


def binarize(out: Path, splits: list[str], *, spm_model: Path | None, dictionary: Path | None,
             options: SentencePieceOptions, workers: int = 1, hf_tokenizer: Path | None = None,
             max_target_tokens: int = 0) -> dict:
    """``{out}/{split}.{src,tgt}`` → pieces → ``{out}/data-bin`` (one dictionary for both sides). With
    ``hf_tokenizer`` (a pretrained checkpoint's folder, for ``--arch hf_unilm``) the pieces are that tokenizer's
    tokens, cut to fit the model with targets of up to ``max_target_tokens`` (``hf_tokenizer.encode_pairs``)."""
    if hf_tokenizer is None:
        result = encode_splits(out, splits, SIDES, spm_model=spm_model, dictionary=dictionary, options=options)
        pieces = "spm"
    else:
        result = hf.encode_pairs(out, splits, hf_tokenizer, max_target_tokens)
        pieces = "hf"
    lines = result["binarised_sentences"]
    fairseq_preprocess(["--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary", "--srcdict",
                        str(out / result["dictionary"]), *split_prefixes(lambda split: out / f"{split}.{pieces}", lines)],
                       out / "data-bin", {f"{split}.src-tgt.{side}": n for split, n in lines.items() for side in SIDES},
                       workers)
    return {**result, "data_bin": "data-bin"}


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def add_arguments(parser) -> None:
    """The tokenisation/binarisation options every prep script offers."""
    group = parser.add_argument_group("sentencepiece and fairseq-preprocess")
    group.add_argument("--spm-model", type=Path, help="use this sentencepiece model instead of training one")
    group.add_argument("--dict", type=Path, help="use this fairseq dictionary (default: every piece of the "
                       "sentencepiece model)")
    group.add_argument("--spm-vocab-size", type=positive_int, default=32000,
                       help="pieces of a trained model (default: %(default)s; a small corpus may get fewer)")
    group.add_argument("--spm-model-type", choices=("unigram", "bpe"), default="unigram",
                       help="sentencepiece algorithm (default: %(default)s)")
    group.add_argument("--spm-sample", type=positive_int, default=2_000_000,
                       help="training sentences sentencepiece samples (default: %(default)s)")
    group.add_argument("--text-only", action="store_true", help="stop after the text splits (no sentencepiece, "
                       "no data-bin)")
    group.add_argument("--workers", type=positive_int, default=1, help="fairseq-preprocess workers (default: %(default)s)")

