"""WorkSerializer: one callback at a time, in submission order, never re-entrant."""

from __future__ import annotations

import threading

from pyxds.serializer import WorkSerializer


def test_runs_at_once_when_idle():
    serializer = WorkSerializer()
    ran = []
    serializer.run(lambda: ran.append(1))
    assert ran == [1]


def test_work_submitted_by_a_callback_runs_after_it_returns():
    serializer = WorkSerializer()
    events = []

    def outer():
        events.append("outer start")
        serializer.run(lambda: events.append("inner"))
        events.append("outer end")

    serializer.run(outer)
    assert events == ["outer start", "outer end", "inner"]


def test_order_of_nested_submissions_is_kept():
    serializer = WorkSerializer()
    events = []

    def outer():
        for i in range(3):
            serializer.schedule(lambda i=i: events.append(i))

    serializer.run(outer)
    assert events == [0, 1, 2]


def test_in_serializer_is_true_only_inside_a_callback():
    serializer = WorkSerializer()
    seen = []
    serializer.run(lambda: seen.append(serializer.in_serializer))
    assert seen == [True] and not serializer.in_serializer


def test_a_raising_callback_does_not_wedge_the_serializer(caplog):
    serializer = WorkSerializer()
    ran = []

    def boom():
        serializer.run(lambda: ran.append("after"))
        raise RuntimeError("bug")

    serializer.run(boom)
    serializer.run(lambda: ran.append("next"))
    assert ran == ["after", "next"]
    assert "callback raised" in caplog.text


def test_callbacks_from_many_threads_never_overlap_and_all_run():
    serializer = WorkSerializer()
    inside = 0
    overlaps = 0
    count = 0
    lock = threading.Lock()

    def work():
        nonlocal inside, overlaps, count
        with lock:
            inside += 1
            if inside > 1:
                overlaps += 1
        for _ in range(50):
            pass
        count += 1  # safe only because the serializer runs one at a time
        with lock:
            inside -= 1

    def submitter():
        for _ in range(500):
            serializer.run(work)

    threads = [threading.Thread(target=submitter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert overlaps == 0
    assert count == 2000
