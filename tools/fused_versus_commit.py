#!/usr/bin/env python
"""The fused output layer's time now against an earlier commit's, on this machine: did a change make it slower?

Ratios taken against a baseline in one run (``output_layer_speed.py``) move when the baseline does, and on a
shared machine it does, by a third between runs. This times the same ``fused_output_loss`` steps (forward +
backward, float32, cross_entropy, sparse_softmax k=10 and as_softmax δ=0.3 on rows that all keep every class)
with the loss package of this checkout and of COMMIT (checked out in a temporary ``git worktree``), in
child processes that alternate between the two, and prints each one's minimum and the ratio now ÷ then. Commits
before the core became its own package have the layer in ``user_dir.losses``; the child takes it from there.

    python tools/fused_versus_commit.py 3de50f5 --case 4096x512x32000 --rounds 2
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "benchmarks")]
from measure import ROOT, best_times  # noqa: E402  (benchmarks/)

LOSSES = {"cross_entropy": {}, "sparse_softmax": {"k": 10}, "as_softmax": {"delta": 0.3}}


def child(root: Path, case: str, repeats: int) -> None:
    """Print (JSON) each loss's seconds a step with the package under ``root`` (``best_times``: the losses
    interleaved, the minimum of ``repeats`` after a warm-up)."""
    sys.path.insert(0, str(root))
    package = "sparse_softmax.losses" if (root / "sparse_softmax").is_dir() else "user_dir.losses"
    losses = importlib.import_module(package)
    if not Path(losses.__file__).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"{package} came from {losses.__file__}, not from {root}")
    n, h, v = map(int, case.split("x"))
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(n, h, generator=g) * 0.5).requires_grad_(True)
    weight = F.normalize(torch.randn(v, h, generator=g), dim=-1).requires_grad_(True)
    target = torch.randint(0, v, (n,), generator=g)

    def step(loss: str, options: dict) -> None:
        hidden.grad = weight.grad = None
        losses.fused_output_loss(hidden, weight, target, loss, **options).loss.backward()

    steps = {loss: lambda loss=loss, options=options: step(loss, options) for loss, options in LOSSES.items()}
    print(json.dumps(best_times(steps, repeats, "cpu")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit", nargs="?", help="the commit to compare with (anything git rev-parse takes)")
    parser.add_argument("--case", default="4096x512x32000", help="NxHxV (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="child processes per checkout, alternating")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per loss in a child")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.case, args.repeats)
    if args.commit is None:
        parser.error("the commit to compare with is required")
    resolved = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{args.commit}^{{commit}}"],
                              capture_output=True, text=True)
    if resolved.returncode:
        parser.error(f"no commit {args.commit!r} in {ROOT}")
    commit = resolved.stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        then = Path(tmp) / "then"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(then), commit],
                       check=True)
        try:
            best: dict[str, dict[str, float]] = {"then": {}, "now": {}}
            for round_ in range(1, args.rounds + 1):
                for name, root in (("then", then), ("now", ROOT)):
                    out = subprocess.run([sys.executable, __file__, "--child", str(root), "--case", args.case,
                                          "--repeats", str(args.repeats)], capture_output=True, text=True, cwd=tmp)
                    if out.returncode:
                        sys.exit(f"{name} ({root}) failed:\n{out.stderr.strip()}")
                    times = json.loads(out.stdout.strip().splitlines()[-1])
                    print(f"round {round_}, {name}: " + ", ".join(f"{k} {1e3 * t:.0f} ms" for k, t in times.items()),
                          flush=True)
                    for loss, t in times.items():
                        best[name][loss] = min(best[name].get(loss, t), t)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(then)], check=False)
    print(f"\nN×H×V = {args.case}, float32, minimum over {args.rounds} rounds × {args.repeats} steps; "
          f"then = {commit[:7]}, now = this checkout\n")
    print("| loss, fused | then (ms) | now (ms) | now ÷ then |\n|---|---:|---:|---:|")
    for loss in LOSSES:
        then_t, now_t = best["then"][loss], best["now"][loss]
        print(f"| {loss} | {1e3 * then_t:.0f} | {1e3 * now_t:.0f} | {now_t / then_t:.2f} |")


if __name__ == "__main__":
    main()
