#!/usr/bin/env python
"""Times the GPU kernels' settings, to choose the defaults their modules hold: lanes and warps of the
Sparse-softmax row kernel (``sparse_softmax_triton``), block and warps of the AS row kernel
(``as_softmax_triton``), the weight gradient of the Sparse-softmax layer's backward (atomic adds, or sorting as
deterministic algorithms do, ``output_layer_triton``), the rows a block of the fused output layer's block path
takes on an accelerator (cross_entropy, as_softmax).

Each setting is timed against what bounds it in the same run, interleaved (``measure.best_times``): the sparse
layer's forward (blocks of ``F.linear`` logits scored by the row kernel) against ``F.linear`` alone, the product it
cannot beat; the row kernel against ``F.cross_entropy``'s forward on the same logits, which reads them once; the AS
kernel (loss and gradient, written in place as the fused layer has it: its time does not depend on the values it
reads) against ``F.cross_entropy``'s forward and backward on the same logits; the sparse layer's backward (from k + 1 gradient
pairs a row, on classes drawn uniformly and from a Zipf law, as a trained model's top k, where a few words are in
most rows) by sorting, at several piece sizes, against by atomic adds; the block path's forward + backward at
several block sizes against ``F.linear`` + ``F.cross_entropy`` + backward. On a CUDA device;
``--device cpu`` (in Triton's interpreter) only checks that every step runs.

    python tools/kernel_tuning.py --cases 16384x1024x32000,16384x1024x128000
    TRITON_INTERPRET=1 python tools/kernel_tuning.py --device cpu --cases 4x16x64 --out /tmp/tuning.md
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from sparse_softmax.losses import fused_output_loss, output_layer
from sparse_softmax.losses import as_softmax_triton as as_kernel
from sparse_softmax.losses import output_layer_triton as layer_kernel
from sparse_softmax.losses import sparse_softmax_triton as row_kernel
from sparse_softmax.losses.dispatch import Tiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from measure import best_times, deterministic_algorithms, device_name  # noqa: E402  (benchmarks/)

K = 10
#: Row kernel settings: lanes, warps (``Tiles.sparse_block``, ``sparse_warps``; the default 512, 2 first).
ROW_SETTINGS = [(512, 2), (256, 2), (512, 4), (1024, 2), (1024, 4)]
#: AS row kernel settings: block, warps (``Tiles.as_block``, ``as_warps``; the default 2048, 4 first).
AS_SETTINGS = [(2048, 4), (2048, 8), (4096, 4), (4096, 8), (1024, 4), (8192, 8)]
#: Sorted weight gradient: the pairs of a class one program sums at most (``Tiles.piece``).
PIECES = [64, 256, 1024]
#: Logits a block of the fused block path may hold on an accelerator: the default (2^28, ``Tiles.fused_elements``)
#: and two larger; smaller blocks were slower on both GPUs measured (each block adds its V×H weight-gradient
#: product to the float32 sum).
BLOCK_BUDGETS = [1 << 28, 1 << 29, 1 << 30]


def row_setting(block: int, warps: int) -> tuple[str, Tiles]:
    """A ``ROW_SETTINGS`` entry: the end of its name, and its tiles."""
    return f"{block} lanes, {warps} warps", Tiles(sparse_block=block, sparse_warps=warps)


def as_setting(block: int, warps: int) -> tuple[str, Tiles]:
    """An ``AS_SETTINGS`` entry: the end of its name, and its tiles."""
    return f"block {block}, {warps} warps", Tiles(as_block=block, as_warps=warps)


def layer_rows(n: int, h: int, v: int, repeats: int, device: str) -> list[str]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).to(device, torch.bfloat16)
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(device, torch.bfloat16)
    target = torch.randint(0, v, (n,), generator=g).to(device)
    rows = torch.arange(n, device=device)
    tiles = Tiles()
    block = tiles.rows(hidden.device, v, fused=True, width=h)

    def by_blocks():
        output_layer.sparse_pairs_by_blocks(hidden, weight, None, rows, target, K, 0.0, True, tiles)

    steps = {"F.linear (bf16 logits)": lambda: F.linear(hidden, weight),
             f"F.linear then the row kernel, blocks of {block} rows": by_blocks}
    return table(f"N={n} H={h} V={v}", best_times(steps, repeats, device))


def row_rows(n: int, v: int, repeats: int, device: str) -> list[str]:
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(n, v, generator=g) * 2).to(device, torch.bfloat16)
    target = torch.randint(0, v, (n,), generator=g).to(device)
    steps = {"F.cross_entropy forward (bf16 logits)": lambda: F.cross_entropy(z, target, reduction="sum"),
             f"torch.topk k={K}": lambda: torch.topk(z, K, dim=1)}
    for setting in ROW_SETTINGS:
        name, tiles = row_setting(*setting)
        steps[f"row kernel, {name}"] = lambda tiles=tiles: row_kernel.sparse_softmax_chunk_triton(
            z, target, K, 0.0, True, tiles)
    return table(f"N={n} V={v}", best_times(steps, repeats, device))


def as_rows(n: int, v: int, repeats: int, device: str) -> list[str]:
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(n, v, generator=g) * 2).to(device, torch.bfloat16)
    logits = z.clone().requires_grad_(True)
    target = torch.randint(0, v, (n,), generator=g).to(device)
    weight = torch.ones(n, device=z.device)

    def cross_entropy():
        logits.grad = None
        F.cross_entropy(logits, target, reduction="sum").backward()

    steps = {"F.cross_entropy forward + backward (bf16 logits)": cross_entropy}
    for delta in (0.3, 1.0):
        for setting in AS_SETTINGS if delta < 1 else AS_SETTINGS[:1]:
            name, tiles = as_setting(*setting)
            steps[f"AS kernel δ={delta}, {name}"] = lambda delta=delta, tiles=tiles: as_kernel.as_softmax_rows_triton(
                z, target, weight, delta, True, in_place=True, tiles=tiles)
    return table(f"N={n} V={v}", best_times(steps, repeats, device))


def backward_rows(n: int, h: int, v: int, repeats: int, device: str) -> list[str]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).to(device, torch.bfloat16)
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(device, torch.bfloat16)
    rows = torch.arange(n, device=device)
    grad = torch.randn(n, K + 1, generator=g).to(device)
    grad_hidden, grad_weight = torch.zeros(n, h, device=device), torch.zeros(v, h, device=device)
    zipf = 1 / torch.arange(1, v + 1, dtype=torch.float64)
    steps = {}
    for law, classes in (("uniform", torch.randint(0, v, (n, K + 1), generator=g)),
                         ("Zipf", torch.multinomial(zipf, n * (K + 1), replacement=True, generator=g).view(n, K + 1))):
        def backward(classes=classes.to(device), by_sorting=False, tiles=Tiles()):
            with deterministic_algorithms(by_sorting):
                layer_kernel.sparse_layer_backward_triton(hidden, weight, rows, classes, grad, grad_hidden,
                                                          grad_weight, tiles)

        steps[f"{law} classes, weight gradient by atomic adds"] = backward
        for piece in PIECES:
            steps[f"{law} classes, by sorting, pieces of {piece} pairs"] = (
                lambda backward=backward, piece=piece: backward(by_sorting=True, tiles=Tiles(piece=piece)))
    return table(f"N={n} H={h} V={v}", best_times(steps, repeats, device))


def block_rows(n: int, h: int, v: int, repeats: int, device: str) -> list[str]:
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(n, h, generator=g) * 0.5).to(device, torch.bfloat16).requires_grad_(True)
    weight = F.normalize(torch.randn(v, h, generator=g), dim=-1).to(device, torch.bfloat16).requires_grad_(True)
    target = torch.randint(0, v, (n,), generator=g).to(device)

    def step(loss_fn):
        def run():
            hidden.grad = weight.grad = None
            loss_fn().backward()
        return run

    steps = {"F.linear + F.cross_entropy": step(lambda: F.cross_entropy(F.linear(hidden, weight).float(), target,
                                                                       reduction="sum"))}
    for budget in BLOCK_BUDGETS:
        for loss in ("cross_entropy", "as_softmax"):
            name = f"{loss}, fused, blocks of 2^{budget.bit_length() - 1} logits ({min(n, max(h, budget // v))} rows)"
            steps[name] = step(lambda loss=loss, tiles=Tiles(fused_elements=budget): fused_output_loss(
                hidden, weight, target, loss, tiles=tiles).loss)
    return table(f"N={n} H={h} V={v}", best_times(steps, repeats, device))


def table(case: str, times: dict[str, float]) -> list[str]:
    base = next(iter(times.values()))
    lines = [f"| {case} | {name} | {1e3 * t:.2f} | {t / base:.2f} |" for name, t in times.items()]
    print("\n".join(lines), flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="16384x1024x32000,16384x1024x128000", help="NxHxV,...")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "kernel_tuning.md")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a check that every step runs, the kernels in Triton's interpreter (its times "
                             "mean nothing; TRITON_INTERPRET=1 must be set)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("the kernels are tuned on a CUDA device; none is present")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("on the CPU the kernels run only in Triton's interpreter: set TRITON_INTERPRET=1")
    header = ["| case | setting | ms | ÷ first row |", "|---|---|---:|---:|"]
    sections = {"Sparse-softmax layer, forward with gradient pairs (bf16)": [],
                "Sparse-softmax row kernel, forward with gradient pairs (bf16 logits)": [],
                "AS row kernel, loss and gradient (bf16 logits)": [],
                f"Sparse-softmax layer's backward from {K + 1} gradient pairs a row (bf16)": [],
                "Fused block path, forward + backward (bf16)": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for case in args.cases.split(","):
        n, h, v = map(int, case.split("x"))
        layer, rows, as_kernel_rows, backward, blocks = sections.values()
        layer += layer_rows(n, h, v, args.repeats, args.device)
        rows += row_rows(n, v, args.repeats, args.device)
        as_kernel_rows += as_rows(n, v, args.repeats, args.device)
        backward += backward_rows(n, h, v, args.repeats, args.device)
        blocks += block_rows(n, h, v, args.repeats, args.device)
        lines = [f"Device: {device_name(args.device)}; torch {torch.__version__}; min of {args.repeats} "
                 f"interleaved runs; k = {K}."]
        for title, body in sections.items():
            lines += ["", f"## {title}", "", *header, *body]
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")  # after each case: a run cut short keeps it
        print(f"wrote {args.out} ({case})")


if __name__ == "__main__":
    main()
