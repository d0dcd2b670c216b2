"""Counts of grpcio's asyncio machinery and of ``pyxds.aio``'s connection
attempts, for tests and benches run in a fresh process (issue 18: CPU per
failed attempt; docs/traps.md, grpcio's engine and stranded watches).

Each counter patches the process for good: call it first, in a process of
its own."""

from __future__ import annotations

import gc
import threading
from typing import Any

__all__ = ["count_attempts", "count_engines", "stranded_watches"]


def count_engines() -> list[threading.Thread]:
    """The list of grpcio's asyncio poller threads started from now on (one
    per engine built: grpcio starts one with its completion queue and joins
    it at its shutdown)."""
    started: list[threading.Thread] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        if getattr(getattr(thread, "_target", None), "__name__", "") == "_poll_wrapper":
            started.append(thread)
        start(thread)

    threading.Thread.start = counted  # type: ignore[method-assign,assignment]
    return started


def count_attempts() -> list[int]:
    """A one-item list: how many ``grpc.aio`` channels ``pyxds.aio``'s
    subchannels made from now on (one per connection attempt)."""
    from pyxds.channel.subchannel import AioTransport

    made = [0]
    create = AioTransport._create

    def counted(transport: Any) -> None:
        made[0] += 1
        create(transport)

    AioTransport._create = counted  # type: ignore[method-assign,assignment]
    return made


def stranded_watches() -> int:
    """cygrpc's ``CallbackWrapper`` objects alive after a full collection:
    completions grpcio still waits for (once its engine is down, those it
    will never deliver)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "CallbackWrapper")
