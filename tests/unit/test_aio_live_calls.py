"""A subchannel's ``grpc.aio`` channel keeps each call in its registry until
the call is freed (pyxds.channel.aio_live_calls): what tells a closed
transport's watch whether C-core's channel can still reach SHUTDOWN before
its loop ends.  grpcio's channel is a stand-in with grpcio 1.85's registry
(``_active_calls``, ``_register_call``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

from pyxds.channel.aio_live_calls import any_referred, keep_until_freed, referred_calls


class _Call:
    def __init__(self) -> None:
        self.done_callbacks: list[Callable[[_Call], None]] = []

    def end(self) -> None:
        for callback in self.done_callbacks:
            callback(self)


class _Channel:
    """grpcio 1.85's registry: a call is in it from its start to its end."""

    def __init__(self) -> None:
        self._active_calls: weakref.WeakSet[_Call] = weakref.WeakSet()

    def _register_call(self, call: _Call) -> None:
        self._active_calls.add(call)
        call.done_callbacks.append(self._active_calls.discard)


def test_a_call_of_the_channel_is_known_referred_after_its_end_until_it_is_freed():
    channel = _Channel()
    keep_until_freed(channel)
    call = _Call()
    channel._register_call(call)
    call.end()
    calls = referred_calls(channel)
    channel._active_calls.clear()  # grpcio's close() forgets them
    assert len(calls) == 1 and any_referred(calls)
    del call
    gc.collect()
    assert not any_referred(calls)
    assert not channel._active_calls


def test_a_channel_without_grpcios_registry_is_left_as_it_is():
    class Other:
        def _register_call(self, call: object) -> None:
            pass

    other = Other()
    keep_until_freed(other)
    assert "_register_call" not in vars(other)
    assert referred_calls(other) == () and not any_referred(())
