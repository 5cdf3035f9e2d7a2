#!/usr/bin/env python
"""A Hugging Face causal LM's training step with the fused output layer, against the model's own loss.

A Llama-shaped model whose output layer dominates (few layers, a large vocabulary), one training step (forward +
backward) on ``--batch`` rows of ``--length`` tokens: the model's own loss (``labels=`` passed: transformers'
cross-entropy on the float logits), the baseline every ratio is taken to; ``TrainerLoss`` on ``outputs.logits``;
``F.linear_cross_entropy`` on the last hidden state (torch 2.13's, where this torch has it); ``FusedTrainerLoss``
(``sparse_softmax.hf``) for cross-entropy, sparse_softmax (k = 10) and as_softmax (δ = 0.3); and the floor, the core's
``fused_output_loss`` called by hand on the hidden state of ``model.model``. Each variant has its own copy of the model
(the fused loss wraps its model's output layer), all in the same run, interleaved, the minimum of ``--repeats`` (see
``measure.py``). Peak memory is what one step allocates beyond the model and the batch (the gradients included).

    python benchmarks/hf_fused_speed.py        # hidden 512 and 1024, 2 layers, V = 128,256, 4 × 512 tokens
    python benchmarks/hf_fused_speed.py --device cuda --dtype bfloat16 --batch 16 --length 1024 --hidden 2048
"""
from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
import torch.nn.functional as F

from measure import best_times, device_name, peak_extra_bytes, ratio_panels, write_results
from sparse_softmax.hf import FusedTrainerLoss, TrainerLoss
from sparse_softmax.losses import fused_output_loss

K, DELTA = 10, 0.3


def make_model(hidden: int, vocab: int, layers: int, device: str, dtype: torch.dtype):
    """A random Llama of ``layers`` layers of width ``hidden`` over ``vocab`` words, tied embeddings, in ``dtype``."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                                      num_key_value_heads=max(1, hidden // 256), tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config).to(device, dtype).train()


def variants(hidden: int, vocab: int, layers: int, batch: int, length: int, device: str,
             dtype: torch.dtype) -> dict[str, callable]:
    """name → step: each a training step (forward + backward) of its own copy of one model on one batch."""
    model = make_model(hidden, vocab, layers, device, dtype)
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1)).to(device)
    items = torch.tensor(batch * (length - 1), device=device)

    def step(loss_of):
        copy_ = copy.deepcopy(model)
        prepared = loss_of(copy_)

        def run():
            copy_.zero_grad(set_to_none=True)
            prepared().backward()
        return run

    def trainer_loss(loss):
        return lambda m: (lambda: loss(m(input_ids=ids), ids, items))

    def by_hand(m):  # the floor: the decoder's hidden state handed to the core by hand
        def loss():
            h = m.model(input_ids=ids).last_hidden_state[:, :-1].reshape(-1, hidden)
            return fused_output_loss(h, m.lm_head.weight, ids[:, 1:].reshape(-1), "sparse_softmax", k=K).loss / items
        return loss

    out = {
        "model's own loss": step(lambda m: (lambda: m(input_ids=ids, labels=ids).loss)),
        "TrainerLoss softmax": step(lambda m: trainer_loss(TrainerLoss("softmax", causal_lm=True))(m)),
    }
    if hasattr(F, "linear_cross_entropy"):
        out["F.linear_cross_entropy"] = step(lambda m: (lambda: F.linear_cross_entropy(
            m.model(input_ids=ids).last_hidden_state[:, :-1].reshape(-1, hidden), m.lm_head.weight,
            ids[:, 1:].reshape(-1), reduction="sum") / items))
    for name, options in (("softmax", {}), ("sparse_softmax", {"k": K}), ("as_softmax", {"delta": DELTA})):
        out[f"FusedTrainerLoss {name}"] = step(lambda m, name=name, options=options: trainer_loss(
            FusedTrainerLoss(m, name, **options))(m))
    out[f"fused_output_loss by hand, sparse_softmax k={K} (floor)"] = step(by_hand)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--hidden", default="512,1024", help="hidden sizes, one case each (default: %(default)s)")
    parser.add_argument("--vocab", type=int, default=128256, help="(default: %(default)s, Llama 3's)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "hf_fused_speed",
                        help="writes OUT.md (table) and OUT.png (plot)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for hidden in map(int, args.hidden.split(",")):
        case = f"H={hidden} V={args.vocab}"
        steps = variants(hidden, args.vocab, args.layers, args.batch, args.length, args.device, dtype)
        times = best_times(steps, args.repeats, args.device)
        memory = {name: peak_extra_bytes(run, args.device) for name, run in steps.items()}
        base = next(iter(steps))
        for name in steps:
            rows.append({"case": case, "variant": name, "ms": 1e3 * times[name], "time_ratio": times[name] / times[base],
                         "mb": memory[name] / 2**20, "memory_ratio": memory[name] / memory[base]})
            r = rows[-1]
            print(f"{case:>18} {name:>52}: {r['ms']:9.1f} ms {r['time_ratio']:5.2f}x  {r['mb']:8.1f} MB "
                  f"{r['memory_ratio']:5.2f}x", flush=True)
    lines = [(f"Device: {device_name(args.device)}; torch {torch.__version__}; {args.dtype}; a {args.layers}-layer "
              f"Llama, {args.batch} × {args.length} tokens a step; min of {args.repeats} interleaved training steps "
              "(forward + backward)."
              + ("" if hasattr(F, "linear_cross_entropy") else
                 " This torch has no F.linear_cross_entropy, so its rows are missing.")), "",
             "| case | variant | time (ms) | time ÷ own loss | peak memory (MB) | memory ÷ own loss |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['variant']} | {r['ms']:.1f} | {r['time_ratio']:.2f} | {r['mb']:.1f} | "
              f"{r['memory_ratio']:.3f} |" for r in rows]
    write_results(args.out, lines, lambda path: ratio_panels(
        rows, path, "training step time ÷ the model's own loss", "peak memory of a step ÷ the model's own loss"))


if __name__ == "__main__":
    main()
