"""The training schedules of ``sparse_softmax.schedules`` (plain functions, no fairseq): the warm-ups, AS's δ
annealing and AS-Speed's step rule, each against values worked out by hand."""
from __future__ import annotations

import pytest

from sparse_softmax.schedules import as_delta, check_as_schedule, in_warmup, next_accumulation


@pytest.mark.parametrize("update, expected", [(0, True), (29, True), (30, False), (99, False)])
def test_warmup_is_the_first_ratio_of_the_updates(update, expected):
    assert in_warmup(0.3, 100, update) is expected


@pytest.mark.parametrize("update, expected", [(0, 1.0), (29, 1.0), (30, 0.3), (99, 0.3)])
def test_as_warmup_delta(update, expected):
    assert as_delta(0.3, update, 100, warmup_ratio=0.3) == expected


# δ from 1.0 down to 0.1 over the first 40 of 100 updates: 0.9 / 40 = 0.0225 less per update
@pytest.mark.parametrize("update, expected", [(0, 1.0), (1, 0.9775), (20, 0.55), (39, 0.1225), (40, 0.1), (99, 0.1)])
def test_as_delta_annealing(update, expected):
    assert as_delta(0.1, update, 100, anneal_ratio=0.4) == pytest.approx(expected)


def test_as_delta_annealing_from_another_start_and_without_a_schedule():
    assert as_delta(0.2, 5, 10, anneal_ratio=1.0, anneal_from=0.6) == pytest.approx(0.4)  # half way: 0.6 → 0.2
    assert as_delta(0.2, 0, 10) == 0.2


@pytest.mark.parametrize("options, message", [
    ({"warmup_ratio": 0.1, "anneal_ratio": 0.5},
     "<warmup_ratio> and <anneal_ratio>: choose one (both start from a softmax-like delta)"),
    ({"anneal_from": 0.5}, "<anneal_from> is where <anneal_ratio> starts: set <anneal_ratio>"),
    ({"anneal_ratio": 0.5, "anneal_from": 0.2},
     "<anneal_from> 0.2 is below <delta> 0.3: the annealing only lowers delta, from <anneal_from> down to <delta>"),
])
def test_as_schedule_refusals_name_options_as_the_caller_spells_them(options, message):
    """The whole message: it is what a user reads, in every front door's spelling of the options."""
    schedule = {"warmup_ratio": 0.0, "anneal_ratio": 0.0, "anneal_from": 1.0, **options}
    with pytest.raises(ValueError) as refused:
        check_as_schedule(0.3, **schedule, name=lambda keyword: f"<{keyword}>")
    assert str(refused.value) == message


@pytest.mark.parametrize("options", [{}, {"warmup_ratio": 0.1}, {"anneal_ratio": 0.5},
                                     {"anneal_ratio": 0.5, "anneal_from": 0.3}])
def test_as_schedule_accepts_one_schedule(options):
    check_as_schedule(0.3, **{"warmup_ratio": 0.0, "anneal_ratio": 0.0, "anneal_from": 1.0, **options})


@pytest.mark.parametrize(
    "prev, rows, masked, lam, cap, expected",
    [
        (1, 100, 0, 1.0, 4, 1),  # nothing masked: 100/100 = 1
        (1, 100, 40, 1.0, 4, 2),  # 100/60 = 1.67 -> 2
        (1, 100, 30, 1.0, 4, 1),  # 100/70 = 1.43 -> 1
        (1, 100, 90, 1.0, 4, 2),  # 100/10 = 10, but at most one more than before
        (3, 100, 0, 1.0, 8, 3),  # never fewer than before
        (2, 10, 6, 1.0, 8, 3),  # 10/4 = 2.5: halves round up
        (4, 10, 9, 1.0, 4, 4),  # capped
        (1, 100, 0, 2.0, 4, 2),  # lambda scales the wanted steps
        (2, 50, 50, 1.0, 8, 3),  # every row masked: one more
        (2, 1, 1, 1.0, 8, 3),  # ... also when the update had a single row
        (2, 0, 0, 1.0, 8, 2),  # nothing counted: unchanged
    ],
)
def test_as_speed_rule(prev, rows, masked, lam, cap, expected):
    assert next_accumulation(prev, rows, masked, lam, cap) == expected
