#!/usr/bin/env bash
# A larger model for benchmarks/decoding_speed.py than the demo's: toy corpus with an 8,016-symbol
# joined dictionary, a 2+2-layer 256-dim transformer trained 400 updates with sparse_softmax (about
# 6 minutes on 2 CPU cores). Its output is poor; it only has to be a realistic shape to decode with.
#   bash benchmarks/decoding_model_8k.sh [OUT=work-dirs/decoding_8k]
#   python benchmarks/decoding_speed.py --data-bin OUT/data-bin --path OUT/checkpoints/checkpoint_best.pt \
#       --repeats 3 --min-seconds 0 --out benchmarks/results/decoding_speed_8k
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$root/work-dirs/decoding_8k}")"
export PATH="$root/.venv/bin:$PATH"
cd "$root"
python data-prep/make_toy_data.py "$out/raw" --train 20000 --valid 200 --test 500 --content-words 8000
fairseq-preprocess --source-lang src --target-lang tgt --joined-dictionary --workers 2 \
    --trainpref "$out/raw/train" --validpref "$out/raw/valid" --testpref "$out/raw/test" --destdir "$out/data-bin"
fairseq-train "$out/data-bin" --user-dir user_dir --task sparse_seq2seq --cpu \
    --arch transformer --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 256 --decoder-embed-dim 256 \
    --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 --share-all-embeddings \
    --criterion sparse_softmax --sparse-topk 10 --optimizer adam --lr 0.001 --lr-scheduler inverse_sqrt \
    --warmup-updates 100 --max-tokens 4000 --max-update 400 --dropout 0.1 \
    --save-dir "$out/checkpoints" --no-epoch-checkpoints --log-format json --log-interval 100
