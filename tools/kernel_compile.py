#!/usr/bin/env python
"""Compiles every Triton kernel of the losses for a GPU on any machine, no GPU needed: what Triton's compiler
refuses (the interpreter, which the CPU tests use, runs some code the compiler does not take), and each kernel's
registers and spills as ``ptxas`` reports them, with how many of its programs an SM's registers can hold at once
(an upper bound on the rows or tiles in flight: shared memory and the SM's thread limit may allow fewer).

Each kernel is compiled with the arguments its own launch function passes it, captured instead of launched (bf16
inputs, the default ``Tiles``, and each alternative: the row kernel also writing which rows it swept again, the AS
kernel with δ < 1 and δ = 1, both row kernels without a gradient (its pointers None), the sparse layer's backward with
the weight's gradient by atomic adds or by sorting (deterministic algorithms), and the sorted sum's two launches; the
row kernel and the backward also at the largest k they take, which asks for the most registers). ``--tuning`` adds the
settings tools/kernel_tuning.py times. Needs a Triton with its NVIDIA backend (its wheels bring ``ptxas``); exits 1 if
a kernel does not compile.

    python tools/kernel_compile.py                 # for sm_90 (H100, H200)
    python tools/kernel_compile.py --arch 80 --tuning
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("kernel_compile.py compiles the kernels: run it without TRITON_INTERPRET=1")

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from sparse_softmax.losses import as_softmax_triton, output_layer_triton, sparse_softmax_triton
from sparse_softmax.losses.dispatch import MAX_K, Tiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from measure import deterministic_algorithms  # noqa: E402  (benchmarks/)

TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
         torch.int32: "i32", torch.bool: "i1"}


def captured(kernel, launch: Callable[[], object]) -> tuple[tuple, dict]:
    """The arguments ``launch()`` hands ``kernel`` (a ``triton.jit`` function) in its last launch. No kernel is run:
    every launch ``launch()`` makes is captured instead."""
    calls = []
    run = JITFunction.run
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: calls.append((self, args, kwargs))
    try:
        launch()
    finally:
        JITFunction.run = run
    return next((args, kwargs) for fn, args, kwargs in reversed(calls) if fn is kernel)


def signature(kernel, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    """(signature, constexpr values, compile options) of a launch, as ``triton.compile`` takes them."""
    kwargs = dict(kwargs)
    options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages") if key in kwargs}
    values = dict(zip(kernel.arg_names, args)) | kwargs
    types, constants = {}, {}
    for param in kernel.params:
        value = values[param.name]
        if param.is_constexpr or value is None:  # an absent pointer is a compile-time None
            types[param.name], constants[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            types[param.name] = "*" + TYPES[value.dtype]
        elif isinstance(value, bool):
            types[param.name] = "i1"
        elif isinstance(value, int):
            types[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        else:
            types[param.name] = "fp32"
    return types, constants, options


def compile_for(kernel, launch: Callable[[], object], arch: int) -> str:
    """Compile the launch for sm_``arch``; its registers and spills (ptxas's), and how many of its programs an
    SM's registers hold."""
    types, constants, options = signature(kernel, *captured(kernel, launch))
    compiled = triton.compile(ASTSource(kernel, types, constants), target=GPUTarget("cuda", arch, 32),
                              options=options)
    ptx = compiled.asm["ptx"]
    gpu = re.search(r"^\.target\s+(\w+)", ptx, flags=re.M)[1]
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    blackwell = os.path.join(tools, "ptxas-blackwell")  # Triton's wheels bring one for sm_100 and later
    ptxas = blackwell if arch >= 100 and os.path.exists(blackwell) else os.path.join(tools, "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        out = subprocess.run([ptxas, "-v", "--gpu-name", gpu, source.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    registers = int(re.search(r"Used (\d+) registers", out.stderr)[1])
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out.stderr)
    # An SM's 65,536 registers, given out in 8-register steps a thread: at most this many programs at once.
    threads = 32 * options.get("num_warps", 4)
    programs = 65536 // (-(-registers // 8) * 8 * threads)
    return (f"{registers} registers, spills {spills[1]} B stored / {spills[2]} B loaded; "
            f"an SM's registers hold {programs} program{'' if programs == 1 else 's'} of {threads} threads")


def launches(tuning: bool) -> dict[str, tuple]:
    """name → (kernel, launch function) for every compile to check."""
    g = torch.Generator().manual_seed(0)
    n, h, v, k = 8, 64, 10000, 10  # V above every block any setting asks for, which a smaller V would cut down
    z = torch.randn(n, v, generator=g).bfloat16()
    target = torch.randint(0, v, (n,), generator=g)
    hidden, weight = torch.randn(n, h, generator=g).bfloat16(), torch.randn(v, h, generator=g).bfloat16()
    rows, weights = torch.arange(n), torch.ones(n)
    row, layer = sparse_softmax_triton, output_layer_triton

    def row_kernel(top: int = k, tiles: Tiles = Tiles(), want_grad=True, swept: torch.Tensor | None = None):
        return row.sparse_softmax_chunk_triton(z, target, top, 0.1, want_grad, tiles, swept)

    def pairs(top: int = k) -> tuple[torch.Tensor, torch.Tensor]:
        """k + 1 gradient pairs a row, of three classes: more pairs a class than a small ``Tiles.piece``."""
        return torch.randint(0, 3, (n, top + 1), generator=g), torch.randn(n, top + 1, generator=g)

    def backward(top: int = k):
        layer.sparse_layer_backward_triton(hidden, weight, rows, *pairs(top), torch.zeros(n, h), torch.zeros(v, h))

    def sorted_backward():
        with deterministic_algorithms():
            backward()

    def sorted_sum(tiles: Tiles = Tiles()):  # its last launch adds up the pieces of split classes, when there are any
        classes, grad = pairs()
        layer.sorted_weight_gradient(hidden, rows.repeat_interleave(k + 1), classes.flatten(), grad.flatten(),
                                     torch.zeros(v, h), tiles)

    def as_kernel(delta: float, tiles: Tiles = Tiles(), want_grad: bool = True):
        return as_softmax_triton._as_softmax_row, lambda: as_softmax_triton.as_softmax_rows_triton(
            z, target, weights, delta, want_grad, in_place=True, tiles=tiles)

    out = {  # at k = MAX_K, the largest the kernels take, they ask for the most registers
        "Sparse-softmax row kernel": (row._sparse_softmax_row, row_kernel),
        f"Sparse-softmax row kernel, k = {MAX_K}": (row._sparse_softmax_row, lambda: row_kernel(MAX_K)),
        "Sparse-softmax row kernel, no gradient": (row._sparse_softmax_row, lambda: row_kernel(want_grad=False)),
        "Sparse-softmax row kernel, swept rows written": (
            row._sparse_softmax_row, lambda: row_kernel(swept=torch.empty(n, dtype=torch.int32))),
        "AS row kernel, δ = 0.3": as_kernel(0.3),
        "AS row kernel, δ = 1 (cross_entropy)": as_kernel(1.0),
        "AS row kernel, δ = 0.3, no gradient": as_kernel(0.3, want_grad=False),
        "layer's backward, weight gradient by atomic adds": (layer._sparse_layer_backward, backward),
        f"layer's backward, weight gradient by atomic adds, k = {MAX_K}": (
            layer._sparse_layer_backward, lambda: backward(MAX_K)),
        "layer's backward, weight gradient by sorting": (layer._sparse_layer_backward, sorted_backward),
        "sorted weight gradient, pieces": (layer._sum_pieces, sorted_sum),
        "sorted weight gradient, split classes' pieces added": (layer._sum_pieces, lambda: sorted_sum(Tiles(piece=4))),
    }
    if tuning:
        from kernel_tuning import AS_SETTINGS, ROW_SETTINGS, as_setting, row_setting
        for setting in AS_SETTINGS:
            name, tiles = as_setting(*setting)
            out[f"AS row kernel, δ = 0.3, {name}"] = as_kernel(0.3, tiles)
        for setting in ROW_SETTINGS:
            name, tiles = row_setting(*setting)
            out[f"Sparse-softmax row kernel, {name}"] = (row._sparse_softmax_row, lambda tiles=tiles: row_kernel(
                tiles=tiles))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="the GPU's compute capability × 10 (default: %(default)s)")
    parser.add_argument("--tuning", action="store_true", help="also every setting kernel_tuning.py times")
    args = parser.parse_args()
    failed = 0
    for name, (kernel, launch) in launches(args.tuning).items():
        try:
            print(f"{name}: {compile_for(kernel, launch, args.arch)}", flush=True)
        except Exception as error:  # every kernel gets its turn; the failures are counted and summed up
            failed += 1
            print(f"{name}: FAILED: {type(error).__name__}: {error}", flush=True)
    print(f"{failed} of the kernels did not compile" if failed else "all compiled", f"for sm_{args.arch}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
