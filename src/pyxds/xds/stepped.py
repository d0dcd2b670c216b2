"""A coroutine run on its event loop without an ``asyncio.Task`` (issue 18:
memory per endpoint).

The xDS stream loop (:mod:`pyxds.xds.stream_loop`) keeps a few awaits
pending per endpoint for as long as the endpoint lives (a side connection's
connectivity watch, its ORCA stream's reader).  A Task for each is ~450
bytes (the task, its context copy and name, its entry in asyncio's weak set
of tasks) besides the coroutine it runs.  :class:`Stepped` does the part of
a Task these need, in a slotted object of three fields:

* the coroutine's first step runs at once (in the caller's callback, on the
  loop; a Task's runs in the next callback);
* when it awaits an asyncio future, the next step runs from that future's
  done callback (the future's result or exception is what the ``await``
  returns or raises, as with a Task); a bare ``yield`` (``asyncio.sleep(0)``)
  steps again in the next callback;
* when it returns or raises, ``then(result, error)`` is called once: the
  value it returned and None, or None and the exception (an ``Exception``
  or ``CancelledError``; ``KeyboardInterrupt`` and ``SystemExit`` propagate);
* :meth:`Stepped.close` ends it where it waits (the future it awaits is
  cancelled, the coroutine closed: ``finally`` blocks run, ``except
  CancelledError`` ones do not) and ``then`` is never called.

Not a Task: ``asyncio.current_task()`` is not it, and nothing can await it.
Only for coroutines of pyxds's own that need neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["Stepped", "Then"]

#: ``then(result, error)``: how the coroutine ended (module docstring)
Then = Callable[[Any, BaseException | None], None]


class Stepped:
    """``coro`` run on the running loop (module docstring)."""

    __slots__ = ("_coro", "_awaited", "_then")

    def __init__(self, coro: Coroutine[Any, Any, Any], then: Then) -> None:
        self._coro: Coroutine[Any, Any, Any] | None = coro
        #: the future the coroutine waits for
        self._awaited: asyncio.Future[Any] | None = None
        self._then: Then | None = then
        self(None)

    def __call__(self, _future: object) -> None:
        """The next step (the awaited future's done callback: this object
        itself rather than a bound method of it, ~64 bytes less each)."""
        coro = self._coro
        if coro is None:
            return
        self._awaited = None
        error: BaseException | None = None
        try:
            awaited = coro.send(None)
        except StopIteration as stop:
            result = stop.value
        except (Exception, asyncio.CancelledError) as err:
            result, error = None, err
        else:
            self._wait(coro, awaited)
            return
        # outside the handler: what ``then`` does next (a new await) must not
        # run while this exception is the one being handled (a coroutine
        # started there keeps it, its traceback and this frame alive)
        self._end(result, error)

    def _wait(self, coro: Coroutine[Any, Any, Any], awaited: Any) -> None:
        if getattr(awaited, "_asyncio_future_blocking", False):
            awaited._asyncio_future_blocking = False
            self._awaited = awaited
            awaited.add_done_callback(self)
        elif awaited is None:  # a bare yield: step again next
            asyncio.get_running_loop().call_soon(self, None)
        else:
            coro.close()
            self._end(None, RuntimeError(f"pyxds: a stepped coroutine awaited {awaited!r}"))

    def _end(self, result: Any, error: BaseException | None) -> None:
        self._coro = None
        then, self._then = self._then, None
        if then is not None:
            then(result, error)

    @property
    def done(self) -> bool:
        """Whether the coroutine ended (or was closed)."""
        return self._coro is None

    def close(self) -> None:
        """End the coroutine where it waits; ``then`` is not called."""
        coro, self._coro = self._coro, None
        self._then = None
        awaited, self._awaited = self._awaited, None
        if awaited is not None:
            awaited.remove_done_callback(self)
            awaited.cancel()
        if coro is not None:
            coro.close()
