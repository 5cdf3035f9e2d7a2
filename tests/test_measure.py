"""The summaries every experiment table is made of (benchmarks/measure.py)."""
from __future__ import annotations

from measure import mean_sd, paired_difference  # benchmarks/ (pyproject.toml's pytest pythonpath)


def test_mean_sd_is_the_sample_sd_and_one_run_has_none():
    assert mean_sd([1.0, 2.0, 4.0]) == "2.33 ± 1.53"  # sd = sqrt(((1 - 7/3)² + (2 - 7/3)² + (4 - 7/3)²) / 2)
    assert mean_sd([7.36, 7.36]) == "7.36 ± 0.00", "seeds that agree keep their ± 0"
    assert mean_sd([27.954]) == "27.95"


def test_paired_difference_pairs_by_seed_and_counts_the_seeds():
    values, baseline = {1: 3.0, 2: 5.0, 4: 1.0}, {1: 1.0, 2: 2.0, 3: 9.0}
    assert paired_difference(values, baseline) == "2.50 ± 0.71 (2 seeds)"  # differences 2 and 3: seeds 3, 4 unpaired
    assert paired_difference({1: 28.77}, {1: 28.96}) == "-0.19 (1 seed)"
