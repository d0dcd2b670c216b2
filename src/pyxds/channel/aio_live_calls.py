"""Which calls of a subchannel's ``grpc.aio`` channel are still referred to
(docs/traps.md: grpcio's watch of a closed channel at its loop's end).

C-core's channel reaches SHUTDOWN, and ends the watches on it, only once
its last call is freed: grpcio's close (``grpc_channel_destroy``) drops the
application's reference, and each ``grpc.aio`` call object keeps its C-core
call, which keeps the channel, until the object is freed, ended or not.  A
closed ``pyxds.aio`` transport's watch cancelled by its loop's end
(``asyncio.run`` cancels every task, then closes the loop) waits for that
SHUTDOWN, whose completion would otherwise come for a closed loop and strand
grpcio's watch; while the application still refers to a call of the
channel (e.g. returns it from ``asyncio.run``) the SHUTDOWN cannot come
before the loop closes, and the wait would only delay the loop's end.

The channel's own registry of its calls answers, at no cost per RPC:
grpc.aio keeps each call in the channel's ``_active_calls`` (a
``weakref.WeakSet``, what its ``close()`` cancels) from its start to its
end; a subchannel's channel keeps it there until the call is freed instead
(the weak reference's own callback takes it out, no done callback per
call).  ``close()`` cancels the same calls (an ended call's ``cancel()``
does nothing) and forgets them all: the transport takes the weak references
just before (:func:`referred_calls`)."""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["any_referred", "keep_until_freed", "referred_calls"]


def keep_until_freed(channel: Any) -> None:
    """Make the ``grpc.aio`` ``channel`` keep each call it registers
    (``Channel._register_call``, every multicallable's) in its
    ``_active_calls`` until the call is freed, not until it ends: the
    weak set's ``add`` alone (one Python frame and one done callback less
    per call than grpcio's ``_register_call``).  A grpcio without that
    registry keeps its own way (then nothing is known referred)."""
    active = getattr(channel, "_active_calls", None)
    if isinstance(active, weakref.WeakSet) and callable(getattr(channel, "_register_call", None)):
        channel._register_call = active.add


def referred_calls(channel: Any) -> tuple[weakref.ref[Any], ...]:
    """The weak references to the calls ``channel`` (one :func:`keep_until_freed`
    made) still has: taken just before its ``close()``, which forgets them."""
    active = getattr(channel, "_active_calls", None)
    data = getattr(active, "data", None)
    return tuple(data) if isinstance(data, set) else ()


def any_referred(calls: tuple[weakref.ref[Any], ...]) -> bool:
    """Whether one of ``calls`` (:func:`referred_calls`) is not freed yet."""
    return any(ref() is not None for ref in calls)
