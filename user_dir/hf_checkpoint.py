"""A pretrained Hugging Face checkpoint in a local folder, as ``save_pretrained`` writes it (``config.json``, the
weights, the tokenizer files), read alike by ``--arch hf_encoder`` (``--hf-model-dir``) and by the data prep
(``--hf-tokenizer``), which must agree on it: nothing is downloaded, a missing or incomplete folder is one line
naming the option and the folder, and the longest input is one number, to which the prep cuts inputs and which
is the model's ``max_positions``.
"""
from __future__ import annotations

from pathlib import Path

#: ``--arch hf_unilm``'s longest target (its end token not counted) by default, and so the prep's
MAX_TARGET_TOKENS = 64


def problem(folder: str | Path, option: str) -> str | None:
    """What makes ``folder`` no checkpoint folder, as a one-line error naming ``option``; None when it is one."""
    if (Path(folder) / "config.json").is_file():
        return None
    return (f"{option} {folder}: no config.json there (expected a folder written by a Hugging Face model's "
            "save_pretrained; nothing is downloaded)")


def load(folder: str | Path, what: str, option: str, error: type[Exception], hint: str = "", **kwargs):
    """``transformers.<what>.from_pretrained`` (``AutoModel``, ``AutoConfig``, ``AutoTokenizer``) from the folder
    only; a folder it cannot load from raises ``error`` (the caller's one-line error type) naming ``option``,
    and a folder without ``config.json`` adds ``hint`` (where the caller's user finds one)."""
    import transformers  # imported here: every fairseq command imports the plugin, few use a checkpoint

    if message := problem(folder, option):
        raise error(message + hint)
    try:
        return getattr(transformers, what).from_pretrained(Path(folder), local_files_only=True, **kwargs)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0]
        raise error(f"{option} {folder}: cannot load its {what.removeprefix('Auto').lower()} ({first})") from None


def longest_input(tokenizer, config) -> int:
    """The most tokens the model takes, CLS and SEP included: its tokenizer's limit or its position embeddings',
    whichever is smaller."""
    return min(tokenizer.model_max_length, config.max_position_embeddings)
