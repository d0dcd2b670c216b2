"""Closing a grpcio channel whose connectivity was watched, quietly.

grpcio delivers ``subscribe()`` callbacks from a poller thread that waits in
``watch_connectivity_state`` (0.2 s at a time) and only notices after its
wait that nobody watches any more.  A channel closed while that thread waits
makes grpcio raise ``ValueError: Cannot monitor channel state: Channel
closed!`` in its own thread, which Python prints as an unhandled thread
exception: noise on every close that loses the race (seen once in a full
test run).  So: unsubscribe, let the poller see it and stop (bounded), then
close.  It runs on a daemon thread of its own, never on a serializer: the
wait is up to one poll period.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["close_watched_channel", "POLLER_STOP_WAIT"]

#: At most this long for grpcio's poller to stop (its poll period is 0.2 s).
POLLER_STOP_WAIT = 0.5


def _poller_running(channel: Any) -> bool:
    """Whether grpcio's connectivity poller of ``channel`` still runs (a
    private attribute: when grpcio stops having it, we close at once)."""
    state = getattr(channel, "_connectivity_state", None)
    return bool(getattr(state, "polling", False))


def close_watched_channel(
    channel: Any,
    unsubscribe: Callable[[], None],
    on_closed: Callable[[], None] | None = None,
    name: str = "pyxds-close",
) -> None:
    """Unsubscribe, then close ``channel`` once grpcio's poller has stopped
    (at most :data:`POLLER_STOP_WAIT`), on a daemon thread; ``on_closed``
    runs after the close."""

    def run() -> None:
        try:
            try:
                unsubscribe()
            except Exception:
                pass
            deadline = time.monotonic() + POLLER_STOP_WAIT
            while _poller_running(channel) and time.monotonic() < deadline:
                time.sleep(0.01)
            channel.close()
        finally:
            if on_closed is not None:
                on_closed()

    threading.Thread(target=run, name=name, daemon=True).start()
