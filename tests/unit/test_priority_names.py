"""Stable priority child names (pyxds.lb.priority_names): C-core's heuristic,
moved into cds by A74, checked against gRFC A115's example sequence."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pyxds.lb.priority_names import PriorityNames, assign_child_numbers, child_name
from pyxds.xds.resources.types import LocalityName

AA, BB, CC, DD, EE = (LocalityName("r", z) for z in ("aa", "bb", "cc", "dd", "ee"))


def run(sequence):
    state: PriorityNames | None = None
    out = []
    for priorities in sequence:
        state = assign_child_numbers(state, priorities)
        out.append(list(state.child_numbers))
    return out


def test_a115_example_sequence_reuses_the_number_of_a_known_locality():
    # A115 "Background": [AA,BB],[CC,DD] -> child0, child1; [CC],[DD,EE] ->
    # child1, child2; [AA,BB],[CC,DD] -> child3, child1.
    assert run([[[AA, BB], [CC, DD]], [[CC], [DD, EE]], [[AA, BB], [CC, DD]]]) == [
        [0, 1],
        [1, 2],
        [3, 1],
    ]


def test_child_name_has_c_core_format():
    assert child_name("backend", 3) == "{cluster=backend, child_number=3}"
    state = assign_child_numbers(None, [[AA], [BB]])
    assert state.names("c") == ["{cluster=c, child_number=0}", "{cluster=c, child_number=1}"]


def test_same_priorities_twice_keep_their_numbers():
    assert run([[[AA, BB], [CC]], [[AA, BB], [CC]], [[BB, AA], [CC]]]) == [[0, 1], [0, 1], [0, 1]]


def test_localities_are_walked_in_sorted_order():
    # The first known locality in (region, zone, sub_zone) order decides: AA
    # (old child 1) sorts before DD (old child 0), whatever the EDS order.
    first = [[DD], [AA]]
    second = [[DD, AA]]
    assert run([first, second]) == [[0, 1], [1]]


def test_a_number_is_taken_once_and_its_other_localities_do_not_leak():
    # P0 takes child 0 through AA; BB also lived in child 0, so P1=[BB] must
    # get a fresh number rather than a second child 0.
    assert run([[[AA, BB]], [[AA], [BB]]]) == [[0], [0, 1]]


def test_localities_following_the_first_match_belong_to_that_priority():
    # P0=[AA, CC] takes child 0 through AA; CC (old child 1) now belongs to P0,
    # so P1=[CC] cannot follow CC back to child 1 and gets a fresh number.
    assert run([[[AA], [CC]], [[AA, CC], [CC]]]) == [[0, 1], [0, 2]]


def test_a_new_priority_never_takes_an_old_number_even_if_unused():
    # child 0 held AA; AA disappears.  The new priority must not take 0 (still
    # known from the previous update), nor ever again a number once given out.
    assert run([[[AA]], [[BB]], [[CC]], [[AA]]]) == [[0], [1], [2], [3]]


def test_promoted_priority_keeps_its_name():
    # A56 "LB Policy Configuration": priority 0 emptied and replaced by the
    # localities of priority 1: that child moves up, a new name goes below.
    assert run([[[AA], [BB]], [[BB], [CC]]]) == [[0, 1], [1, 2]]


def test_empty_priority_gets_a_fresh_number():
    assert run([[[]], [[]]]) == [[0], [1]]
    assert run([[[AA]], [[]], [[AA]]]) == [[0], [1], [2]]


# ----------------------------------------------------------------- properties


_LOCALITIES = [LocalityName("r", f"z{i}") for i in range(8)]


@st.composite
def _priorities(draw):
    """Non-empty priorities with disjoint localities (the normal EDS shape)."""
    chosen = draw(st.permutations(_LOCALITIES))[: draw(st.integers(1, len(_LOCALITIES)))]
    cuts = (
        sorted(draw(st.sets(st.integers(1, len(chosen) - 1), max_size=3)))
        if len(chosen) > 1
        else []
    )
    bounds = [0, *cuts, len(chosen)]
    return [list(chosen[a:b]) for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300, deadline=None)
@given(st.lists(_priorities(), min_size=1, max_size=8))
def test_numbers_are_unique_never_come_back_and_repeat_for_equal_input(sequence):
    state = None
    retired: set[int] = set()
    for priorities in sequence:
        previous = state
        state = assign_child_numbers(previous, priorities)
        numbers = state.child_numbers
        assert len(set(numbers)) == len(numbers)
        assert not retired & set(numbers), "a dropped child name came back (A115)"
        if previous is not None:
            retired |= set(previous.child_numbers) - set(numbers)
        # the same priorities again change nothing (empty priorities, and a
        # locality listed in two priorities, are the exceptions: see the
        # module docstring and test_empty_priority_gets_a_fresh_number)
        assert assign_child_numbers(state, priorities).child_numbers == numbers
