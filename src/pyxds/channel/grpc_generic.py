"""grpcio's sync ABCs as generic base classes, for pyxds's channel to subclass.

Rules: grpcio's stubs (typeshed's ``types-grpcio``) make ``grpc.Future`` and
the four ``grpc.*MultiCallable`` ABCs generic in the request and response
types, and type what ``future()`` and a response-streaming call return as
``grpc._CallFuture[Response]`` (a Call that is a Future) and
``grpc._CallIterator[Response]`` (a Call that iterates), classes that exist
for type checkers only.  At run time none of grpcio's sync ABCs is generic.

So the names here are, for a type checker, grpcio's own (type-check-only)
generic classes, and at run time grpcio's ABCs with ``Generic`` added.  A
pyxds multicallable that subclasses ``UnaryUnaryMultiCallable[Req, Resp]``
from here *is* a ``grpc.UnaryUnaryMultiCallable[Req, Resp]`` to the type
checker, and its ``future()`` returns a ``grpc._CallFuture[Resp]``: code
typed against ``grpc.Channel`` type-checks unchanged against pyxds's
channel.  (grpc.aio's ABCs are generic at run time already: the asyncio
channel subclasses them directly.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

import grpc

__all__ = [
    "CallFuture",
    "CallIterator",
    "Future",
    "StreamStreamMultiCallable",
    "StreamUnaryMultiCallable",
    "UnaryStreamMultiCallable",
    "UnaryUnaryMultiCallable",
]

if TYPE_CHECKING:
    from grpc import Future as Future
    from grpc import StreamStreamMultiCallable as StreamStreamMultiCallable
    from grpc import StreamUnaryMultiCallable as StreamUnaryMultiCallable
    from grpc import UnaryStreamMultiCallable as UnaryStreamMultiCallable
    from grpc import UnaryUnaryMultiCallable as UnaryUnaryMultiCallable
    from grpc import _CallFuture as CallFuture
    from grpc import _CallIterator as CallIterator
else:
    _T = TypeVar("_T")
    _Request = TypeVar("_Request")
    _Response = TypeVar("_Response")

    class Future(grpc.Future, Generic[_T]):
        __slots__ = ()

    class CallFuture(grpc.Call, grpc.Future, Generic[_T]):
        __slots__ = ()

    class CallIterator(grpc.Call, Generic[_T]):
        __slots__ = ()

    class UnaryUnaryMultiCallable(grpc.UnaryUnaryMultiCallable, Generic[_Request, _Response]):
        __slots__ = ()

    class UnaryStreamMultiCallable(grpc.UnaryStreamMultiCallable, Generic[_Request, _Response]):
        __slots__ = ()

    class StreamUnaryMultiCallable(grpc.StreamUnaryMultiCallable, Generic[_Request, _Response]):
        __slots__ = ()

    class StreamStreamMultiCallable(grpc.StreamStreamMultiCallable, Generic[_Request, _Response]):
        __slots__ = ()
