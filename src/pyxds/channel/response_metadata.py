"""Response metadata an RPC's filter state adds to what the application sees
(``CallConfig.call_state``, :class:`pyxds.resolver.api.CallState`; today
A55's ``set-cookie``).

This module is the channel's whole side of that contract; the call objects
(:mod:`pyxds.channel.calls`, :mod:`pyxds.channel.aio`) only route their
metadata readers and raised errors through it:

* :func:`additions_of` gives an RPC's :class:`ResponseAdditions` (None for
  the RPCs without call state: nothing else runs for them).
* The first time the application reads the response's metadata (a call's
  ``initial_metadata()`` / ``trailing_metadata()``, or an error raised to
  it), the state's ``response_metadata()`` is asked once, after the pick of
  the attempt whose response it is, and where the pairs go is decided:
  into the trailing metadata when the response was trailers-only, else
  into the initial metadata.  grpcio does not say whether a response was
  trailers-only, so the rule is: the call ended with a non-OK status and
  its initial metadata is empty (what a server that fails an RPC before
  sending anything produces; C-core then adds the cookie to the trailers).
  A call the client ended itself had no response at all: the RPC's own
  deadline (DEADLINE_EXCEEDED once the deadline is over) or the
  application's cancel (CANCELLED after ``cancel()``); nothing is added
  (C-core's local status is no trailers-only response).
* :class:`CallWithMetadata` presents a finished sync grpcio call (or the
  ``grpc.RpcError`` it raised) with the additions; :func:`aio_error`
  rebuilds a ``grpc.aio.AioRpcError`` with them.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from pyxds.channel import grpc_generic

_log = logging.getLogger(__name__)

__all__ = ["ResponseAdditions", "CallWithMetadata", "additions_of", "aio_error", "aio_metadata"]

_OK = grpc.StatusCode.OK
_DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED
_CANCELLED = grpc.StatusCode.CANCELLED
Pairs = tuple[tuple[str, str], ...]

try:  # grpcio's metadata item type (a namedtuple with .key / .value)
    _Item: Any = getattr(importlib.import_module("grpc._cython.cygrpc"), "_Metadatum", None)
except Exception:  # pragma: no cover - another grpcio layout: plain pairs
    _Item = None


def _item(key: str, value: str) -> Any:
    return _Item(key, value) if _Item is not None else (key, value)


class ResponseAdditions:
    """What one RPC adds to its response metadata, decided once (module
    docstring)."""

    __slots__ = ("_state", "_rpc", "_pairs", "_trailing")

    def __init__(self, state: Any, rpc: Any = None) -> None:
        self._state = state
        #: the RPC (its ``deadline``, monotonic seconds or None, and
        #: ``cancelled``, set by the application's cancel)
        self._rpc = rpc
        self._pairs: Pairs | None = None
        self._trailing = False

    def _decide(self, initial: Any, code: grpc.StatusCode | None) -> Pairs:
        if self._pairs is None:
            if self._ended_here(code):
                pairs: Pairs = ()  # ended by the client: no response
            else:
                try:
                    pairs = tuple(self._state.response_metadata())
                except Exception:
                    _log.exception("pyxds: response_metadata raised")
                    pairs = ()
            self._trailing = code is not None and code is not _OK and not initial
            self._pairs = pairs
        return self._pairs

    def _ended_here(self, code: grpc.StatusCode | None) -> bool:
        """Whether the client ended the call (module docstring)."""
        if code is _CANCELLED:
            return bool(getattr(self._rpc, "cancelled", False))
        if code is _DEADLINE_EXCEEDED:
            deadline = getattr(self._rpc, "deadline", None)
            return deadline is not None and time.monotonic() >= deadline
        return False

    def initial(self, metadata: Any, code: grpc.StatusCode | None) -> Any:
        """``metadata`` (the response's initial metadata; ``code``: the
        call's status if it ended, else None) plus what goes there."""
        pairs = self._decide(metadata, code)
        if not pairs or self._trailing:
            return metadata
        return (*(metadata or ()), *(_item(k, v) for k, v in pairs))

    def trailing(self, metadata: Any, initial: Any, code: grpc.StatusCode | None) -> Any:
        pairs = self._decide(initial, code)
        if not pairs or not self._trailing:
            return metadata
        return (*(metadata or ()), *(_item(k, v) for k, v in pairs))

    def aio_initial(self, metadata: Any, code: grpc.StatusCode | None) -> Any:
        pairs = self._decide(metadata, code)
        if not pairs or self._trailing:
            return metadata
        return _aio_plus(metadata, pairs)

    def aio_trailing(self, metadata: Any, initial: Any, code: grpc.StatusCode | None) -> Any:
        pairs = self._decide(initial, code)
        if not pairs or not self._trailing:
            return metadata
        return _aio_plus(metadata, pairs)


def additions_of(rpc: Any) -> ResponseAdditions | None:
    """The RPC's additions, None when its CallConfig has no call state."""
    config = getattr(rpc, "call_config", None)
    state = getattr(config, "call_state", None)
    return None if state is None else ResponseAdditions(state, rpc)


def _aio_plus(metadata: Any, pairs: Pairs) -> Any:
    out = grpc.aio.Metadata(*(tuple(metadata) if metadata else ()))
    for key, value in pairs:
        out.add(key, value)
    return out


def aio_metadata(metadata: Any, additions: ResponseAdditions | None, code: Any) -> Any:
    return metadata if additions is None else additions.aio_initial(metadata, code)


def aio_error(err: grpc.aio.AioRpcError, additions: ResponseAdditions | None) -> Any:
    """``err`` with the additions in its metadata (``err`` itself when none)."""
    if additions is None:
        return err
    initial = err.initial_metadata()
    code = err.code()
    new_initial = additions.aio_initial(initial, code)
    new_trailing = additions.aio_trailing(err.trailing_metadata(), initial, code)
    if new_initial is initial and new_trailing is err.trailing_metadata():
        return err
    return grpc.aio.AioRpcError(
        code, new_initial, new_trailing, err.details(), err.debug_error_string()
    )


class CallWithMetadata(grpc.RpcError, grpc_generic.CallFuture[Any]):
    """A finished sync grpcio call (as ``with_call`` returns it, or the
    ``grpc.RpcError`` a failed call raises) whose metadata readers include
    the RPC's additions; everything else is the call's."""

    def __init__(self, inner: Any, additions: ResponseAdditions) -> None:
        super().__init__()
        self._inner = inner
        self._additions = additions

    def _code(self) -> grpc.StatusCode | None:
        try:
            code: grpc.StatusCode | None = self._inner.code()
        except Exception:
            return None
        return code

    def initial_metadata(self) -> Any:
        return self._additions.initial(self._inner.initial_metadata(), self._code())

    def trailing_metadata(self) -> Any:
        initial = self._inner.initial_metadata()
        return self._additions.trailing(self._inner.trailing_metadata(), initial, self._code())

    # everything else is the call's
    def code(self) -> Any:
        return self._inner.code()

    def details(self) -> Any:
        return self._inner.details()

    def debug_error_string(self) -> Any:
        return self._inner.debug_error_string()

    def is_active(self) -> bool:
        return bool(self._inner.is_active())

    def time_remaining(self) -> Any:
        return self._inner.time_remaining()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return bool(self._inner.add_callback(callback))

    def cancel(self) -> bool:
        return bool(self._inner.cancel())

    def cancelled(self) -> bool:
        return bool(self._inner.cancelled())

    def running(self) -> bool:
        return bool(self._inner.running())

    def done(self) -> bool:
        return bool(self._inner.done())

    def result(self, timeout: float | None = None) -> Any:
        return self._inner.result(timeout)

    def exception(self, timeout: float | None = None) -> Any:
        return self._inner.exception(timeout)

    def traceback(self, timeout: float | None = None) -> Any:
        return self._inner.traceback(timeout)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._inner.add_done_callback(lambda _inner: fn(self))

    def __getattr__(self, name: str) -> Any:
        if name in ("_inner", "_additions"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __str__(self) -> str:
        return str(self._inner)

    __repr__ = __str__
