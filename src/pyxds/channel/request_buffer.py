"""The requests of a client-streaming RPC, kept for a retry (gRFC A6:
C-core's retry filter caches the send ops of an uncommitted call the same
way), sans I/O.

:class:`RequestBuffer` holds the rules; its two faces take the requests
from the application's iterator and serialize access:
``calls.RequestReplay`` (threads) and ``aio.AsyncRequestReplay`` (asyncio),
both :class:`Replay`: each attempt of the RPC sends the requests of
``replay.attempt()``.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "PULL",
    "RETIRED",
    "RETRY_BUFFER_SIZE",
    "BufferView",
    "Replay",
    "RequestBuffer",
    "size_of",
]

#: C-core's default ``grpc.per_rpc_retry_buffer_size``: once the requests
#: sent on an attempt add up to more than this, the RPC is committed (no
#: retry) and its requests are no longer kept.
RETRY_BUFFER_SIZE = 256 * 1024


def size_of(message: Any) -> int:
    """The size a request counts for in the retry buffer."""
    byte_size = getattr(message, "ByteSize", None)
    if byte_size is not None:
        try:
            return int(byte_size())
        except Exception:
            pass
    if isinstance(message, (bytes, bytearray, str)):
        return len(message)
    return sys.getsizeof(message)


#: :meth:`RequestBuffer.next_kept`: take the next request from the source
PULL = object()
#: :meth:`RequestBuffer.next_kept`: the attempt's iterator is retired
RETIRED = object()


class BufferView:
    """One attempt's position in the buffer."""

    __slots__ = ("epoch", "index")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.index = 0


class RequestBuffer:
    """The requests of a client-streaming RPC, kept until it commits so that
    a retry can send them again (C-core's retry filter caches the send ops
    of an uncommitted call the same way).  Sans I/O: the faces take the
    requests from the user's iterator and serialize access.

    * Every attempt gets its own view (:meth:`view`); it first replays the
      requests already taken, in order, then takes new ones.  Requests are
      taken from the user's iterator once, in order, never twice.
    * A new view retires the previous one: it takes no more requests.  A
      request a retired view was taking when it was retired is kept for the
      next attempt (grpcio's request consumer of a failed call never loses
      one).
    * The RPC commits (no retry, nothing more kept) at :meth:`commit` or
      once the kept requests add up to more than ``limit`` bytes (A6
      ``grpc.per_rpc_retry_buffer_size``).
    """

    __slots__ = ("limit", "log", "size", "recording", "epoch")

    def __init__(self, limit: int = RETRY_BUFFER_SIZE) -> None:
        self.limit = limit
        self.log: list[Any] = []
        self.size = 0
        self.recording = True
        self.epoch = 0

    def commit(self) -> None:
        self.recording = False

    def view(self) -> BufferView:
        """A new attempt's view (retires the previous one)."""
        self.epoch += 1
        return BufferView(self.epoch)

    def next_kept(self, view: BufferView) -> Any:
        """The next request of ``view`` from the buffer, or :data:`PULL`
        (take one from the source, then :meth:`taken`) or :data:`RETIRED`."""
        if view.epoch != self.epoch:
            return RETIRED
        if view.index < len(self.log):
            view.index += 1
            return self.log[view.index - 1]
        if not self.recording and self.log:
            self.log = []  # replayed in full after the commit: nothing more to keep
            view.index = 0
        return PULL

    def behind(self, view: BufferView) -> bool:
        """Whether ``view`` has kept requests to replay or was retired (a
        face that waited for its turn to pull asks again)."""
        return view.epoch != self.epoch or view.index < len(self.log)

    def taken(self, view: BufferView, item: Any) -> bool:
        """``item`` was just taken from the source for ``view``; False: the
        view was retired meanwhile (the item is kept for the next attempt)."""
        retired = view.epoch != self.epoch
        if self.recording or retired:
            self.log.append(item)
            if not retired:
                view.index += 1
            self.size += size_of(item)
            if self.size > self.limit:
                self.recording = False
        return not retired


class Replay:
    """A face of a :class:`RequestBuffer`: what a client-streaming RPC's
    attempts take their requests from.  (A plain base class, not an ABC:
    every attempt asks ``isinstance(request, Replay)``, which an ABC makes
    dearer.)"""

    buffer: RequestBuffer

    def attempt(self) -> Any:
        """The request iterator of a new attempt (retires the previous one)."""
        raise NotImplementedError
