"""pyxds.grpc_channels: a watched grpcio channel is closed only after
grpcio's connectivity poller has stopped (else grpcio raises in its thread)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import grpc

from pyxds.grpc_channels import POLLER_STOP_WAIT, close_watched_channel


class FakeGrpcChannel:
    """Records the order of events; its poller stops when told."""

    def __init__(self) -> None:
        self._connectivity_state = SimpleNamespace(polling=True)
        self.events: list[str] = []
        self.closed = threading.Event()

    def stop_polling(self) -> None:
        self.events.append("poller stopped")
        self._connectivity_state.polling = False

    def close(self) -> None:
        assert not self._connectivity_state.polling, "closed under a running poller"
        self.events.append("closed")
        self.closed.set()


def test_the_channel_is_closed_only_after_its_poller_stopped():
    channel = FakeGrpcChannel()
    unsubscribed = threading.Event()
    done = threading.Event()
    close_watched_channel(channel, unsubscribed.set, on_closed=done.set)
    assert unsubscribed.wait(2)
    assert not channel.closed.wait(0.05)  # still polling: not closed yet
    channel.stop_polling()
    assert done.wait(2)
    assert channel.events == ["poller stopped", "closed"]


def test_a_poller_that_never_stops_delays_the_close_only_so_long():
    channel = FakeGrpcChannel()
    channel.close = lambda: channel.closed.set()  # type: ignore[method-assign]
    close_watched_channel(channel, lambda: None)
    assert channel.closed.wait(POLLER_STOP_WAIT + 2)


def test_a_real_subscribed_grpcio_channel_closes_without_an_error_in_grpcio_threads():
    errors: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    try:
        for _ in range(5):
            channel = grpc.insecure_channel("127.0.0.1:1")
            seen = threading.Event()

            def on_state(state, seen=seen):
                seen.set()

            channel.subscribe(on_state, try_to_connect=True)
            assert seen.wait(2)
            done = threading.Event()
            close_watched_channel(
                channel, lambda c=channel, f=on_state: c.unsubscribe(f), on_closed=done.set
            )
            assert done.wait(POLLER_STOP_WAIT + 2)
        # grpcio's poller threads end within one poll period after the close
        for thread in threading.enumerate():
            if thread.name.startswith("Thread") and thread is not threading.current_thread():
                thread.join(0.5)
    finally:
        threading.excepthook = previous
    assert errors == []
