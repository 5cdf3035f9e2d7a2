"""Text splits → a pretrained Hugging Face checkpoint's own tokens, for ``--arch hf_encoder`` and ``hf_unilm``.

Instead of training sentencepiece, each ``{split}.input0`` line is tokenised with the tokenizer in the
checkpoint's folder (``--hf-tokenizer DIR``, as ``save_pretrained`` writes it) and written as its tokens,
``{split}.hf.input0``; ``dict.txt`` lists every token of the tokenizer's vocabulary. With the ``<s>`` the
task prepends and the ``</s>`` fairseq-preprocess appends, which the model maps to the tokenizer's CLS and
SEP, the encoder sees exactly the ids ``tokenizer(line)`` gives: every line is checked for that here.

Inputs longer than the model's maximum length are cut to it, and counted (``truncated`` in the summary);
token-level data (CoNLL) gets its labels from the tokenizer's word alignment: a word's first token has the
word's tag, its other tokens the ignored label. Its words are tokenised as running text would be, each one
marked as a word start (byte-level BPE such as RoBERTa's is loaded with ``add_prefix_space``, as Hugging Face
does for token classification; without it the words would run together), and every line is checked for that.

Sequence-to-sequence pairs (``encode_pairs``: ``{split}.src`` / ``{split}.tgt``, one dictionary for both) share
the model's positions, so a source is cut to what the longest target leaves (``source_room``) and a target to
``--max-target-tokens``, each counted.
"""
from __future__ import annotations

import argparse
import sys
from itertools import islice
from pathlib import Path

from .textio import PrepError

#: names fairseq's dictionary reserves for itself; the model maps them to the tokenizer's own
RESERVED = ("<s>", "<pad>", "</s>", "<unk>")


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf-tokenizer", type=Path, metavar="DIR",
                        help="tokenise with this pretrained Hugging Face checkpoint's tokenizer (its save_pretrained "
                        "folder) instead of sentencepiece, for --arch hf_encoder / hf_unilm --hf-model-dir DIR")


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Before any work: the folder is there, and no sentencepiece option contradicts it."""
    if args.hf_tokenizer is None:
        return
    given = [flag for flag, value in (("--spm-model", args.spm_model), ("--dict", args.dict)) if value]
    if given:
        parser.error(f"--hf-tokenizer: the tokenizer replaces sentencepiece, so {given[0]} cannot be used with it")
    from user_dir import hf_checkpoint  # imported where needed: importing the plugin imports fairseq

    if message := hf_checkpoint.problem(args.hf_tokenizer, "--hf-tokenizer"):
        parser.error(message)


def load(folder: Path, words: bool = False):
    """The folder's tokenizer, and the longest input its model takes (special tokens included); ``words``:
    for input already split into words, each of which starts a word (see the module doc). The plugin reads the
    same folder alike for --arch hf_encoder: its ``max_positions`` is this longest input."""
    from user_dir import hf_checkpoint

    tokenizer = hf_checkpoint.load(folder, "AutoTokenizer", "--hf-tokenizer", PrepError,
                                   **({"add_prefix_space": True} if words else {}))
    config = hf_checkpoint.load(folder, "AutoConfig", "--hf-tokenizer", PrepError)
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        raise PrepError(f"--hf-tokenizer {folder}: its tokenizer has no CLS/SEP token to mark a sentence with")
    return tokenizer, hf_checkpoint.longest_input(tokenizer, config)


def write_dictionary(tokenizer, path: Path) -> Path:
    """A fairseq dictionary with every token of the vocabulary (count 1 each), in id order."""
    tokens = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    spaced = [token for token in tokens if token != token.strip() or len(token.split()) > 1]
    if spaced:
        raise PrepError(f"the tokenizer has tokens with white space in them ({spaced[0]!r}), which a fairseq "
                        "dictionary cannot hold")
    path.write_text("".join(f"{token} 1\n" for token in tokens if token not in RESERVED), encoding="utf-8")
    return path


def encode_splits(out: Path, splits: list[str], folder: Path, token_level: bool) -> dict:
    """``{split}.input0`` → ``{split}.hf.input0`` (and, ``token_level``, ``{split}.word_label`` →
    ``{split}.label``) for every split; returns the summary entries, as the sentencepiece path does."""
    tokenizer, longest = load(folder, words=token_level)
    dictionary = write_dictionary(tokenizer, out / "dict.txt")
    lines, truncated, unknown = {}, {}, {}
    for split in splits:
        if token_level:
            lines[split], truncated[split], unknown[split] = _encode_words(tokenizer, longest - 2, out, split)
        else:
            lines[split], truncated[split], unknown[split] = _encode_text(
                tokenizer, longest - 2, out / f"{split}.input0", out / f"{split}.hf.input0", split)
        if truncated[split]:
            print(f"note: {truncated[split]} {split} inputs were longer than the model's {longest} tokens and were "
                  "cut to it", file=sys.stderr)
    return {"hf_tokenizer": folder, "max_tokens": longest, "dictionary": dictionary.name,
            "binarised_sentences": lines, "truncated": truncated,
            "unknown_pieces": {f"{split}.input0": n for split, n in unknown.items() if n}}


def max_target_tokens(args: argparse.Namespace) -> int:
    """``--max-target-tokens`` for seq2seq data tokenised with ``--hf-tokenizer``; by default the model's."""
    from user_dir import hf_checkpoint

    return hf_checkpoint.MAX_TARGET_TOKENS if args.max_target_tokens is None else args.max_target_tokens


def source_room(longest: int, max_target_tokens: int) -> int:
    """The most tokens a source may have for ``--arch hf_unilm``: the model's ``longest`` positions hold CLS,
    the source, SEP, the target (at most ``max_target_tokens``) and its end token."""
    room = longest - 3 - max_target_tokens
    if room < 1:
        raise PrepError(f"--max-target-tokens {max_target_tokens} leaves no room for a source in the model's "
                        f"{longest} positions (CLS, SEP and the target's end token take 3 more)")
    return room


def encode_pairs(out: Path, splits: list[str], folder: Path, max_target_tokens: int) -> dict:
    """``{split}.{src,tgt}`` → ``{split}.hf.{src,tgt}`` for ``--arch hf_unilm``: sources cut to
    ``source_room`` tokens, targets to ``max_target_tokens`` (each cut counted, per split and side; test
    references are kept whole in ``test.ref``); returns the summary entries, as the sentencepiece path does."""
    tokenizer, longest = load(folder)
    dictionary = write_dictionary(tokenizer, out / "dict.txt")
    limits = {"src": source_room(longest, max_target_tokens), "tgt": max_target_tokens}
    lines, truncated, unknown = {}, {}, {}
    for split in splits:
        for side, limit in limits.items():
            name = f"{split}.{side}"
            lines[split], truncated[name], unknown[name] = _encode_text(
                tokenizer, limit, out / name, out / f"{split}.hf.{side}", f"{split} {side}")
            if truncated[name]:
                print(f"note: {truncated[name]} {split} {'sources' if side == 'src' else 'targets'} were longer than "
                      f"{limit} tokens and were cut to it", file=sys.stderr)
    return {"hf_tokenizer": folder, "max_tokens": longest, "max_source_tokens": limits["src"],
            "max_target_tokens": max_target_tokens, "dictionary": dictionary.name, "binarised_sentences": lines,
            "truncated": truncated, "unknown_pieces": {name: n for name, n in unknown.items() if n}}


def _batches(path: Path):
    with open(path, encoding="utf-8") as f:
        while batch := [line.rstrip("\n") for line in islice(f, 10_000)]:
            yield batch


def _encode_text(tokenizer, room: int, source: Path, target: Path, what: str) -> tuple[int, int, int]:
    """The lines of ``source`` as the tokenizer's tokens in ``target``, each cut to ``room``; ``what`` names
    them in messages. Returns (lines, truncated, unknown tokens)."""
    lines = truncated = unknown = 0
    with open(target, "w", encoding="utf-8") as fout:
        for batch in _batches(source):
            plain = tokenizer(batch, add_special_tokens=False)["input_ids"]
            marked = tokenizer(batch)["input_ids"]
            for number, (ids, full) in enumerate(zip(plain, marked), lines + 1):
                if full != [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]:
                    raise PrepError(f"{what} sentence {number}: the tokenizer does not mark a sentence as "
                                    "CLS tokens SEP, which the plugin's --arch hf_encoder and hf_unilm assume")
                truncated += len(ids) > room
                unknown += ids[:room].count(tokenizer.unk_token_id)
                fout.write(" ".join(tokenizer.convert_ids_to_tokens(ids[:room])) + "\n")
            lines += len(batch)
    return lines, truncated, unknown


def _encode_words(tokenizer, room: int, out: Path, split: str) -> tuple[int, int, int]:
    """Token-level lines (words and their tags); returns (lines, truncated, unknown tokens)."""
    from .conll import IGNORE_LABEL

    lines = truncated = unknown = 0
    with open(out / f"{split}.hf.input0", "w", encoding="utf-8") as fout, \
            open(out / f"{split}.word_label", encoding="utf-8") as tags_file, \
            open(out / f"{split}.label", "w", encoding="utf-8") as labels:
        for batch in _batches(out / f"{split}.input0"):
            encoded = tokenizer([line.split() for line in batch], is_split_into_words=True, add_special_tokens=False)
            running = tokenizer([" ".join(line.split()) for line in batch], add_special_tokens=False)["input_ids"]
            for i, (ids, as_text) in enumerate(zip(encoded["input_ids"], running)):
                if ids != as_text:
                    raise PrepError(f"{split} sentence {lines + i + 1}: the tokenizer gives its words other "
                                    "tokens than it gives the same line as text, so the words' boundaries would be "
                                    "lost")
                tags, words = next(tags_file).split(), encoded.word_ids(i)
                if set(words) != set(range(len(tags))):
                    raise PrepError(f"{split} sentence {lines + i + 1}: the tokenizer gives no token for "
                                    f"word {min(set(range(len(tags))) - set(words)) + 1}")
                row = [tags[w] if k == 0 or words[k - 1] != w else IGNORE_LABEL for k, w in enumerate(words)]
                truncated += len(ids) > room
                unknown += ids[:room].count(tokenizer.unk_token_id)
                fout.write(" ".join(tokenizer.convert_ids_to_tokens(ids[:room])) + "\n")
                labels.write(" ".join(row[:room]) + "\n")
            lines += len(batch)
    return lines, truncated, unknown
