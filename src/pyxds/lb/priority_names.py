"""Stable names for the priority children of one EDS / LOGICAL_DNS cluster.

gRFC A74 moves into the cds policy the heuristic C-core's xds_cluster_resolver
used to keep priority child names from churning as localities move between
priorities (A56 "LB Policy Configuration": the names decouple children from
priorities, so a moved child keeps its connections).  gRFC A115 shows it at
work.  A child is named ``{cluster=NAME, child_number=N}``.

Rules (one pass over the new priorities, highest first):

1. From the previous assignment, every locality maps to the number of the
   priority that held it, and every old number to its localities.  Old
   numbers are all "in use": a brand new priority never takes one of them.
2. For each new priority, walk its localities in sorted (region, zone,
   sub_zone) order.  The first locality still mapped gives the priority that
   old number; the number is then taken, so every locality the old priority
   held is unmapped.  Localities after the first mapped one are unmapped too
   (they now belong to this priority, a later priority must not follow them).
3. A priority that found no mapped locality takes the smallest number at or
   above ``next_number`` that is not in use; ``next_number`` moves past it.
   Numbers therefore only grow: a name once dropped never comes back (A115).

A priority with no localities (EDS failed, missing or empty) always gets a
fresh number.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pyxds._values import dataclass

__all__ = ["PriorityNames", "assign_child_numbers", "child_name"]


def child_name(cluster: str, child_number: int) -> str:
    """The priority child name C-core uses: ``{cluster=NAME, child_number=N}``."""
    return f"{{cluster={cluster}, child_number={child_number}}}"


@dataclass(frozen=True)
class PriorityNames:
    """The numbers given to each priority of one update, what each priority
    held, and the next number never used."""

    child_numbers: tuple[int, ...] = ()
    localities: tuple[tuple[Any, ...], ...] = ()
    next_number: int = 0

    def names(self, cluster: str) -> list[str]:
        return [child_name(cluster, n) for n in self.child_numbers]


def assign_child_numbers(
    previous: PriorityNames | None, priorities: Sequence[Iterable[Any]]
) -> PriorityNames:
    """Number the new ``priorities`` (each an iterable of sortable locality
    names), reusing ``previous`` numbers per the module rules."""
    locality_number: dict[Any, int] = {}
    number_localities: dict[int, tuple[Any, ...]] = {}
    next_number = 0
    if previous is not None:
        next_number = previous.next_number
        for old_number, held in zip(previous.child_numbers, previous.localities, strict=True):
            number_localities[old_number] = held
            for locality in held:
                locality_number[locality] = old_number
    in_use = set(number_localities)
    numbers: list[int] = []
    held_now: list[tuple[Any, ...]] = []
    for localities in priorities:
        ordered = tuple(sorted(localities))
        number: int | None = None
        for locality in ordered:
            if number is None:
                found = locality_number.pop(locality, None)
                if found is not None:
                    number = found
                    for old in number_localities.get(found, ()):
                        locality_number.pop(old, None)
            else:
                locality_number.pop(locality, None)
        if number is None:
            number = next_number
            while number in in_use:
                number += 1
            next_number = number + 1
            in_use.add(number)
        numbers.append(number)
        held_now.append(ordered)
    return PriorityNames(tuple(numbers), tuple(held_now), next_number)
