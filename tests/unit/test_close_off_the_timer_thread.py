"""A channel's teardown never blocks the thread that drains its serializer.

``ChannelCore.close`` queues its teardown on the channel's work serializer;
whichever thread drains it runs the teardown, and that may be the process's
one timer thread (a timer callback of the channel was running when close()
came).  The teardown's resolver shutdown releases the xDS client.  Its
close used to wait there for the ADS connection and for the process's
watcher callbacks (up to 5 s + 5 s), and every timer of every channel of
the process waited behind it.  Now the release starts the close and
returns; nothing waits there, and a user's ``close()`` still returns only
once the ADS connection is closed (it waits on its own thread).

Neither reference implementation waits there either.  C-core's resolver
drops its ref to the ref-counted XdsClient; ``XdsClient::Orphaned``
(grpc/grpc ``src/core/xds/xds_client/xds_client.cc``) only marks it shutting
down and drops its state, and its channels go as their refs do.  grpc-go's
pool closes the client on the last ref (grpc/grpc-go
``internal/xds/xdsclient/pool.go``, ``clientRefCountedClose``), and that
close tears the ADS channel down locally, without waiting for the peer.

Sans-IO: the ADS transport is a fake whose connection closes only when the
test says so (``close_done``), and a watcher callback of another xDS user of
the process holds the notifier thread (the watcher callbacks the close used
to wait for).  No socket is opened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_channel_support import TransportFactory

from pyxds.channel.core import ChannelCore
from pyxds.clock import RealClock
from pyxds.testing import FakeClock
from pyxds.xds import client as client_module
from pyxds.xds.client import XdsClient

WAIT = 5.0
#: what "at once" means for a thread that must not block (the old code held
#: it for the notifier's 5 s bound)
AT_ONCE = 1.0

TARGET_NAME = "close-off-the-timer-thread"
BOOTSTRAP = {
    "xds_servers": [
        {"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]},
    ],
    "node": {"id": "close-off-the-timer-thread"},
}


class HeldAdsTransport:
    """An ADS transport whose connection closes when the test sets
    ``close_done`` (a real one closes on the stream loop)."""

    def __init__(self, channel: Any) -> None:
        self.close_done = threading.Event()
        self.closed_on: str | None = None
        self._ids = 0

    def start_stream(self) -> int:
        self._ids += 1
        return self._ids

    def send(self, stream_id: int, request: Any) -> bool:
        return True

    def close(self) -> None:
        self.closed_on = threading.current_thread().name


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    transports: list[HeldAdsTransport] = []

    def factory(self: XdsClient, channel: Any) -> HeldAdsTransport:
        transport = HeldAdsTransport(channel)
        transports.append(transport)
        return transport

    monkeypatch.setattr(XdsClient, "_grpc_transport", factory)
    notifier_busy = threading.Event()
    release_notifier = threading.Event()

    def slow_watcher_callback() -> None:  # another xDS user's watcher, slow
        notifier_busy.set()
        release_notifier.wait(WAIT * 2)

    world = {
        "transports": transports,
        "notifier_busy": notifier_busy,
        "release_notifier": release_notifier,
        "slow_watcher_callback": slow_watcher_callback,
    }
    yield world
    release_notifier.set()
    for transport in transports:
        transport.close_done.set()


def _open_channel(held: dict[str, Any]) -> tuple[ChannelCore, XdsClient]:
    core = ChannelCore(
        f"xds:///{TARGET_NAME}",
        TransportFactory(),
        bootstrap=BOOTSTRAP,
        clock=FakeClock(),
    )
    core.exit_idle()  # the resolver starts and takes the shared xDS client
    deadline = time.monotonic() + WAIT
    while not held["transports"] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert held["transports"], "the xDS client never opened its ADS stream"
    clients = [c for c, scopes in XdsClient.instances() if any(TARGET_NAME in s for s in scopes)]
    assert len(clients) == 1, XdsClient.instances()
    return core, clients[0]


def _hold_the_notifier(held: dict[str, Any]) -> None:
    client_module._NOTIFIER_POOL.submit(held["slow_watcher_callback"])
    assert held["notifier_busy"].wait(WAIT)


def test_a_teardown_drained_on_a_timer_thread_returns_at_once_and_the_client_closes_after(
    held: dict[str, Any],
) -> None:
    core, client = _open_channel(held)
    transport = held["transports"][0]
    _hold_the_notifier(held)
    drained = threading.Event()
    spent: list[float] = []

    def timer_callback() -> None:
        # a timer callback of the channel, on the serializer: close() from
        # here queues the teardown behind it, on this same thread
        core.close()

    def timer_thread() -> None:
        start = time.monotonic()
        core.serializer.run(timer_callback)
        spent.append(time.monotonic() - start)
        drained.set()

    thread = threading.Thread(target=timer_thread, name="timer-like")
    thread.start()
    assert drained.wait(WAIT * 3)
    assert spent[0] < AT_ONCE, (
        f"the timer-like thread ran the teardown for {spent[0]:.2f} s: it waited for "
        "the xDS client's connection and watcher callbacks"
    )
    assert core.resolver is None  # the teardown did run there
    assert transport.closed_on == "timer-like"  # the ADS stream was told to close at once
    done = client.close_soon()  # the same event as the release's
    assert not done.is_set(), "the client says it is closed with its connection still open"
    transport.close_done.set()  # the connection closes on the stream loop
    assert not done.wait(0.2), "the close ended before the watcher callbacks queued before it"
    held["release_notifier"].set()
    assert done.wait(WAIT), "the client's close never finished"
    thread.join(WAIT)


def test_a_users_close_still_returns_only_once_the_ads_connection_is_closed(
    held: dict[str, Any],
) -> None:
    core, client = _open_channel(held)
    transport = held["transports"][0]
    returned = threading.Event()

    def user_close() -> None:
        core.close(wait=WAIT * 2)
        returned.set()

    user = threading.Thread(target=user_close, name="user")
    user.start()
    assert not returned.wait(0.3), "close() returned with the ADS connection still open"
    done = client.close_soon()  # the same event as the release's
    assert not done.is_set()
    transport.close_done.set()
    assert returned.wait(WAIT), "close() did not return once the ADS connection closed"
    assert done.is_set()
    user.join(WAIT)


def test_a_close_from_inside_the_serializer_does_not_wait_for_itself(
    held: dict[str, Any],
) -> None:
    """A close() called from a callback of the channel's serializer (a
    policy, a watcher) never waits: its teardown runs after the callback,
    on the same thread."""
    core, _ = _open_channel(held)
    spent: list[float] = []

    def callback() -> None:
        start = time.monotonic()
        core.close(wait=WAIT)
        spent.append(time.monotonic() - start)

    core.serializer.run(callback)
    assert spent and spent[0] < AT_ONCE, spent
    assert core.resolver is None


def test_a_close_called_on_the_timer_thread_returns_at_once_and_the_client_closes_after(
    held: dict[str, Any],
) -> None:
    """A user's close(wait) called on the process's timer thread (the
    done-callback of an RPC whose deadline ended it runs there) does not
    wait there for the ADS connection: every other clock's timers would."""
    core, client = _open_channel(held)
    transport = held["transports"][0]
    _hold_the_notifier(held)
    spent: list[float] = []
    ran = threading.Event()

    def done_callback() -> None:
        start = time.monotonic()
        core.close(wait=WAIT)
        spent.append(time.monotonic() - start)
        ran.set()

    RealClock().call_later(0.0, done_callback)
    assert ran.wait(WAIT * 3)
    assert spent[0] < AT_ONCE, f"close() held the timer thread {spent[0]:.2f} s"
    done = client.close_soon()
    assert not done.is_set()
    transport.close_done.set()
    held["release_notifier"].set()
    assert done.wait(WAIT)
