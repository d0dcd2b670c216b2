"""pyxds.lb.sampling: indices drawn in bulk for least_request (gRFC A48
"Picker Behavior": each sample is uniform over the READY endpoints, with
replacement).  Exact uniformity (the rejected tail never maps to an index),
independence of consecutive draws, determinism from a seed, and blocks that
never repeat."""

from __future__ import annotations

import collections
import random

import pytest

from pyxds.lb.sampling import uniform_indices


def chi2_bound(df: int) -> float:
    """Chi-square statistic 6 standard deviations above its mean."""
    return df + 6 * (2 * df) ** 0.5


@pytest.mark.parametrize("n", [1, 2, 3, 5, 100, 255, 256, 257, 1000, 5000])
def test_indices_are_uniform_over_the_range(n):
    rng = random.Random(n)
    seen: collections.Counter = collections.Counter()
    while sum(seen.values()) < 200 * n:
        seen.update(uniform_indices(rng, n, 4096))
    total = sum(seen.values())
    assert set(seen) == set(range(n))
    if n > 1:
        expected = total / n
        chi2 = sum((seen[i] - expected) ** 2 / expected for i in range(n))
        assert chi2 < chi2_bound(n - 1), chi2


@pytest.mark.parametrize("n", [3, 300])
def test_consecutive_indices_are_independent(n):
    """Pairs of consecutive indices are uniform over the n*n pairs (so the
    two samples of a pick are independent, repeats included)."""
    rng = random.Random(7)
    cells = 3 if n == 3 else 2  # n=300: pairs of (index % 2, next % 2)
    pairs: collections.Counter = collections.Counter()
    for _ in range(40):
        block = list(uniform_indices(rng, n, 4096))
        pairs.update(zip(block[0::2], block[1::2], strict=False))
    if n != 3:
        folded: collections.Counter = collections.Counter()
        for (a, b), count in pairs.items():
            folded[(a % cells, b % cells)] += count
        pairs = folded
    total = sum(pairs.values())
    expected = total / cells**2
    chi2 = sum(
        (pairs[(a, b)] - expected) ** 2 / expected for a in range(cells) for b in range(cells)
    )
    assert chi2 < chi2_bound(cells**2 - 1), chi2


class _Bits:
    """A stand-in for random.Random whose every raw byte (or word) is
    ``value``: shows which raw values map to which index."""

    def __init__(self, value: int, width: int) -> None:
        self.value, self.width = value, width

    def getrandbits(self, k: int) -> int:
        words = k // self.width
        return int.from_bytes(self.value.to_bytes(self.width // 8, "little") * words, "little")


def test_raw_bytes_in_the_rejected_tail_are_dropped_not_folded():
    """n=100: 256 = 2*100 + 56, so bytes 200..255 would favour indices
    0..55 if folded with a modulo; they are dropped instead."""
    assert list(uniform_indices(_Bits(199, 8), 100, 16)) == [99] * 16
    assert list(uniform_indices(_Bits(200, 8), 100, 16)) == []
    assert list(uniform_indices(_Bits(255, 8), 100, 16)) == []
    assert list(uniform_indices(_Bits(255, 8), 256, 16)) == [255] * 16


def test_raw_words_in_the_rejected_tail_are_dropped_not_folded():
    """n=1000: 65536 = 65*1000 + 536; words 65000..65535 are dropped."""
    assert list(uniform_indices(_Bits(64999, 16), 1000, 8)) == [999] * 8
    assert list(uniform_indices(_Bits(65000, 16), 1000, 8)) == []
    assert list(uniform_indices(_Bits(1234, 16), 1000, 8)) == [234] * 8


def test_the_same_seed_gives_the_same_indices_and_blocks_never_repeat():
    a, b = random.Random(3), random.Random(3)
    first = [list(uniform_indices(a, 100, 512)) for _ in range(4)]
    again = [list(uniform_indices(b, 100, 512)) for _ in range(4)]
    assert first == again
    assert len({tuple(block) for block in first}) == 4


def test_more_than_65536_items_fall_back_to_randrange():
    indices = list(uniform_indices(random.Random(1), 70000, 100))
    assert len(indices) == 100
    assert all(0 <= i < 70000 for i in indices)
    assert max(indices) >= 65536  # beyond what a 16-bit word reaches


def test_an_empty_population_is_an_error():
    with pytest.raises(ValueError, match="0 items"):
        uniform_indices(random.Random(), 0, 10)
