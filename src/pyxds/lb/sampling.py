"""Indices drawn uniformly at random *with replacement*, in bulk, from an
injected ``random.Random`` (gRFC A48 "Picker Behavior": each of the
``choiceCount`` samples is ``random_integer(0, subchannels.length)``).

A picker that samples on every pick pays a Python call per draw; drawing a
block of indices at once costs a few nanoseconds per index, so
least_request draws blocks and consumes them through a C iterator.

Every index of a block is uniform over ``range(n)`` and independent of the
others, exactly (no modulo bias): raw values come from
``random.getrandbits`` (bytes for ``n <= 256``, 16-bit words for
``n <= 65536``), each raw value below the largest multiple of ``n`` maps to
``value % n`` and each value at or above it is dropped (rejection
sampling).  So a block of ``draws`` raw values yields slightly fewer
indices (at most ``n - 1`` values of every 256 or 65536 are dropped).
Beyond 65536 the block falls back to ``random.randrange``.  The same seed
gives the same indices.
"""

from __future__ import annotations

import functools
import itertools
import operator
import random
from collections.abc import Iterable

__all__ = ["uniform_indices"]

_BYTE = 256
_WORD = 65536
MIN_DRAWS = 2  # itemgetter of one key returns the item, not a tuple


@functools.lru_cache(maxsize=64)
def _byte_tables(n: int) -> tuple[bytes, bytes]:
    """``bytes.translate`` tables: byte ``v`` below ``256 - 256 % n`` maps to
    ``v % n``; the bytes at or above it are deleted."""
    whole = _BYTE - _BYTE % n
    return bytes(range(n)) * (whole // n) + bytes(_BYTE - whole), bytes(range(whole, _BYTE))


@functools.lru_cache(maxsize=4)
def _word_tables(n: int) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """Word ``v``'s index (``v % n``) and whether it is kept (below the
    largest multiple of ``n``)."""
    whole = _WORD - _WORD % n
    index = tuple(range(n)) * (whole // n) + (0,) * (_WORD - whole)
    keep = (True,) * whole + (False,) * (_WORD - whole)
    return index, keep


def uniform_indices(rng: random.Random, n: int, draws: int) -> Iterable[int]:
    """Up to ``draws`` indices in ``range(n)``: uniform, independent, drawn
    from ``rng`` (module docstring).  ``n >= 1``; ``draws >= 2``."""
    if n < 1:
        raise ValueError(f"cannot sample from {n} items")
    draws = max(draws, MIN_DRAWS)
    if n <= _BYTE:
        table, delete = _byte_tables(n)
        return rng.getrandbits(8 * draws).to_bytes(draws, "little").translate(table, delete)
    if n <= _WORD:
        index, keep = _word_tables(n)
        raw = rng.getrandbits(16 * draws).to_bytes(2 * draws, "little")
        lookup = operator.itemgetter(*memoryview(raw).cast("H"))
        return itertools.compress(lookup(index), lookup(keep))
    return [rng.randrange(n) for _ in range(draws)]
