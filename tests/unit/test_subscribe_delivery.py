"""``Channel.subscribe``'s delivery (pyxds/channel/channel.py ``_Delivery``):
callbacks in order on a short-lived pyxds thread; where no thread can start
(Python 3.12 refuses every new thread in atexit hooks, where pyxds closes
the channels a program left open) on the pushing thread instead."""

from __future__ import annotations

import threading

import grpc
import pytest
from test_dns_threads import _until

from pyxds.channel.channel import _Delivery

States = grpc.ChannelConnectivity


def test_states_are_delivered_in_order_on_a_thread_of_their_own() -> None:
    got: list[tuple[States, int]] = []
    delivery = _Delivery(lambda state: got.append((state, threading.get_ident())))
    for state in (States.IDLE, States.CONNECTING, States.READY):
        delivery.push(state)
    assert _until(lambda: len(got) == 3)
    assert [state for state, _ in got] == [States.IDLE, States.CONNECTING, States.READY]
    assert threading.get_ident() not in {ident for _, ident in got}


def test_where_no_thread_can_start_the_pushing_thread_delivers_and_later_states_still_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SHUTDOWN of a channel closed by the exit hook on Python 3.12:
    delivered, on the closing thread, and nothing raised into the channel's
    state watchers (it raised there, logged a traceback, and the callback
    got no state again)."""
    got: list[tuple[States, int]] = []
    delivery = _Delivery(lambda state: got.append((state, threading.get_ident())))
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "pyxds-connectivity":
            raise RuntimeError("can't create new thread at interpreter shutdown")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    delivery.push(States.READY)
    delivery.push(States.SHUTDOWN)
    assert got == [(States.READY, threading.get_ident()), (States.SHUTDOWN, threading.get_ident())]
    monkeypatch.undo()
    delivery.push(States.IDLE)  # a thread again
    assert _until(lambda: len(got) == 3)
    assert got[2][0] is States.IDLE and got[2][1] != threading.get_ident()
