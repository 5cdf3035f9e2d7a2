#!/usr/bin/env bash
# The main job end to end on the bundled toy corpus: set up -> prepare (as Gigaword) -> fairseq-train with
# sparse_softmax -> fairseq-generate with masked decoding -> score and plot. Everything goes to ./demo (or $1);
# the tools' whole output goes to its *.log files, and a step that fails stops the demo with its error shown.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$root/demo}")"
updates="${DEMO_MAX_UPDATE:-600}"  # the README test shortens the training (its one change, of scale)
bash "$root/scripts/setup_env.sh"
export PATH="$root/.venv/bin:$PATH"
cd "$root"
mkdir -p "$out"

# quietly LOG [--stdout FILE] CMD...: run CMD with its output in LOG (its standard output in FILE if given); if it
# fails, show the end of LOG and stop with its status
quietly() {
    local log=$1 out=$1
    shift
    if [ "$1" = --stdout ]; then out=$2; shift 2; fi
    if [ "$out" = "$log" ]; then "$@" > "$log" 2>&1; else "$@" > "$out" 2> "$log"; fi \
        || { local status=$?; echo "failed ($status): $*; the end of $log:" >&2; tail -n 20 "$log" >&2; exit "$status"; }
}

echo "== 1/4 prepare: toy corpus in Gigaword's harvardnlp layout -> sentencepiece + fairseq-preprocess"
quietly "$out/toy.log" python data-prep/make_toy_data.py "$out/raw" --layout harvard
quietly "$out/prep.log" python data-prep/prepare_gigaword.py "$out/raw" "$out/prep" --spm-vocab-size 100 \
    --workers 2 --overwrite
grep -E "^(train|valid|test): " "$out/prep.log"

echo "== 2/4 train: --criterion sparse_softmax --sparse-topk 10, $updates updates (one line per epoch)"
rm -rf "$out/checkpoints"
fairseq-train "$out/prep/data-bin" --user-dir user_dir --task sparse_seq2seq --cpu \
    --arch transformer_tiny --share-all-embeddings --dropout 0.1 \
    --criterion sparse_softmax --sparse-topk 10 \
    --optimizer adam --lr 0.002 --lr-scheduler inverse_sqrt --warmup-updates 100 \
    --max-tokens 4000 --max-update "$updates" \
    --save-dir "$out/checkpoints" --no-epoch-checkpoints \
    --log-format json --log-interval 20 2>&1 | python scripts/train_progress.py --log "$out/train.log" \
    --max-update "$updates"

echo "== 3/4 generate: beam 5, masked decoding over the top 5 tokens, on the test set"
quietly "$out/generate.log" --stdout "$out/generate.txt" fairseq-generate "$out/prep/data-bin" --user-dir user_dir \
    --task sparse_seq2seq --cpu --path "$out/checkpoints/checkpoint_best.pt" \
    --beam 5 --decoding-topk 5 --batch-size 64 --gen-subset test --post-process sentencepiece
echo "$(grep -c '^H-' "$out/generate.txt") hypotheses -> $out/generate.txt"

echo "== 4/4 score (every test sentence must have its hypothesis) and plot"
quietly "$out/score-rouge.log" python scripts/score_summaries.py "$out/generate.txt" --refs "$out/prep/test.ref" \
    --json "$out/rouge.json"
quietly "$out/score-bleu.log" python scripts/score_questions.py "$out/generate.txt" --refs "$out/prep/test.ref" \
    --json "$out/bleu.json"
quietly "$out/plot.log" python scripts/plot_training_log.py "$out/train.log" --out "$out/loss_curve.png"
python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rouge, bleu = (json.load(open(f"{out}/{name}.json"))["scores"] for name in ("rouge", "bleu"))
print("ROUGE-1/2/L " + "/".join(f"{rouge[k]:.2f}" for k in ("ROUGE-1", "ROUGE-2", "ROUGE-L"))
      + ", BLEU-4 " + f"{bleu['BLEU-4']:.2f}")
print(f"files: {out}/generate.txt (hypotheses), rouge.json and bleu.json (scores per example too), "
      "loss_curve.png, train.log (fairseq's whole log), checkpoints/")
PY
