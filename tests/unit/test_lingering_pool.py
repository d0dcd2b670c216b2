"""pyxds._lingering.LingeringPool, the worker threads behind DNS lookups and
the xDS client's watcher notifications: serial order with one worker,
flush, no self-deadlock, errors logged, idle workers gone (issue 18: no
thread left once the work is over).  Real threads, short linger, every
wait bounded."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest
from test_dns_threads import _until

from pyxds._lingering import LingeringPool

WAIT = 5.0


def _pool(workers: int = 1, linger: float = 0.05) -> LingeringPool:
    return LingeringPool(workers, "test-lingering", linger, "test work")


def _names() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("test-lingering")]


def test_one_worker_runs_functions_in_the_order_submitted_on_one_thread():
    pool = _pool()
    ran: list[tuple[int, int]] = []
    for i in range(200):
        pool.submit(lambda i=i: ran.append((i, threading.get_ident())))
    assert pool.flush(WAIT)
    assert [i for i, _ in ran] == list(range(200))
    assert len({ident for _, ident in ran}) == 1
    assert ran[0][1] != threading.get_ident()


def test_flush_waits_for_what_was_queued_before_it():
    pool = _pool()
    gate = threading.Event()
    ran: list[str] = []
    pool.submit(lambda: (gate.wait(WAIT), ran.append("slow")))
    assert not pool.flush(0.05)  # the slow function still runs: bounded, False
    gate.set()
    assert pool.flush(WAIT)
    assert ran == ["slow"]


def test_flush_from_a_worker_returns_at_once_instead_of_waiting_for_itself():
    pool = _pool()
    answers: list[tuple[bool, float]] = []

    def inside() -> None:
        started = time.monotonic()
        answers.append((pool.flush(WAIT), time.monotonic() - started))

    pool.submit(inside)
    assert pool.flush(WAIT)
    assert answers and answers[0][0] is True
    assert answers[0][1] < 1.0  # not the WAIT it would deadlock for


def test_a_function_that_raises_is_logged_with_the_label_and_the_worker_goes_on(caplog):
    pool = _pool()
    ran: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="pyxds._lingering"):
        pool.submit(boom)
        pool.submit(lambda: ran.append(1))
        assert pool.flush(WAIT)
    assert ran == [1]
    assert any("test work raised" in r.getMessage() for r in caplog.records)


def test_an_idle_worker_exits_and_the_next_submit_starts_one_again():
    pool = _pool()
    pool.submit(lambda: None)
    assert pool.flush(WAIT)
    assert _until(lambda: pool.threads == 0 and not _names())
    ran = threading.Event()
    pool.submit(ran.set)
    assert ran.wait(WAIT)
    assert _until(lambda: pool.threads == 0 and not _names())


@pytest.mark.parametrize("workers", [1, 3])
def test_no_submit_is_stranded_while_workers_decide_to_exit(workers):
    """Rule 2: submissions racing the linger timeout all run."""
    pool = _pool(workers, linger=0.001)
    count = [0]
    lock = threading.Lock()

    def bump() -> None:
        with lock:
            count[0] += 1

    for _ in range(300):
        pool.submit(bump)
        time.sleep(0.0005)
    assert _until(lambda: count[0] == 300)
    assert pool.threads <= workers
    assert _until(lambda: pool.threads == 0)


def test_a_worker_woken_for_a_function_shutdown_dropped_still_lingers_out():
    """Rule 2 with rule 5: an idle worker woken by a submit, held off the
    GIL past its linger while ``shutdown`` drops the function, finds the
    queue empty and exits.  On ``queue.SimpleQueue.get(timeout=)`` it woke
    past its deadline, its remaining timeout went negative ("forever") and
    it stayed until the next put: a thread left with no work (the cause of
    test_no_submit_is_stranded_while_workers_decide_to_exit's failures under
    CPU load, where another worker took the function)."""
    pool = _pool(linger=0.1)
    ran: list[str] = []
    pool.submit(lambda: None)
    assert pool.flush(WAIT)  # one worker, idle and waiting for work
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)  # this thread keeps the GIL while it spins
    try:
        pool.submit(lambda: ran.append("dropped"))  # wakes the idle worker
        spin_until = time.monotonic() + 0.3  # past the worker's linger
        while time.monotonic() < spin_until:
            pass
        pool.shutdown()
    finally:
        sys.setswitchinterval(interval)
    assert _until(lambda: pool.threads == 0 and not _names(), 2.0)
    assert ran == []


def test_shutdown_drops_what_is_queued_and_later_submits():
    pool = _pool()
    gate = threading.Event()
    ran: list[str] = []
    pool.submit(lambda: (gate.wait(WAIT), ran.append("running")))
    pool.submit(lambda: ran.append("queued"))
    assert _until(lambda: pool._idle == 0)  # the first one is running
    pool.shutdown()
    pool.submit(lambda: ran.append("late"))
    gate.set()
    assert _until(lambda: pool.threads == 0)
    assert ran == ["running"]
    assert pool.flush(0.05)  # nothing runs any more: flush does not wait


def test_a_worker_that_cannot_start_raises_a_clear_error_and_leaves_the_pool_usable(monkeypatch):
    """``Thread.start`` raising (the process is out of threads) once: that
    submit raises an error naming the pool, its function never runs, the
    counts are back, and the next submits start a worker and run (rule 6)."""
    pool = _pool(workers=2)
    real_start = threading.Thread.start
    failures = [RuntimeError("can't start new thread")]

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("test-lingering") and failures:
            raise failures.pop()
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    ran: list[str] = []
    with pytest.raises(
        RuntimeError, match=r"cannot start a thread for test work \(test-lingering\)"
    ):
        pool.submit(lambda: ran.append("lost"))
    assert pool.threads == 0
    pool.submit(lambda: ran.append("next"))
    assert pool.flush(WAIT), "a submit after the failure never ran: the pool trusts a ghost worker"
    assert ran == ["next"]
    assert pool.threads == 1
    assert _until(lambda: pool.threads == 0, WAIT)  # and the worker lingers out as usual


def test_a_flush_no_worker_can_start_for_runs_the_queued_functions_itself(monkeypatch):
    """Rule 4 where no thread can start (Python 3.12 refuses every new
    thread in atexit hooks, where pyxds closes the channels left open):
    functions other submits queued while the flush's worker failed to
    start (they saw it counted, so they only queued) run on the flushing
    thread, in order, and flush says True.  Before, flush raised, the
    xDS client's close said "not waited", and they waited for a worker
    that never came."""
    pool = _pool()
    me = threading.get_ident()
    ran: list[tuple[str, int]] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("test-lingering"):
            for name in ("first", "second"):
                pool.submit(lambda name=name: ran.append((name, threading.get_ident())))
            raise RuntimeError("can't create new thread at interpreter shutdown")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    assert pool.flush(WAIT)
    assert ran == [("first", me), ("second", me)]
    assert pool.threads == 0 and not pool.on_worker()
    monkeypatch.undo()  # threads start again: a worker runs the next ones
    pool.submit(lambda: ran.append(("later", threading.get_ident())))
    assert pool.flush(WAIT)
    assert ran[-1][0] == "later" and ran[-1][1] != me
