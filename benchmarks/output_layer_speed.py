#!/usr/bin/env python
"""The output layer with its loss: features → loss → gradients of the features and the weight.

``fused_output_loss`` (``--fused-output-layer``) against the unfused path, ``F.linear`` + the loss +
backward, against PyTorch's own fused ``F.linear_cross_entropy`` (reference and chunked) and against the
baseline every ratio is taken to: ``F.linear`` + ``F.cross_entropy`` + backward, all in the same run,
interleaved, the minimum of ``--repeats`` (see ``measure.py``). Peak memory is what one step allocates
beyond its inputs (the weight's and features' gradients included).

AS-Softmax's fused backward costs in proportion to the rows that keep (nearly) every class, so it runs
at several shares of such *dense* rows: the features are built so that a given share of rows has a
small target probability (dense), and the others are split between rows whose target already wins
outright (masked: loss and gradient 0) and rows with the target and one other class near 1/2 each
(sparse: two classes kept). The shares actually measured are printed beside the times.

    python benchmarks/output_layer_speed.py          # the small, 4096x512x32000 and 8192x1024x50000 cases
    python benchmarks/output_layer_speed.py --device cuda --dtype bfloat16 --cases 16384x1024x32000
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from measure import (best_times, deterministic_algorithms, device_name, peak_extra_bytes, print_profile,
                     ratio_panels, write_results)
from sparse_softmax.losses import as_softmax, fused_output_loss, sparse_softmax_loss

CASES = "1024x256x8000,4096x512x32000,8192x1024x50000"
DENSE_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
K, DELTA = 10, 0.3


def make_case(n: int, h: int, v: int, dense_share: float, device: str, dtype: torch.dtype, seed: int = 0):
    """(features, weight, target) whose AS rows are dense for the first ``dense_share`` of the rows."""
    g = torch.Generator().manual_seed(seed)
    weight = F.normalize(torch.randn(v, h, generator=g), dim=-1)
    target = torch.randint(0, v, (n,), generator=g)
    hidden = torch.randn(n, h, generator=g) * 0.5
    other = (target + 1 + torch.randint(0, v - 1, (n,), generator=g)) % v
    rest = torch.arange(n) >= round(dense_share * n)
    masked, sparse = rest & (torch.arange(n) % 2 == 0), rest & (torch.arange(n) % 2 == 1)
    hidden[masked] = 20 * weight[target[masked]]
    hidden[sparse] = 20 * (weight[target[sparse]] + weight[other[sparse]])
    return (hidden.to(device, dtype).requires_grad_(True), weight.to(device, dtype).requires_grad_(True),
            target.to(device))


def variants(n: int, h: int, v: int, device: str, dtype: torch.dtype, impl: str = "auto") -> dict[str, tuple]:
    """name → (step function, inputs): each step does forward and backward on its own inputs, the package's losses
    by ``impl`` (its tests run the GPU's variants on the CPU with "triton", in Triton's interpreter)."""
    full = make_case(n, h, v, 1.0, device, dtype)

    def step(inputs, loss_fn):
        def run():
            hidden, weight, target = inputs
            hidden.grad = weight.grad = None
            loss_fn(hidden, weight, target).backward()
        return run

    out = {
        "baseline: F.linear + F.cross_entropy": (step(full, lambda h_, w, t: F.cross_entropy(
            F.linear(h_, w).float(), t, reduction="sum")), full),
        **linear_cross_entropy(step, full),
        "cross_entropy, fused": (step(full, lambda h_, w, t: fused_output_loss(
            h_, w, t, "cross_entropy", impl=impl).loss), full),
        f"sparse_softmax k={K}": (step(full, lambda h_, w, t: sparse_softmax_loss(
            F.linear(h_, w), t, K, impl=impl)), full),
        f"sparse_softmax k={K}, fused": (step(full, lambda h_, w, t: fused_output_loss(
            h_, w, t, "sparse_softmax", k=K, impl=impl).loss), full),
        f"as_softmax δ={DELTA}": (step(full, lambda h_, w, t: as_softmax(F.linear(h_, w), t, DELTA, impl=impl).loss),
                                  full),
    }
    if device == "cuda" or impl == "triton":  # the fused sparse_softmax's deterministic backward (by sorting)
        fused = out[f"sparse_softmax k={K}, fused"][0]

        def deterministic():
            with deterministic_algorithms():
                fused()

        out[f"sparse_softmax k={K}, fused, deterministic (weight gradient by sorting)"] = (deterministic, full)
    for share in DENSE_SHARES:
        data = make_case(n, h, v, share, device, dtype, seed=1)
        name = f"as_softmax δ={DELTA}, fused, {share:.0%} dense"
        out[name] = (step(data, lambda h_, w, t: fused_output_loss(h_, w, t, "as_softmax", delta=DELTA,
                                                                   impl=impl).loss), data)
    return out


def linear_cross_entropy(step, inputs) -> dict[str, tuple]:
    """PyTorch's own fused layer, ``F.linear_cross_entropy`` (torch 2.13), on its reference path and on its
    chunked one (``LinearCrossEntropyOptions()``: batch chunks, no N×V logits); nothing on an older torch,
    which ``main`` says."""
    if not hasattr(F, "linear_cross_entropy"):
        return {}
    chunked = torch.nn.LinearCrossEntropyOptions()
    return {
        "F.linear_cross_entropy": (step(inputs, lambda h_, w, t: F.linear_cross_entropy(
            h_, w, t, reduction="sum")), inputs),
        "F.linear_cross_entropy, chunked": (step(inputs, lambda h_, w, t: F.linear_cross_entropy(
            h_, w, t, reduction="sum", options=chunked)), inputs),
    }


def shares(inputs) -> str:
    """The measured shares of dense and masked AS rows of ``inputs``."""
    hidden, weight, target = inputs
    with torch.no_grad():
        out = fused_output_loss(hidden, weight, target, "as_softmax", delta=DELTA)
    n = target.numel()
    return f"{int(out.n_dense) / n:.0%} / {int(out.n_masked) / n:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=CASES, help="NxHxV,... (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "output_layer_speed",
                        help="writes OUT.md (table) and OUT.png (plot)")
    parser.add_argument("--profile", metavar="TEXT", action="append", default=[],
                        help="also print the op-by-op profile of the variants whose names contain TEXT (repeatable)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for case in args.cases.split(","):
        n, h, v = map(int, case.split("x"))
        steps = variants(n, h, v, args.device, dtype)
        times = best_times({name: s[0] for name, s in steps.items()}, args.repeats, args.device)
        memory = {name: peak_extra_bytes(s[0], args.device) for name, s in steps.items()}
        for name, (run, _) in steps.items():
            if any(text in name for text in args.profile):
                print_profile(f"{name}, N={n} H={h} V={v}", run, args.device)
        base = next(iter(steps))
        for name, (_, inputs) in steps.items():
            rows.append({"case": f"N={n} H={h} V={v}", "variant": name, "ms": 1e3 * times[name],
                         "time_ratio": times[name] / times[base], "mb": memory[name] / 2**20,
                         "memory_ratio": memory[name] / memory[base],
                         "shares": shares(inputs) if name.startswith("as_softmax") else ""})
            r = rows[-1]
            print(f"{r['case']:>24} {name:>44}: {r['ms']:9.1f} ms {r['time_ratio']:5.2f}x  "
                  f"{r['mb']:8.1f} MB {r['memory_ratio']:5.2f}x  {r['shares']}", flush=True)
    device = device_name(args.device)
    lines = [(f"Device: {device}; torch {torch.__version__}; {args.dtype}; min of {args.repeats} interleaved "
              "forward+backward runs."
              + ("" if hasattr(F, "linear_cross_entropy") else
                 " This torch has no F.linear_cross_entropy, so its rows are missing.")), "",
             ("| case | variant | time (ms) | time ÷ baseline | peak extra memory (MB) | memory ÷ baseline "
              "| AS rows dense / masked |"), "|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['case']} | {r['variant']} | {r['ms']:.1f} | {r['time_ratio']:.2f} | {r['mb']:.1f} | "
              f"{r['memory_ratio']:.3f} | {r['shares']} |" for r in rows]
    write_results(args.out, lines, lambda path: ratio_panels(
        rows, path, "forward + backward time ÷ baseline", "peak memory beyond the inputs ÷ baseline"))


if __name__ == "__main__":
    main()
