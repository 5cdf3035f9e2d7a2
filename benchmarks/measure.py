"""What the benchmarks and experiments share: running the fairseq tools and reading their logs, the options that
pick an experiment's runs, the machine a run is on, interleaved best-of timing, the peak tensor memory of a step, and
steps run with a module's defaults replaced.

Timings on a shared machine swing with other work, so every benchmark takes the minimum of repeated
runs and interleaves the variants it compares within each repeat: noise then hits them alike, and
ratios are taken within one run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from torch.profiler._memory_profiler import Action


ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the fairseq-* tools of the interpreter running the benchmark


def run(command: list, log: Path | None = None, append: bool = False) -> str:
    """Run a CLI and return its output. With ``log``, the output goes there as it comes (a long training run can be
    followed with ``tail -f``), after what the log holds if ``append``. Failures show the output's tail."""
    command, env = [str(c) for c in command], {**os.environ, "PYTHONWARNINGS": "ignore"}
    if log is None:
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        output = proc.stdout + proc.stderr
    else:
        with open(log, "a" if append else "w", encoding="utf-8") as file:
            proc = subprocess.run(command, stdout=file, stderr=subprocess.STDOUT, text=True, env=env)
        output = log.read_text(encoding="utf-8")
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(map(str, command))}\n{output[-3000:]}")
    return output


def add_run_selection(parser: argparse.ArgumentParser, methods: list[str], default: list[str],
                      methods_note: str = "") -> None:
    """An experiment's options for which runs make its tables: ``--seeds``, ``--methods`` (of ``methods``; help: the
    ``default`` and ``methods_note``), and whether to run them again (``--fresh``) or not at all
    (``--table-only``)."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--methods", nargs="+", choices=methods, default=default,
                        help=f"default: {' '.join(default)}{methods_note}")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--fresh", action="store_true", help="re-run runs that already have results")
    again.add_argument("--table-only", action="store_true",
                       help="make the tables from the runs of --methods and --seeds already finished; run nothing")


def transformer_size(layers: int, dim: int, heads: int, ffn: int | None = None) -> list[str]:
    """fairseq transformer flags for an encoder and a decoder of the same size, FFNs ``ffn`` (4 × dim) wide."""
    return [str(value) for side in ("encoder", "decoder") for value in (
        f"--{side}-layers", layers, f"--{side}-embed-dim", dim, f"--{side}-ffn-embed-dim", ffn or 4 * dim,
        f"--{side}-attention-heads", heads)]


def mean_sd(values: list[float], digits: int = 2) -> str:
    """Mean ± sample standard deviation over seeds, as the experiment tables give them; one run is its value alone,
    since one run has no spread to show (a ``± 0.00`` would read as seeds that agree)."""
    mean = f"{statistics.mean(values):.{digits}f}"
    return f"{mean} ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else mean


def paired_difference(values: dict[int, float], baseline: dict[int, float]) -> str:
    """``values`` minus ``baseline`` on the same seed (both keyed by seed), mean ± sd over the seeds both have, and
    how many: the seed fixes initialisation and data order, so the paired difference is the one to read."""
    differences = [value - baseline[seed] for seed, value in values.items() if seed in baseline]
    return f"{mean_sd(differences)} ({len(differences)} seed{'' if len(differences) == 1 else 's'})"


def json_records(text: str, tag: str) -> list[dict]:
    """fairseq's ``--log-format json`` records of one kind (train_inner, valid, ...), without the
    ``valid_`` / ``test_`` prefix fairseq puts on the keys of validation records."""
    out = []
    for line in text.splitlines():
        if f"| {tag} |" in line and "{" in line:
            record = json.loads(line[line.index("{"):])
            out.append({key.removeprefix(f"{tag}_"): value for key, value in record.items()})
    return out


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"


def machine() -> str:
    """This machine since its last boot and its processor, kept in an experiment's records: seeds added later may run
    on another machine, of another speed, and a run's time is read with its machine. On Linux, the boot id, then the
    processor's model name (with its family and model: a virtual machine's name can be as short as ``AMD EPYC``) and
    the cores this process may use; elsewhere, the host name and ``platform.processor()``."""
    boot_id = Path("/proc/sys/kernel/random/boot_id")
    if not boot_id.exists():
        return f"{platform.node()} ({platform.processor()}, {os.cpu_count()} cores)"
    first_processor = Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first_processor)}
    family = f", family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else ""
    name = fields.get("model name", platform.machine())
    return f"{boot_id.read_text().strip()} ({name}{family}, {len(os.sched_getaffinity(0))} cores)"


def command_line(script: str | Path, argv: list[str] | None) -> str:
    """The command a results file names, as it is typed in the repository's root: ``python``, the script, then
    ``argv`` (default: this process's arguments) quoted for the shell. The script and every argument that is an
    absolute path inside the repository are written relative to it, so that the record names the repository's
    files, not the folders of the machine that made it."""
    def shown(arg) -> str:
        return str(Path(arg).relative_to(ROOT)) if Path(arg).is_relative_to(ROOT) else str(arg)

    return shlex.join(["python", *map(shown, [script, *(sys.argv[1:] if argv is None else argv)])])


def pyplot():
    """matplotlib's pyplot for PNG files: no display, and none of the DEBUG lines matplotlib logs once
    fairseq has set the root logger to DEBUG."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(ax, rows: list[dict], group: str, series: str, value: str, title: str,
                 baseline: float | None = 1.0) -> None:
    """One bar per row: ``rows[value]``, grouped on the x axis by ``rows[group]`` and coloured by
    ``rows[series]``, both in order of first appearance; a dashed line at ``baseline`` (None: none)."""
    import matplotlib

    groups, names = list(dict.fromkeys(r[group] for r in rows)), list(dict.fromkeys(r[series] for r in rows))
    width = 0.8 / len(names)
    colours = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"].colors  # tab10 repeats after 10
    for i, name in enumerate(names):
        values = [next(r[value] for r in rows if r[group] == g and r[series] == name) for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], values, width, label=name, color=colours[i % len(colours)])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, fontsize=8)
    if baseline is not None:
        ax.axhline(baseline, color="grey", lw=0.8, ls="--")
    ax.set_title(title)


def ratio_panels(rows: list[dict], path: Path, time_title: str, memory_title: str) -> None:
    """The plot of a speed-and-memory table: ``rows``' time_ratio and memory_ratio side by side, a bar a variant,
    grouped by case, saved to ``path``."""
    fig, axes = pyplot().subplots(1, 2, figsize=(13, 6.5))
    grouped_bars(axes[0], rows, "case", "variant", "time_ratio", time_title)
    grouped_bars(axes[1], rows, "case", "variant", "memory_ratio", memory_title)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(path, dpi=120)


def write_results(out: Path, lines: list[str], plot: Callable[[Path], None]) -> None:
    """The table to ``out.md`` and the plot to ``out.png``; the table is printed too."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    plot(out.with_suffix(".png"))
    print("\n".join(lines))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}")


@contextlib.contextmanager
def deterministic_algorithms(on: bool = True):
    """``torch.use_deterministic_algorithms(on)`` inside, as it was after."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def print_profile(title: str, step: Callable[[], None], device: str, rows: int = 12) -> None:
    """Print where one run of ``step`` (after one run to warm it up) spends its time, op by op
    (torch.profiler), the ops that took longest on the device first."""
    step()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
        sync(device)
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(f"--- profile: {title}\n" + prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=48),
          flush=True)


def best_times(steps: dict[str, Callable[[], None]], repeats: int, device: str) -> dict[str, float]:
    """Seconds of each step: one warm-up each, then the minimum of ``repeats`` interleaved runs."""
    for step in steps.values():
        step()
    best = {name: float("inf") for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def peak_extra_bytes(step: Callable[[], None], device: str) -> int:
    """Bytes ``step`` adds at its peak to what is allocated before it (what it frees, such as the ``.grad`` buffers
    ``zero_grad`` drops, makes room first; what outlives it counts). On CUDA from the allocator's counters; on the
    CPU from the profiler's record of the allocator (``_cpu_peak_bytes``)."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    return _cpu_peak_bytes(step)


def _cpu_peak_bytes(step: Callable[[], None]) -> int:
    """The CPU's ``peak_extra_bytes``, from the allocations and frees of the CPU allocator as the profiler records
    them (its memory timeline). ``step`` runs twice: the allocator knows the size of a buffer only if it was made
    under the profiler, so the first run makes what the second frees (the last step's gradients) known. Watching
    the ops from a Python dispatch mode instead would change what autograd does: its tensors' Python objects keep it
    from summing a gradient into its buffer in place or handing it to ``.grad`` as it is."""
    for _ in range(2):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                    record_shapes=True, with_stack=True) as profile:  # what the timeline needs
            step()
    live = peak = 0
    for _, action, _, size in profile._memory_profile().timeline:
        live += size if action == Action.CREATE else -size if action == Action.DESTROY else 0
        peak = max(peak, live)
    return peak
