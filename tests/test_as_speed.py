"""AS-Speed in fairseq: the window counting and the grouping of micro-batches (unit level); the rule is
tested in tests/test_schedules.py.

The end-to-end runs (rising steps, resuming, two processes) are in tests/test_text_classification.py.
"""
from __future__ import annotations

import pytest
from fairseq.data import iterators

from user_dir import as_speed
from user_dir.as_speed import AccumulationSchedule, AdaptiveGroupedIterator


def test_schedule_counts_a_window_and_starts_a_new_one():
    schedule = AccumulationSchedule(1, 1.0, 4)
    schedule.record({"n_rows": 30, "n_masked": 10})
    schedule.record({"n_rows": 30, "n_masked": 20})  # window: 60 rows, 30 masked -> 2
    assert schedule.end_window() == 2
    schedule.record({"n_rows": 60, "n_masked": 0})  # the old counts are gone: 60/60 -> stays 2
    assert schedule.end_window() == 2
    restored = AccumulationSchedule(1, 1.0, 4)
    restored.load_state_dict(schedule.state_dict())
    assert restored.steps == 2


def test_the_first_rise_warns_that_update_counted_schedules_now_lag_the_epochs(caplog):
    schedule = AccumulationSchedule(1, 1.0, 4)
    with caplog.at_level("WARNING", logger="user_dir.as_speed"):
        schedule.record({"n_rows": 10, "n_masked": 0})
        schedule.end_window()  # stays 1: nothing to say
        assert not caplog.records
        for _ in range(3):  # 1 -> 2 -> 3 -> 4, said once
            schedule.record({"n_rows": 10, "n_masked": 9})
            schedule.end_window()
    assert schedule.steps == 4
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("AS-Speed: 2 micro-batches per update from now on (was 1)")
    assert "--total-num-update" in message and "--max-epoch" in message


def test_schedule_refuses_bad_settings_and_criterions_without_masks():
    with pytest.raises(ValueError, match="--as-speed-lambda"):
        AccumulationSchedule(1, 0.0, 4)
    with pytest.raises(ValueError, match="--as-speed-max-steps"):
        AccumulationSchedule(3, 1.0, 2)
    with pytest.raises(ValueError, match="as_softmax or as_multilabel"):
        AccumulationSchedule(1, 1.0, 4).record({"n_rows": 3, "loss": 1.0})


def test_groups_follow_the_schedule_and_the_epoch_ends_with_a_shorter_group():
    schedule = AccumulationSchedule(1, 1.0, 8)
    batches = iterators.CountingIterator(list(range(10)))
    grouped = AdaptiveGroupedIterator(batches, schedule)
    assert len(grouped) == 10
    seen = [next(grouped)]
    schedule.steps = 3
    assert len(grouped) == 1 + 3  # 9 batches left, 3 per update
    seen += [next(grouped), next(grouped)]
    schedule.steps = 4
    seen += list(grouped)
    assert seen == [[0], [1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert not grouped.has_next() and grouped.n == 4


def test_fairseq_grouping_is_unchanged_for_other_iterables():
    as_speed.install()
    plain = iterators.GroupedIterator(iterators.CountingIterator(list(range(5))), 2)
    assert list(plain) == [[0, 1], [2, 3], [4]]
    marked = iterators.CountingIterator(list(range(5)))
    marked.accumulation_schedule = AccumulationSchedule(2, 1.0, 4)
    assert list(iterators.GroupedIterator(marked, 1)) == [[0, 1], [2, 3], [4]]
