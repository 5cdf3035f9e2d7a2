#!/usr/bin/env bash
# The GPU checks of the loss kernels in one run, for a CUDA machine with torch, Triton, entmax and pytest-xdist
# (not fairseq): the versions, the CUDA tests of the losses, the Triton kernels and the fused output layer, then
# benchmarks/output_layer_speed.py (with the op-by-op profile of the fused sparse_softmax layer's forwards),
# loss_speed.py and kernel_tuning.py at the usual sizes (bf16, N = 16,384, H = 1,024, V = 32k and 128k). The
# tables and plots go to OUT (default: results/gpu), the output of every step to OUT/run.log.
#
#     bash tools/gpu_kernels.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/gpu}
source tools/gpu_steps.sh
step 180 tests "$python" -m pytest -q -p no:cacheprovider -n 8 tests/test_sparse_softmax_triton.py \
    tests/test_as_softmax_triton.py tests/test_output_layer_triton.py \
    tests/test_losses.py tests/test_fused_output_layer.py -k "cuda or triton"
step 150 output_layer "$python" benchmarks/output_layer_speed.py --device cuda --dtype bfloat16 \
    --cases 16384x1024x32000,16384x1024x128000 --repeats 5 --profile "sparse_softmax k=10, fused" \
    --out "$out/output_layer_speed"
step 150 loss "$python" benchmarks/loss_speed.py --device cuda --dtype bfloat16 --cases 16384x32000,16384x128000 \
    --repeats 5 --out "$out/loss_speed"
step 160 tuning "$python" tools/kernel_tuning.py --cases 16384x1024x32000,16384x1024x128000 --repeats 3 \
    --out "$out/kernel_tuning.md"
exit $status
