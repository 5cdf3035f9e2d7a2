#!/usr/bin/env bash
# The main job end to end on the bundled toy corpus: set up -> prepare (as Gigaword) -> fairseq-train with
# sparse_softmax -> fairseq-generate with masked decoding -> score and plot. Everything goes to ./demo (or $1).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$root/demo}")"
bash "$root/scripts/setup_env.sh"
export PATH="$root/.venv/bin:$PATH"
cd "$root"

echo "== 1/4 prepare: toy corpus in Gigaword's harvardnlp layout -> sentencepiece + fairseq-preprocess"
python data-prep/make_toy_data.py "$out/raw" --layout harvard
python data-prep/prepare_gigaword.py "$out/raw" "$out/prep" --spm-vocab-size 100 --workers 2 --overwrite

echo "== 2/4 train: --criterion sparse_softmax --sparse-topk 10"
rm -rf "$out/checkpoints"
fairseq-train "$out/prep/data-bin" --user-dir user_dir --task sparse_seq2seq --cpu \
    --arch transformer_tiny --share-all-embeddings --dropout 0.1 \
    --criterion sparse_softmax --sparse-topk 10 \
    --optimizer adam --lr 0.002 --lr-scheduler inverse_sqrt --warmup-updates 100 \
    --max-tokens 4000 --max-update 600 \
    --save-dir "$out/checkpoints" --no-epoch-checkpoints \
    --log-format json --log-interval 20 2>&1 | tee "$out/train.log" | grep -E "\| (valid|train) \|" || true

echo "== 3/4 generate: beam 5, masked decoding over the top 5 tokens, on the test set"
fairseq-generate "$out/prep/data-bin" --user-dir user_dir --task sparse_seq2seq --cpu \
    --path "$out/checkpoints/checkpoint_best.pt" \
    --beam 5 --decoding-topk 5 --batch-size 64 --gen-subset test --post-process sentencepiece \
    > "$out/generate.txt"
tail -n 1 "$out/generate.txt"

echo "== 4/4 score (every test sentence must have its hypothesis) and plot"
python scripts/score_summaries.py "$out/generate.txt" --refs "$out/prep/test.ref" --json "$out/rouge.json"
python scripts/score_questions.py "$out/generate.txt" --refs "$out/prep/test.ref" --json "$out/bleu.json"
python scripts/plot_training_log.py "$out/train.log" --out "$out/loss_curve.png"
