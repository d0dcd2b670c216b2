"""bench/rate_pairs.py's statistics: the median's confidence interval and
the rounds' orders (issue 18, the end-to-end rate: a run's ratio is read
against its interval, and no client always follows the same other one)."""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import random
import sys
from collections import Counter
from types import ModuleType

import pytest

_BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


@pytest.fixture(scope="module")
def rate_pairs() -> ModuleType:
    sys.path.insert(0, _BENCH)  # rate_pairs imports bench_world beside it
    try:
        spec = importlib.util.spec_from_file_location(
            "rate_pairs", os.path.join(_BENCH, "rate_pairs.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(_BENCH)


def _coverage(rate_pairs: ModuleType, process_sd: float, by_process: bool, runs: int = 60) -> float:
    """How often the interval holds the true median ratio (1.0) over
    simulated runs of 60 rounds on 6 process pairs: log-normal round noise,
    and each process's own lasting speed (``process_sd``)."""
    rng = random.Random(15)
    held = 0
    for _ in range(runs):
        own = [rng.gauss(0, process_sd) - rng.gauss(0, process_sd) for _ in range(6)]
        ratios = [math.exp(own[r % 6] + rng.gauss(0, 0.15)) for r in range(60)]
        groups = [r % 6 for r in range(60)] if by_process else list(range(60))
        interval = rate_pairs.median_interval(ratios, groups, draws=100)
        assert interval is not None
        held += interval[0] <= 1.0 <= interval[1]
    return held / runs


def test_the_interval_holds_the_true_ratio_about_95_in_100_runs(rate_pairs: ModuleType) -> None:
    assert _coverage(rate_pairs, 0.0, by_process=True) >= 0.9


def test_the_interval_still_holds_it_when_each_process_has_its_own_speed(
    rate_pairs: ModuleType,
) -> None:
    # round 15: six pyxds.aio processes of one tree were 0.93-1.09 of their
    # rounds' means; an interval over the rounds alone, as if every round
    # ran on processes of its own, misses the true ratio far more often
    assert _coverage(rate_pairs, 0.08, by_process=True) >= 0.9  # 0.97
    assert _coverage(rate_pairs, 0.08, by_process=False) <= 0.8  # 0.68


def test_one_run_prints_one_interval(rate_pairs: ModuleType) -> None:
    ratios = [1.0 + 0.01 * ((7 * i) % 13) for i in range(36)]
    groups = [i % 6 for i in range(36)]
    first = rate_pairs.median_interval(ratios, groups)
    assert first == rate_pairs.median_interval(ratios, groups)
    assert first is not None and first[0] < 1.06 < first[1]


def test_too_few_rounds_or_processes_give_no_interval(rate_pairs: ModuleType) -> None:
    assert rate_pairs.median_interval([1.0] * 5, [0, 1, 0, 1, 0]) is None
    assert rate_pairs.median_interval([1.0] * 30, [0] * 30) is None


@pytest.mark.parametrize("names", [["C-core", "pyxds"], ["C-core", "before", "after"]])
def test_each_window_comes_after_each_other_client_alike_and_never_its_own(
    rate_pairs: ModuleType, names: list[str]
) -> None:
    # the windows as they run: rounds -1 (left out) to 59, back to back
    windows = []
    for r in range(-1, 60):
        order = rate_pairs.round_order(names, r)
        assert sorted(order) == sorted(names)
        windows += order
    follows = Counter(itertools.pairwise(windows))
    assert all(a != b for a, b in follows)  # never right after its own
    pairs = len(names) * (len(names) - 1)
    assert len(follows) == pairs  # every ordered pair of different clients
    assert max(follows.values()) - min(follows.values()) <= 1  # equally often
