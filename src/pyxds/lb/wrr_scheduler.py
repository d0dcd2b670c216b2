"""The static stride scheduler of ``weighted_round_robin`` (gRFC A58
"Earliest Deadline First (EDF) Scheduler", in the form C-core and grpc-go
ship: a stateless stride over a shared sequence number).

Weights to integers (:func:`scale_weights`)
-------------------------------------------
* Fewer than two endpoints, or no endpoint with a weight: no scheduler
  (plain round robin, A58 "When less than two subchannels have load info ...
  the policy will behave the same as round_robin").
* The largest weight is capped at ``MAX_RATIO`` (10) times the mean of the
  non-zero weights, so a pick skips at most about ten slots on average.
* Weights are scaled so that the (capped) largest becomes ``max_weight``;
  an endpoint without a weight (0) gets the scaled mean (A58 "Subchannels
  that are included with a zero weight are still picked but with the average
  weight"); every other weight is at least ``MIN_RATIO`` (1 %) of the scaled
  mean and at least 1.
* If all scaled weights are equal: no scheduler (round robin).

Picking (:meth:`StaticStrideScheduler.pick`)
--------------------------------------------
A sequence number ``s`` names the endpoint ``i = s % n`` in generation
``g = s // n``.  Endpoint ``i`` (scaled weight ``w``) takes the pick in
generation ``g`` when ``(w * g + i * OFFSET) % max_weight >= max_weight - w``,
otherwise the slot is skipped and the next sequence number tried: over
``max_weight`` generations endpoint ``i`` is picked exactly ``w`` times, the
picks of one endpoint evenly spread, and the per-endpoint offset keeps
neighbours from skipping together.

:func:`materialize` runs one full period (``n * max_weight`` sequence
numbers) and returns the picks in sequence order: a cycle whose shares are
exactly the scaled weights.  The picker cycles over it (one C call per pick,
as round_robin) instead of looping in Python on every pick; to keep that
period short, ``max_weight`` is chosen by :func:`max_weight_for` from the
number of endpoints (C-core uses 65535 for every size; pyxds uses 65535 up
to 2 endpoints and less above, so weights are resolved to 1/max_weight of
the largest).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = [
    "MAX_RATIO",
    "MIN_RATIO",
    "MAX_WEIGHT",
    "PERIOD_BUDGET",
    "StaticStrideScheduler",
    "scale_weights",
    "materialize",
    "max_weight_for",
]

MAX_RATIO = 10.0
MIN_RATIO = 0.01
#: the largest scaled weight (C-core's 16-bit weights)
MAX_WEIGHT = 65535
#: sequence numbers in one materialized period, at most (a few ms of work)
PERIOD_BUDGET = 1 << 16
_MIN_MAX_WEIGHT = 64


def max_weight_for(n: int) -> int:
    """The scaled weight of the heaviest endpoint when ``n`` endpoints share
    one materialized period of at most :data:`PERIOD_BUDGET` slots."""
    if n <= 0:
        return MAX_WEIGHT
    return max(_MIN_MAX_WEIGHT, min(MAX_WEIGHT, PERIOD_BUDGET // n))


def scale_weights(weights: Sequence[float], max_weight: int = MAX_WEIGHT) -> tuple[int, ...] | None:
    """Integer weights in [1, max_weight] for ``weights`` (0 = unknown), or
    None when the scheduler would pick like round robin (module docstring)."""
    n = len(weights)
    if n < 2:
        return None
    known = [w for w in weights if w > 0]
    if not known:
        return None
    mean = sum(known) / len(known)
    top = max(known)
    if top > MAX_RATIO * mean:
        top = MAX_RATIO * mean
    factor = max_weight / top
    scaled_mean = max(1, round(mean * factor))
    floor = max(1, round(scaled_mean * MIN_RATIO))
    scaled = tuple(
        max(floor, min(max_weight, round(min(w, top) * factor))) if w > 0 else scaled_mean
        for w in weights
    )
    if all(w == scaled[0] for w in scaled):
        return None
    return scaled


class StaticStrideScheduler:
    """Picks endpoint indices in proportion to integer weights (module doc)."""

    __slots__ = ("weights", "max_weight", "_offset")

    def __init__(self, weights: Sequence[int], max_weight: int = MAX_WEIGHT) -> None:
        self.weights = tuple(weights)
        self.max_weight = max_weight
        self._offset = max_weight // 2

    def takes(self, sequence: int) -> int | None:
        """The endpoint that takes slot ``sequence``, or None (skipped)."""
        n = len(self.weights)
        index = sequence % n
        weight = self.weights[index]
        top = self.max_weight
        if (weight * (sequence // n) + index * self._offset) % top >= top - weight:
            return index
        return None

    def pick(self, next_sequence: Callable[[], int]) -> int:
        """The next endpoint index, drawing sequence numbers from
        ``next_sequence`` (increasing integers, e.g. ``itertools.count``)."""
        while True:
            index = self.takes(next_sequence())
            if index is not None:
                return index


def materialize(weights: Sequence[int], max_weight: int) -> list[int]:
    """Endpoint indices of one full period of the stride, in sequence order:
    endpoint ``i`` appears exactly ``weights[i]`` times."""
    n = len(weights)
    offset = max_weight // 2
    thresholds = [max_weight - w for w in weights]
    starts = [(i * offset) % max_weight for i in range(n)]
    indices = range(n)
    out: list[int] = []
    extend = out.extend
    for generation in range(max_weight):
        extend(
            [
                i
                for i in indices
                if (weights[i] * generation + starts[i]) % max_weight >= thresholds[i]
            ]
        )
    return out
