#!/usr/bin/env bash
# fairseq-train on a GPU in one run, for a CUDA machine that reaches no package index: fairseq built from the
# carried wheels where it is not installed yet, the CUDA tests of the plugin's fairseq fixes, then
# benchmarks/train_speed.py with --profile where the GPU, not fairseq's Python, should set the pace: bf16, the
# 2+2 × 2048 model, 128k words, 20-60-word sources, 40,960 tokens a batch (about 21,000 target words), 30
# updates a run, one interleaved run each of cross_entropy and the fused sparse_softmax and as_softmax layers. The
# batch is sized to fit an 80 GB GPU (estimated): fairseq's cross_entropy keeps float32 log-probabilities of
# every target word and their gradient, about 11 GB each here. On the 2+2 × 256 model with 32k words every
# criterion trained at one speed with the GPU busy 8 % of an update (results/gpu_h100.md). The words/s table is
# written before the profile starts, so a run cut short keeps it (results/gpu_h200.md has the timings). The table
# and plot go to OUT (default: results/gpu), the output of every step to OUT/run.log.
#
#     bash tools/gpu_training.sh [OUT] [WHEELS]
#
# WHEELS (default .whl) holds fairseq-fixed's sdist and the wheels of what fairseq needs that the machine lacks
# (on the H100 node: hydra-core, omegaconf, antlr4-python3-runtime, bitarray); results/gpu_h100.md says how
# they were fetched.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/gpu}
wheels=${2:-.whl}
source tools/gpu_steps.sh
if ! "$python" -c "import fairseq" 2>/dev/null; then
    step 60 wheels "$python" -m pip install -q --no-index --no-deps --no-compile "$wheels"/*.whl
    # without CUDA_HOME, as scripts/wheelhouse.py installs it: with it, fairseq's build wants CUDA sources its
    # sdist lacks
    step 300 fairseq env -u CUDA_HOME MAX_JOBS=16 "$python" -m pip install -q --no-index --no-deps \
        --no-build-isolation "$wheels"/fairseq_fixed-*.tar.gz
fi
# the plugin's CUDA-only fairseq fixes (cuDNN attention off) before the run that depends on them
step 60 cuda_tests "$python" -m pytest -q -p no:cacheprovider tests/test_fairseq_compat.py -k cuda
step 480 train_speed "$python" benchmarks/train_speed.py --models wide --vocab 128000 --pairs 40000 --lengths 20 60 \
    --criteria "cross_entropy;sparse_softmax, fused;as_softmax, fused" --device cuda --precision bf16 \
    --max-tokens 40960 --updates 30 --log-interval 10 --repeats 1 --profile --out "$out/train_speed"
exit $status
