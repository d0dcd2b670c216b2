"""A transport counts the RPCs running on it without a lock (issue 18 item
2) and still closes exactly once, when it is retired and the last RPC has
ended, never under an RPC that was told it started."""

from __future__ import annotations

import sys
import threading
from typing import Any

from pyxds.channel.subchannel import Transport


class _Transport(Transport):
    __slots__ = ("closes", "running")

    def __init__(self) -> None:
        super().__init__()
        self.closes = 0
        self.running = 0  # RPCs told they started and not finished (test's own count)

    @property
    def channel(self) -> Any:
        return None

    def connect(self) -> None:
        pass

    def _close_now(self) -> None:
        self.closes += 1


def test_retired_without_rpcs_closes_at_once_and_refuses_new_ones():
    transport = _Transport()
    transport.retire()
    assert transport.closed and transport.closes == 1
    assert not transport.call_started()
    assert transport.closes == 1


def test_retired_with_rpcs_running_closes_when_the_last_one_ends():
    transport = _Transport()
    assert transport.call_started()
    transport.retire()
    assert not transport.closed
    assert transport.call_started(), "draining: a new RPC may still start on it"
    transport.call_finished()
    assert not transport.closed and transport.closes == 0
    transport.call_finished()
    assert transport.closed and transport.closes == 1
    assert not transport.call_started()


def test_a_forced_retire_closes_under_running_rpcs_once():
    transport = _Transport()
    assert transport.call_started()
    assert transport.call_started()
    transport.retire(force=True)
    assert transport.closed and transport.closes == 1
    transport.call_finished()
    transport.call_finished()
    assert transport.closes == 1
    transport.retire()
    assert transport.closes == 1


def test_a_transport_never_closes_under_an_rpc_it_let_start_under_concurrency():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the races happen
    try:
        _race_rpcs_with_retire()
    finally:
        sys.setswitchinterval(interval)


def _race_rpcs_with_retire() -> None:
    for _ in range(20):  # 20 transports, each retired while 3 threads run RPCs on it
        _race_one()


def _race_one() -> None:
    transport = _Transport()
    violations: list[int] = []
    lock = threading.Lock()

    def rpcs() -> None:
        for _ in range(5000):
            if transport.call_started():
                with lock:
                    transport.running += 1
                if transport.closes:
                    violations.append(1)
                with lock:
                    transport.running -= 1
                transport.call_finished()

    threads = [threading.Thread(target=rpcs) for _ in range(3)]
    for t in threads:
        t.start()
    transport.retire()
    for t in threads:
        t.join(10.0)
    assert not any(t.is_alive() for t in threads)
    assert not violations
    assert transport.closed and transport.closes == 1, "closed once, after the last RPC"
    assert transport.running == 0
