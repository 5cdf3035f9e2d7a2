"""What changes over a training run: the sparse losses' warm-ups, AS-Softmax's δ, AS-Speed's accumulation.

Each is a function of the update count, so every front door (the fairseq criterions, the Hugging Face
callbacks) asks with its own counter, and a run resumed from a checkpoint, which restores that counter,
continues its schedule where it stopped.
"""
from __future__ import annotations

import math
from collections.abc import Callable


def in_warmup(ratio: float, max_update: int, update: int) -> bool:
    """Whether update ``update`` (0-based) falls in the first ``ratio`` of ``max_update``: the warm-up of the
    sparse losses, which train plain softmax over every class there."""
    return update < ratio * max_update


def warmup_end(ratio: float, max_update: int) -> int:
    """The first update (0-based) after the warm-up of ``in_warmup``: the one that trains the sparse loss first."""
    return math.ceil(ratio * max_update)


def as_delta(delta: float, update: int, max_update: int, warmup_ratio: float = 0.0, anneal_ratio: float = 0.0,
             anneal_from: float = 1.0) -> float:
    """The δ AS-Softmax trains with at update ``update`` (0-based) of ``max_update``.

    - The paper's warm-up (``warmup_ratio``): δ = 1, plain softmax, for that first part of training, then
      ``delta``.
    - The published code's annealing (``anneal_ratio``): δ starts at ``anneal_from`` (its initial δ, 1.0) and
      falls to ``delta`` (its minimum, 0.1 there) over that first part of training, then stays there. The code
      names the two ends only; the fall here is linear in the update count.

    The options are those ``check_as_schedule`` accepts.
    """
    if in_warmup(warmup_ratio, max_update, update):
        return 1.0
    span = anneal_ratio * max_update
    if update >= span:
        return delta
    return anneal_from + (delta - anneal_from) * update / span


def check_as_schedule(delta: float, warmup_ratio: float, anneal_ratio: float, anneal_from: float,
                      name: Callable[[str], str] = str) -> None:
    """Refuses options of ``as_delta`` that do not make one schedule, with a ``ValueError`` that names each
    option by ``name`` (keyword → the front door's spelling: ``"--as-" + keyword.replace("_", "-")`` for the
    fairseq criterion), so every front door reports the same mistakes in its own words.

    One schedule at a time: a warm-up that ends in an annealing would be a third method."""
    if warmup_ratio and anneal_ratio:
        raise ValueError(f"{name('warmup_ratio')} and {name('anneal_ratio')}: choose one (both start from a "
                         "softmax-like delta)")
    if anneal_from != 1.0 and not anneal_ratio:
        raise ValueError(f"{name('anneal_from')} is where {name('anneal_ratio')} starts: set {name('anneal_ratio')}")
    if anneal_ratio and anneal_from < delta:
        raise ValueError(f"{name('anneal_from')} {anneal_from:g} is below {name('delta')} {delta:g}: the annealing "
                         f"only lowers delta, from {name('anneal_from')} down to {name('delta')}")


def next_accumulation(prev: int, n_rows: float, n_masked: float, lam: float, max_steps: int) -> int:
    """AS-Speed's rule (Lv et al.): the micro-batches to accumulate for the next update, from the last update's
    ``n_rows`` rows of which ``n_masked`` AS masked whole (zero loss and gradient):
    ``min(max_steps, prev + 1, max(prev, round(λ · n_rows / (n_rows − n_masked))))`` — monotone, at most +1
    per update; halves round up, and an update whose rows were all masked asks for ``prev + 1``. With several
    data-parallel workers the counts must be summed over all of them first, so every worker takes the same
    steps."""
    if n_rows <= 0:  # nothing counted (e.g. an update of padding-only dummy batches): keep the steps
        return prev
    wanted = math.inf if n_masked >= n_rows else math.floor(lam * n_rows / (n_rows - n_masked) + 0.5)
    return int(min(max_steps, prev + 1, max(prev, wanted)))
