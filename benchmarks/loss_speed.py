#!/usr/bin/env python
"""Forward+backward time and peak memory of sparse_softmax_loss / as_softmax_loss vs F.cross_entropy.

Times are the minimum over ``--repeats`` runs, the three losses interleaved within each repeat so
that machine noise hits them alike; ratios are against cross-entropy measured in the same run.
Peak memory is what one forward+backward allocates beyond the logits, in units of one N×V float32
buffer: on CUDA from the allocator's peak counter, on CPU from the allocations the profiler records
(``measure.peak_extra_bytes``). The logits are a leaf here, so each row includes the ``.grad`` buffer
autograd accumulates into.

    python benchmarks/loss_speed.py                     # both default cases, table + PNG
    python benchmarks/loss_speed.py --device cuda --dtype bfloat16 --cases 16384x32000,16384x128000
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from measure import best_times, device_name, grouped_bars, peak_extra_bytes, print_profile, pyplot, write_results
from sparse_softmax.losses import as_softmax_loss, sparse_softmax_loss

LOSSES = {
    "cross_entropy": lambda z, t: F.cross_entropy(z, t, reduction="sum"),
    "sparse_softmax(k=10)": lambda z, t: sparse_softmax_loss(z, t, 10),
    "as_softmax(δ=0.3)": lambda z, t: as_softmax_loss(z, t, 0.3),
}
CASES = [(4096, 32000), (1024, 8000)]


def make_inputs(n: int, v: int, device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(n, v, generator=g) * 2).to(device, dtype).requires_grad_(True)
    return logits, torch.randint(0, v, (n,), generator=g).to(device)


def step(loss, logits, target) -> None:
    logits.grad = None
    loss(logits, target).backward()


def time_all(fns: dict, n: int, v: int, device: str, dtype: torch.dtype, repeats: int) -> dict[str, float]:
    logits, target = make_inputs(n, v, device, dtype)
    return best_times({name: lambda fn=fn: step(fn, logits, target) for name, fn in fns.items()}, repeats, device)


def peak_buffers(loss, n: int, v: int, device: str, dtype: torch.dtype) -> int:
    """Bytes one forward+backward allocates beyond the logits, at its peak."""
    logits, target = make_inputs(n, v, device, dtype)
    return peak_extra_bytes(lambda: step(loss, logits, target), device)


def plot(rows: list[dict], path: Path) -> None:
    fig, axes = pyplot().subplots(1, 2, figsize=(10, 3.8))
    grouped_bars(axes[0], rows, "case", "loss", "time_ratio", "fwd+bwd time / cross_entropy")
    grouped_bars(axes[1], rows, "case", "loss", "extra_buffers", "peak extra memory (N×V fp32 buffers)", None)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the logits (the losses score half-precision logits in float32)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default=",".join(f"{n}x{v}" for n, v in CASES), help="NxV,NxV,...")
    parser.add_argument("--profile", action="store_true", help="also print each loss's op-by-op profile")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "loss_speed",
                        help="writes OUT.md (table) and OUT.png (plot)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    fns = LOSSES
    for case in args.cases.split(","):
        n, v = map(int, case.split("x"))
        times = time_all(fns, n, v, args.device, dtype, args.repeats)
        buffer = n * v * 4
        for name, fn in fns.items():
            extra = peak_buffers(fn, n, v, args.device, dtype)
            rows.append({"case": f"N={n} V={v}", "loss": name, "ms": times[name] * 1e3,
                         "time_ratio": times[name] / times["cross_entropy"], "extra_buffers": extra / buffer})
            r = rows[-1]
            print(f"{r['case']:>16} {name:>30}: {r['ms']:8.1f} ms  {r['time_ratio']:5.2f}x CE  "
                  f"peak +{r['extra_buffers']:.2f} N×V", flush=True)
            if args.profile:
                logits, target = make_inputs(n, v, args.device, dtype)
                print_profile(f"{name}, N={n} V={v}", lambda: step(fn, logits, target), args.device)
    device = device_name(args.device)
    lines = [f"Device: {device}; torch {torch.__version__}; {args.dtype} logits; min of {args.repeats} fwd+bwd runs.", "",
             "| case | loss | time (ms) | time / CE | peak extra memory (N×V fp32 buffers) |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['loss']} | {r['ms']:.1f} | {r['time_ratio']:.2f} | {r['extra_buffers']:.2f} |" for r in rows]
    write_results(args.out, lines, lambda path: plot(rows, path))


if __name__ == "__main__":
    main()
