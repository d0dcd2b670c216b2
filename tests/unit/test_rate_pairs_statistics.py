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


@pytest.mark.parametrize(
    ("n", "ranks"),
    # the textbook ranks (1-based) of a 95 % interval of the median
    [(6, (1, 6)), (10, (2, 9)), (20, (6, 15)), (40, (14, 27)), (120, (49, 72))],
)
def test_the_median_interval_is_the_order_statistics_of_the_binomial_tails(
    rate_pairs: ModuleType, n: int, ranks: tuple[int, int]
) -> None:
    values = [float(i) for i in range(1, n + 1)]
    random.Random(n).shuffle(values)
    assert rate_pairs.median_interval(values) == (float(ranks[0]), float(ranks[1]))


def test_too_few_rounds_give_no_interval(rate_pairs: ModuleType) -> None:
    assert rate_pairs.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None


def test_the_median_interval_holds_the_true_median_about_95_in_100_runs(
    rate_pairs: ModuleType,
) -> None:
    # skewed ratios around a true median of 1.0 (log-normal, as rates are)
    rng = random.Random(15)
    held = sum(
        low <= 1.0 <= high
        for low, high in (
            rate_pairs.median_interval([math.exp(rng.gauss(0, 0.2)) for _ in range(40)])
            for _ in range(2000)
        )
    )
    assert 0.95 <= held / 2000 <= 0.985  # 40 values: 96.2 % exactly


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
