"""ThreadedDnsResolver's workers (pyxds.resolver.dns): lookups run off the
caller's thread, in parallel up to ``max_workers``, and no worker outlives
``linger`` seconds of idleness (issue 18: nothing left after the channels
close).  Real threads with a short linger; every wait is bounded."""

from __future__ import annotations

import threading
import time

import grpc

from pyxds.resolver.dns import ThreadedDnsResolver
from pyxds.status import Status

WAIT = 5.0


def _answer(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
    return [(2, 1, 6, "", ("10.0.0.1", port))]


def _dns_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("test-dns")]


def _until(predicate: object, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False


def _resolver(getaddrinfo: object = _answer, **kwargs: object) -> ThreadedDnsResolver:
    resolver = ThreadedDnsResolver(getaddrinfo=getaddrinfo, linger=0.05, **kwargs)  # type: ignore[arg-type]
    resolver._pool._name = "test-dns"  # tell this test's threads apart
    return resolver


def test_a_lookup_answers_on_another_thread_and_its_worker_exits_once_idle():
    resolver = _resolver()
    got: list[tuple[object, int]] = []
    done = threading.Event()

    def callback(result: object) -> None:
        got.append((result, threading.get_ident()))
        done.set()

    resolver.resolve("host.example", 443, callback)
    assert done.wait(WAIT)
    assert got[0][0] == ("10.0.0.1:443",)
    assert got[0][1] != threading.get_ident()
    assert _until(lambda: resolver.threads == 0 and not _dns_threads())


def test_lookups_run_in_parallel_up_to_max_workers_and_no_further():
    started = threading.Semaphore(0)
    release = threading.Event()
    running = [0]
    most = [0]
    lock = threading.Lock()

    def slow(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        started.release()
        release.wait(WAIT)
        with lock:
            running[0] -= 1
        return _answer(host, port)

    resolver = _resolver(slow, max_workers=3)
    answers: list[object] = []
    all_done = threading.Event()

    def callback(result: object) -> None:
        answers.append(result)
        if len(answers) == 5:
            all_done.set()

    for i in range(5):
        resolver.resolve(f"h{i}.example", 80, callback)
    for _ in range(3):  # three lookups at once: three workers
        assert started.acquire(timeout=WAIT)
    assert not started.acquire(timeout=0.1)  # the other two wait for a worker
    assert resolver.threads == 3
    release.set()
    assert all_done.wait(WAIT)
    assert most[0] == 3
    assert _until(lambda: resolver.threads == 0 and not _dns_threads())


def test_a_lookup_after_the_workers_exited_starts_one_again():
    resolver = _resolver()
    for _ in range(2):
        done = threading.Event()
        resolver.resolve("host.example", 80, lambda _result, done=done: done.set())
        assert done.wait(WAIT)
        assert _until(lambda: resolver.threads == 0)


def test_a_cancelled_lookup_never_calls_back_and_a_failure_is_unavailable():
    release = threading.Event()

    def blocked(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
        release.wait(WAIT)
        raise OSError("no such host")

    resolver = _resolver(blocked, max_workers=1)
    cancelled: list[object] = []
    cancel = resolver.resolve("gone.example", 80, cancelled.append)
    failed: list[object] = []
    done = threading.Event()
    resolver.resolve("bad.example", 80, lambda r: (failed.append(r), done.set()))
    cancel()
    release.set()
    assert done.wait(WAIT)
    assert cancelled == []
    assert isinstance(failed[0], Status)
    assert failed[0].code is grpc.StatusCode.UNAVAILABLE
    assert "bad.example:80" in failed[0].details and "no such host" in failed[0].details
    assert _until(lambda: resolver.threads == 0)


def test_shutdown_drops_queued_lookups_and_leaves_no_thread():
    release = threading.Event()
    entered = threading.Event()

    def blocked(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
        entered.set()
        release.wait(WAIT)
        return _answer(host, port)

    resolver = _resolver(blocked, max_workers=1)
    first: list[object] = []
    queued: list[object] = []
    resolver.resolve("first.example", 80, first.append)
    assert entered.wait(WAIT)
    resolver.resolve("queued.example", 80, queued.append)
    resolver.shutdown()
    resolver.resolve("after.example", 80, queued.append)
    release.set()
    assert _until(lambda: resolver.threads == 0)
    assert first == [("10.0.0.1:80",)]  # the running lookup finishes
    assert queued == []
