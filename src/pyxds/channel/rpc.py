"""One RPC, top to bottom: its route, its picks, its attempts, its end
(gRFC A31 for the route, A39/A33 for the filters, A6 and A44 for retries,
A66 for the metrics).

Theory of operation
-------------------

An :class:`Rpc` is the whole story of one RPC on a pyxds channel, sync or
asyncio, unary or streaming.  It performs no I/O: it never blocks, sleeps,
starts a thread, a timer or an asyncio task, and never starts a grpcio
call.  The call objects (``calls.py`` for the sync channel, ``aio.py`` for
``grpc.aio``) are its adapters: they ask it what to do next, wait their
own way (a blocked thread, a timer, an awaited sleep), start the grpcio
call on the transport it names, and tell it how that call ended.  Every
decision is taken here, the same way for all of them; everything below it
is called, nothing calls back into it:

1. **Start** (``Rpc(core, ...)``): the deadline from the timeout, the A66
   call metrics when metrics are on, the channel counts the call (it
   leaves idle).  A closed channel raises ValueError with grpcio's words.
2. **Pick** (:meth:`Rpc.pick`, once per attempt):

   a. *Route*, once per RPC (A31: the ConfigSelector is "invoked once at
      the beginning of every RPC"): the channel's current ConfigSelector
      gives the CallConfig: a status fails the RPC; the deadline is capped
      at the route's timeout; the route's A39 filters run once
      (:func:`pyxds.resolver.http_filters.run_chain`), giving the RPC's
      filter state (None when they have nothing to do).
   b. *Filters before the pick*: an A33 delay (never past the deadline),
      then an abort.
   c. *The picker*: the channel's current one, with the route's call
      attributes (A55's session rides there, put by the ConfigSelector).
      ``PickComplete`` -> the subchannel's transport, counted;
      ``PickQueue`` -> wait for the channel's next publication;
      ``PickFail`` -> fail (A6: the RPC's retry policy may retry it), or
      wait when wait_for_ready; ``PickDrop`` -> fail.  A pick
      that fails while the route it was routed by is being replaced is
      routed again (a route switch fails no RPC).

   The answer: a :class:`Transport` (start the attempt on it, with
   :attr:`Rpc.send_metadata` and :attr:`Rpc.timeout`), None (nothing
   started: pick again at the channel's next publication, see
   ``ChannelCore.add_waiter``), a float (wait that long, then pick again:
   a fault delay or a failed pick's retry backoff) or a Status (the RPC is
   over with it: it has been finished).
3. **An attempt ends** (:meth:`Rpc.ended`): the retry decision
   (:class:`pyxds.channel.retry.RetryState`, made on the first failed
   attempt: transparent retries first, then the RPC's own A6/A44 policy,
   never past the deadline, never once committed or cancelled): the
   seconds to wait before the next attempt (a fresh pick), or None (the
   RPC is over, finished).  Decided once per attempt, whichever of the
   adapter's readers and its call-ended callback sees the end first; a
   later report of the same attempt (its grpcio call object identifies it)
   gets the same answer.
4. **The end** (:meth:`Rpc.finish`, once): the last attempt reaches the
   LB policy, the throttle hears of a success, the call metrics end, the
   CallConfig is committed, the channel counts the call done.

Each attempt reaches the LB policy exactly once: its pick's
``on_call_trailers`` (A51 per-call ORCA) then ``on_call_done``, and the A66
attempt metrics (:meth:`Rpc._report`).  A pick that chose a subchannel on
which nothing was started is reported as ``ATTEMPT_NOT_STARTED``.

Phases (:attr:`Rpc.phase`)::

    PICKING --pick(): transport--> RUNNING --ended(): retry--> BACKOFF/PICKING
       |  \\--pick(): None/float, start_failed()--> PICKING
       \\--pick(): Status--> DONE            RUNNING --ended(): final--> DONE

Commit (A6): a response, a ``write()`` the RPC cannot keep, the request
buffer past its limit, or response headers on a failed attempt: no retry
from then on.  Cancel: the application cancelled; no retry either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import grpc

from pyxds import metrics as _metrics
from pyxds.channel.call_metrics import CallMetrics
from pyxds.channel.grpc_calls import trailing_metadata_of
from pyxds.channel.metadata_check import grpcio_error, well_formed
from pyxds.channel.request_buffer import size_of
from pyxds.channel.retry import PREVIOUS_ATTEMPTS_KEY, RetryState, goaway_refused, not_sent
from pyxds.channel.subchannel import SubchannelCore, Transport, core_of
from pyxds.lb.api import (
    ATTEMPT_NOT_STARTED,
    AUTHORITY_HEADER,
    PickArgs,
    PickComplete,
    PickDrop,
    PickFail,
)
from pyxds.status import Status

if TYPE_CHECKING:
    from pyxds.channel.core import ChannelCore
    from pyxds.channel.request_buffer import RequestBuffer
    from pyxds.lb.api import Picker
    from pyxds.resolver.api import CallConfig, ConfigSelector
    from pyxds.resolver.http_filters import FilterVerdict

__all__ = [
    "BACKOFF",
    "CANCELLED",
    "CHANNEL_CLOSED",
    "DEADLINE_EXCEEDED",
    "DONE",
    "PICKING",
    "RUNNING",
    "Rpc",
]

_log = logging.getLogger(__name__)

PICKING = "picking"
RUNNING = "running"
BACKOFF = "backoff"
DONE = "done"

DEADLINE_EXCEEDED = Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
CANCELLED = Status(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
CHANNEL_CLOSED = Status(grpc.StatusCode.CANCELLED, "Channel closed!")
#: grpcio's ValueError text for an RPC invoked on a closed sync channel
CLOSED_CHANNEL_MESSAGE = "Cannot invoke RPC on closed channel!"
CLOSED_CHANNEL_MESSAGE_ASYNC = "Cannot invoke RPC: Channel closed!"

_OK = grpc.StatusCode.OK
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED
#: times a failed pick is routed again while the channel's config changes
_MAX_REROUTES = 2
#: Seconds an RPC whose attempt never left the client (A6 transparent retry)
#: waits for a picker newer than the one that chose the lost connection.
#: The failure makes the connectivity monitor look at that connection at
#: once (``Transport.suspect``; every ~1 ms while warm), so a loss it can see
#: reaches a new picker within milliseconds.  A picker still current after
#: this grace means the monitor saw the connection as it was: READY, lost
#: and re-made between two checks (``pyxds.connectivity`` rule 1).  The RPC
#: is then picked by it again, as C-core re-picks a transparent retry at
#: once, instead of waiting for a state change that will not come.
STALE_PICKER_GRACE = 0.25
#: C-core's count of a header in the retry buffer: name + value + 32 (HPACK's
#: per-entry overhead, RFC 7541 section 4.1); ``:path`` without its value
_HEADER_OVERHEAD = 32
_PATH_HEADER = len(":path") + _HEADER_OVERHEAD
#: ``grpc-timeout`` as C-core counts it for a deadline of seconds ("4999m")
_GRPC_TIMEOUT_BYTES = len("grpc-timeout") + 5 + _HEADER_OVERHEAD
#: PickArgs shared per channel (Rpc._shared_args)
_MAX_SHARED_ARGS = 256


class Rpc:
    """See the module docstring."""

    # What most RPCs never change is a class attribute: an RPC stores only
    # what it sets (no __slots__: ten stores per RPC instead of twenty-five).
    #: seconds left to the deadline when the running attempt started (None:
    #: no deadline): the timeout of its grpcio call
    timeout: float | None = None
    #: the requests kept for a retry (client-streaming RPCs)
    buffer: RequestBuffer | None = None
    phase = PICKING
    committed = False
    cancelled = False
    call_config: CallConfig | None = None
    #: what the route's filters do to this RPC (None: nothing)
    filters: FilterVerdict | None = None
    #: the retry decision, made on the first failed attempt
    retry: RetryState | None = None
    _selector: ConfigSelector | None = None
    _reselects = 0
    _hold_until: float | None = None  # the end of the filters' delay, once started
    _filters_done = False  # the filters' verdict before the pick was carried out
    _picked_by: Picker | None = None  # the picker of the last completed pick
    _transport: Transport | None = None  # the running (or last) attempt's
    _goaway_from: Transport | None = None  # the last to refuse an attempt with a GOAWAY
    _stale_picker: Picker | None = None  # not picked with again before _stale_until
    _stale_until = 0.0
    _on_call_done: Callable[[Status], None] | None = None
    _on_call_trailers: Callable[[Sequence[tuple[str, Any]]], None] | None = None
    #: the last pick's ``PickComplete.attempt_labels`` (A78), for its attempt's metrics
    _attempt_labels: Mapping[str, str] | None = None
    #: the last pick's ``PickComplete.metadata``: headers its attempt adds
    #: (``rls_experimental``'s ``x-google-rls-data``), replacing the RPC's own
    pick_metadata: tuple[tuple[str, str], ...] | None = None
    #: (call, delay) of each attempt followed by another (made at the first
    #: retry: an RPC that is not retried never builds it; read-only outside)
    retried: list[tuple[Any, float]] | None = None
    #: the application's metadata, as (key, value) pairs (what routing reads)
    metadata: Sequence[tuple[str, Any]] = ()
    #: the metadata the next attempt sends (the application's, plus
    #: ``grpc-previous-rpc-attempts`` on a retry)
    send_metadata: Any = None
    #: the RPC's deadline (``time.monotonic()``; None: none)
    deadline: float | None = None
    wait_for_ready = False
    _wfr_explicit = False  # the application said wait_for_ready (True or False)
    #: A66 per-call metrics, None while metrics are off
    metrics: CallMetrics | None = None

    # ------------------------------------------------------------------
    # 1. Start
    # ------------------------------------------------------------------
    def __init__(
        self,
        core: ChannelCore,
        path: str,
        metadata: Any,
        timeout: float | None,
        wait_for_ready: bool | None,
        buffer: RequestBuffer | None = None,
        blocking: bool = True,
    ) -> None:
        if core.closed:  # grpcio's words: its blocking calls and the others differ
            raise ValueError(CLOSED_CHANNEL_MESSAGE if blocking else CLOSED_CHANNEL_MESSAGE_ASYNC)
        self.core = core
        self.path = path
        # what an RPC without metadata, timeout or wait_for_ready leaves as
        # the class has it (the attributes above __init__); a timeout that
        # is not a number raises before malformed metadata, as in grpcio
        if timeout is not None:
            self.deadline = time.monotonic() + timeout
        if metadata is not None:
            self.send_metadata = metadata
            if metadata:
                # the pairs as grpcio takes them (its augment_metadata's
                # tuple), sent too: an iterator is read once
                self.metadata = self.send_metadata = held = tuple(metadata)
                if not well_formed(held):
                    self._refuse(metadata, held)
        if wait_for_ready is not None:
            self.wait_for_ready = bool(wait_for_ready)
            self._wfr_explicit = True
        if buffer is not None:
            self.buffer = buffer
            # C-core counts the headers in the retry buffer too (seen live)
            buffer.limit = core.retry_buffer_size - self.header_bytes()
        if _metrics.RECORDER is not None:
            self.metrics = CallMetrics(path, core.metrics_target, path in core.registered_methods)
        core.count_started()
        if core.idle:
            core.exit_idle_for_rpc()

    def _refuse(self, metadata: Any, held: tuple[Any, ...]) -> None:
        """Metadata :func:`well_formed` did not vouch for: what grpcio would
        raise converting it (after making its C-core call, which it then
        never releases: the channel's connection would outlive ``close()``,
        pyxds/channel/metadata_check.py) is raised here, before any call,
        as grpcio raises it from the call itself."""
        error = grpcio_error(held)
        if error is not None:
            raise error

    def remaining(self) -> float | None:
        """Seconds to the deadline (None: no deadline)."""
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    def queue_wait(self) -> float | None:
        """Seconds a queued pick (:meth:`pick` answered None) waits for the
        channel's next publication before it picks again: to the deadline,
        or to the end of :data:`STALE_PICKER_GRACE` when that comes first
        (None: no bound).  When the wait ends with no publication, the
        adapter ends the RPC if :meth:`remaining` is over, else picks again."""
        remaining = self.remaining()
        grace = self.stale_grace_left()
        if grace is None or (remaining is not None and remaining <= grace):
            return remaining
        return grace

    def stale_wait_over(self) -> None:
        """The adapter's wait of :meth:`queue_wait` ran out before the
        deadline: the grace is over, the next pick may use any picker."""
        self._stale_picker = None

    def stale_grace_left(self) -> float | None:
        """Seconds left of :data:`STALE_PICKER_GRACE` while the RPC waits for
        a picker newer than its stale one (None: it does not)."""
        if self._stale_picker is None:
            return None
        return self._stale_until - time.monotonic()

    def attempt_metadata(self) -> Any:
        """The metadata the attempt sends: ``send_metadata`` plus the pick's
        headers (``PickComplete.metadata``), which replace the RPC's values
        of their keys."""
        extra = self.pick_metadata
        base = self.send_metadata
        if extra is None:
            return base
        keys = {k for k, _ in extra}
        if AUTHORITY_HEADER in keys:  # not metadata: the attempt's authority
            extra = tuple(kv for kv in extra if kv[0] != AUTHORITY_HEADER)
        return (*(kv for kv in (base or ()) if kv[0] not in keys), *extra)

    def pick_authority(self) -> str | None:
        """The ``:authority`` the pick set for the attempt (A81: the picker's
        ``(AUTHORITY_HEADER, name)`` entry of ``PickComplete.metadata``), or
        None: the channel's."""
        authority = None
        for key, value in self.pick_metadata or ():
            if key == AUTHORITY_HEADER:
                authority = value
        return authority

    @property
    def done(self) -> bool:
        return self.phase is DONE

    @property
    def wants_call(self) -> bool:
        """Whether the attempt's grpcio call object is needed at its end
        (its trailers go to the LB policy: A51 per-call ORCA)."""
        return self._on_call_trailers is not None

    # ------------------------------------------------------------------
    # 2. Pick
    # ------------------------------------------------------------------
    def pick(self) -> Transport | Status | float | None:
        """The next step of the RPC (see the module docstring)."""
        core = self.core
        if self.cancelled:
            return self.finish(CANCELLED)
        if core.closed:
            return self.finish(CHANNEL_CLOSED)
        deadline = self.deadline
        if self.retry is not None:
            if deadline is not None and deadline <= time.monotonic():
                return self.finish(DEADLINE_EXCEEDED)  # a retry's backoff ran into it
            metrics = self.metrics
            if metrics is not None and not metrics.attempt_open:
                metrics.attempt_started()  # A66: a retry's attempt, after its backoff
        while True:
            config = self.call_config
            if config is None:
                routed = self._route()
                if routed is not True:
                    return None if routed is False else self.finish(routed)
                config = self.call_config
                assert config is not None
            attributes = config.call_attributes
            filters = self.filters
            if filters is not None and not self._filters_done:
                held = self._before_pick(filters)
                if held is not None:
                    return held if held.__class__ is float else self.finish(held)  # type: ignore[arg-type]
            picker = core.picker
            if picker is self._stale_picker:
                if time.monotonic() < self._stale_until:
                    return None  # it chose a lost connection for this RPC: wait for the next
                self._stale_picker = None  # no newer one came: see STALE_PICKER_GRACE
            metadata = self.metadata
            if metadata or attributes.__class__ is not MappingProxyType:
                # metadata, or attributes made for this RPC (a hash, a session)
                args = PickArgs(self.path, metadata, attributes)
            else:  # shared: the same for every such RPC of the route (Rpc._shared_args)
                args = core.shared_pick_args.get((self.path, id(attributes)))  # type: ignore[assignment]
                if args is None or args.call_attributes is not attributes:
                    args = self._shared_args(attributes)
            try:
                result = picker.pick(args)
            except Exception as err:
                _log.exception("pyxds: picker raised")
                return self.finish(Status(grpc.StatusCode.INTERNAL, f"picker failed: {err}"))
            if result.__class__ is PickComplete or isinstance(result, PickComplete):
                return self._picked(result, picker)  # type: ignore[arg-type]
            if isinstance(result, PickFail):
                if self.wait_for_ready:
                    return None
                again = self._reroute()
                if again is not False:
                    if again is None:
                        return None  # the publication that ends the update wakes it
                    continue
                if config.retry_policy is not None:
                    # A6: a pick that fails (not a drop) is handled by the policy
                    delay = self._retry_delay(result.status, pick_failed=True)
                    if delay is not None:
                        if self.metrics is not None:  # the attempt failed with the pick
                            self.metrics.attempt_failed(result.status, None)
                        return delay
                return self.finish(result.status)
            if isinstance(result, PickDrop):
                again = self._reroute()
                if again is not False:
                    if again is None:
                        return None
                    continue
                return self.finish(result.status)
            return None  # PickQueue

    def _shared_args(self, attributes: Mapping[str, Any]) -> PickArgs:
        """The PickArgs of an RPC without metadata on this path with these
        call attributes, shared by every such RPC of the channel (a frozen
        value; the attributes are a read-only view a config selector keeps
        per route, shared by its RPCs already: ``ClusterRef.attributes``,
        ``EMPTY_ATTRIBUTES``; a plain mapping, as the xDS selector makes for
        an RPC with a request hash or a session, is never shared): one
        allocation per route and path instead of one per RPC.
        Kept per (path, id of the attributes) while the value holds them, at
        most :data:`_MAX_SHARED_ARGS` (then forgotten, e.g. after config
        changes or over many paths)."""
        args = PickArgs(self.path, (), attributes)
        shared = self.core.shared_pick_args
        if len(shared) >= _MAX_SHARED_ARGS:
            shared.clear()
        shared[self.path, id(attributes)] = args
        return args

    def _route(self) -> Status | bool:
        """Choose the RPC's CallConfig (once, A31) and run its filters:
        True (routed), False (no config yet: wait for the next one) or the
        Status that fails the RPC."""
        core = self.core
        selector = core.selector
        if selector is None:
            status = core.no_config_status
            if status is not None and not self.wait_for_ready:
                return status
            return False
        try:
            config = selector.select(self.path, self.metadata)
        except Exception as err:  # a selector bug must not escape as a crash
            _log.exception("pyxds: config selector raised")
            return Status(grpc.StatusCode.INTERNAL, f"config selector failed: {err}")
        if config.status is not None and not config.status.ok:
            if config.no_config and self.wait_for_ready:
                return False  # no usable config: wait for the next one
            self.call_config = config
            self._selector = selector
            return config.status
        self.call_config = config
        self._selector = selector
        if config.wait_for_ready is not None and not self._wfr_explicit:
            self.wait_for_ready = config.wait_for_ready
        if config.timeout is not None and config.timeout > 0:
            cap = time.monotonic() + config.timeout
            if self.deadline is None or cap < self.deadline:
                self.deadline = cap
        if config.filters:
            from pyxds.resolver.http_filters import run_chain

            # routed again (a route switch): the new verdict is carried out
            # too, a delay already waited is not waited again (_hold_until)
            self.filters = run_chain(config.filters, self.metadata, core.random)
            self._filters_done = False
        elif self.metrics is not None and not self.metrics.attempt_open:
            self.metrics.attempt_started()  # A66: routed, no filter in the way
        return True

    def _before_pick(self, filters: FilterVerdict) -> Status | float | None:
        """The filters' verdict before the pick (A33: delay, then abort, both
        before anything is sent): seconds still to wait (never past the
        deadline), the abort status (DEADLINE_EXCEEDED when the delay ran
        into the deadline), or None to go on to the pick."""
        outcome = filters.abort
        if filters.delay > 0:
            now = time.monotonic()
            if self._hold_until is None:
                self._hold_until = now + filters.delay
            left = self._hold_until - now
            if left > 0:
                to_deadline = None if self.deadline is None else self.deadline - now
                if to_deadline is None or to_deadline > left:
                    return left
                if to_deadline > 0:
                    return to_deadline  # then DEADLINE_EXCEEDED
                outcome = DEADLINE_EXCEEDED
        self._filters_done = True
        if filters.done is not None:
            filters.done()
        if outcome is None and self.metrics is not None and not self.metrics.attempt_open:
            self.metrics.attempt_started()  # A66: the attempt starts after the filters
        return outcome

    def _picked(self, result: PickComplete, picker: Picker) -> Transport | Status | None:
        """A completed pick: the transport to start the attempt on, counted."""
        subchannel: SubchannelCore | None = getattr(result.subchannel, "core", None)
        if subchannel.__class__ is not SubchannelCore:  # not a ChannelSubchannel:
            subchannel = core_of(result.subchannel)  # wrapped by a policy
        transport = subchannel.transport if subchannel is not None else None
        if transport is None or transport.closed:
            # not one of ours, or lost its connection since the picker was
            # built: the next picker will say more
            if result.on_call_done is not None:
                result.on_call_done(ATTEMPT_NOT_STARTED)
            return None
        self._on_call_done = result.on_call_done
        self._on_call_trailers = result.on_call_trailers
        self._attempt_labels = result.attempt_labels
        self.pick_metadata = result.metadata
        self._picked_by = picker
        if self.deadline is not None:
            remaining = self.timeout = self.deadline - time.monotonic()
            if remaining <= 0:  # e.g. after a backoff
                return self.finish(DEADLINE_EXCEEDED)
        if not transport.call_started():
            self._report(ATTEMPT_NOT_STARTED)
            return None
        self.phase = RUNNING
        self._transport = transport
        return transport

    def _reroute(self) -> bool | None:
        """A failed pick of an RPC routed by a config that is being replaced
        (the LB tree already dropped the old route's cluster, the new config
        selector is not published yet) is routed again by the new config
        instead of failing: a route switch fails no RPC.  True: routed
        again, pick now; None: wait for the publication that ends the
        update; False: the failure stands."""
        if self._reselects >= _MAX_REROUTES:
            return False
        core = self.core
        if core.applying:
            self._reselects += 1
            self._release_config()
            return None
        if self._selector is not None and self._selector is not core.selector:
            self._reselects += 1
            self._release_config()
            return True
        return False

    def _release_config(self) -> None:
        """Forget the CallConfig (committing it) so the RPC is routed again."""
        config, self.call_config = self.call_config, None
        self._selector = None
        if config is not None and config.on_committed is not None:
            try:
                config.on_committed()
            except Exception:
                _log.exception("pyxds: on_committed raised")

    def start_failed(self, transport: Transport) -> bool:
        """Starting the attempt's grpcio call on ``transport`` raised.

        True: the transport had closed under us (grpcio's "Cannot invoke RPC
        on closed channel!"), so nothing was sent: the pick is reported as
        not started; pick again.  False: the call's own arguments are wrong
        (malformed metadata, a timeout that is not a number: grpcio raises
        the same on its own channel, and would again on any subchannel);
        the count on the transport is given back and the adapter ends the
        RPC with the error, never picking again for it.
        """
        transport.call_finished()
        if transport.closed:
            self._report(ATTEMPT_NOT_STARTED)
            self.phase = PICKING
            return True
        return False

    # ------------------------------------------------------------------
    # 3. An attempt ends
    # ------------------------------------------------------------------
    def ended(
        self,
        call: Any,
        status: Status,
        read_metadata: Callable[[Any], tuple[Any, Any]] | None = None,
        request: Any = None,
        method: Any = None,
    ) -> float | None:
        """The attempt ``call`` ended with ``status``: seconds to wait before
        the next attempt, or None (the RPC is over, finished here).
        ``read_metadata(call)`` gives the attempt's (initial, trailing)
        metadata, read only for a failed attempt (non-empty initial metadata
        = response headers = committed; trailers: the server's pushback).
        ``request``: a single-request RPC's request, ``method`` its
        GrpcMethod (whose ``serializer`` makes its bytes; None when the
        request is bytes already), looked at only when the failure is one
        the RPC's policy would retry (:meth:`_request_overflows`)."""
        delay = self._delay_of(call)
        if delay is not None or self.phase is DONE:
            return delay  # decided already
        if not status.ok and not self.cancelled:
            if status.code is _UNAVAILABLE and self._transport is not None:
                self._transport.suspect()  # its connection may be gone: look now
            initial, trailing = read_metadata(call) if read_metadata is not None else (None, None)
            buffer = self.buffer
            committed = (
                self.committed or bool(initial) or (buffer is not None and not buffer.recording)
            )
            if not committed and request is not None and buffer is None:
                committed = self._request_overflows(status, request, method)
            delay = self._retry_delay(status, trailing, committed)
        if delay is None:
            self.finish(status, call)
        else:
            if self.retried is None:
                self.retried = []
            self.retried.append((call, delay))
            self._report(status, call, next_now=False)
            self.phase = BACKOFF if delay > 0 else PICKING
        return delay

    def _request_overflows(self, status: Status, request: Any, method: Any) -> bool:
        """Whether a single-request RPC's request did not fit the retry
        buffer (``grpc.per_rpc_retry_buffer_size``), which commits the RPC
        (A6 "When Retries are Valid": "The client's outgoing message has
        overflowed the gRPC client library's buffer"; "For unary and server
        streaming calls, the outgoing message is a single message").
        Measured as grpcio 1.85's C-core counts it (seen live): the message
        plus :meth:`header_bytes`.  Only for a failure the RPC's policy
        would retry and that is not a transparent retry: nothing is measured
        otherwise."""
        config = self.call_config
        policy = config.retry_policy if config is not None else None
        if policy is None or status.code not in policy.retryable_codes:
            return False
        if not_sent(status.code, status.details):
            return False  # never reached the server application: A6 case 2/3
        serializer = getattr(method, "serializer", None)
        try:
            size = len(serializer(request)) if serializer is not None else size_of(request)
        except Exception:
            return False  # the attempt was sent, so this does not happen
        return size + self.header_bytes() > self.core.retry_buffer_size

    def header_bytes(self) -> int:
        """The RPC's headers as grpcio 1.85's C-core counts them in its retry
        buffer (seen live, ``grpc.per_rpc_retry_buffer_size``): name + value
        + 32 (HPACK's per-entry size) for ``:path``, each of the
        application's metadata and ``grpc-timeout`` when there is a deadline
        (5 characters, as C-core writes a deadline of seconds)."""
        size = _PATH_HEADER + len(self.path)
        for pair in self.metadata:
            try:
                key, value = pair
                size += len(key) + len(value) + _HEADER_OVERHEAD
            except (TypeError, ValueError):
                # not a pair of text: the call fails when its attempt starts
                # (grpc.aio refuses it there, at the first use of the call),
                # not here
                pass
        if self.deadline is not None:
            size += _GRPC_TIMEOUT_BYTES
        return size

    def reported(self, call: Any) -> bool:
        """Whether the end of the attempt ``call`` was decided already (or
        the RPC is over)."""
        if self.retried is None:  # no attempt was followed by another
            return self.phase is DONE
        return self._delay_of(call) is not None or self.phase is DONE

    def _delay_of(self, call: Any) -> float | None:
        retried = self.retried
        if retried is not None:
            for decided, delay in retried:
                if decided is call:
                    return delay
        return None

    def _retry_delay(
        self,
        status: Status,
        trailing_metadata: Sequence[tuple[str, Any]] | None = None,
        committed: bool = False,
        pick_failed: bool = False,
    ) -> float | None:
        """The RPC's retry decision for an attempt that ended with
        ``status`` (``pick_failed``: its pick failed, nothing was sent):
        seconds to wait before the next attempt, or None.  The policy is
        the one of this RPC's CallConfig, chosen once (A31), and the wait
        never goes past the deadline (the next pick then fails with
        DEADLINE_EXCEEDED)."""
        state = self.retry
        core = self.core
        if state is None:
            if not core.retries_enabled:
                return None
            config = self.call_config
            policy = config.retry_policy if config is not None else None
            state = self.retry = RetryState(policy, core.retry_throttle, core.random)
        going_away = False
        if not pick_failed and goaway_refused(status.code, status.details):
            # a second GOAWAY from the same connection: the attempt was
            # started on a connection going away (retry.py rule 2)
            going_away = self._goaway_from is self._transport
            self._goaway_from = self._transport
        delay = state.on_attempt_end(status, trailing_metadata, committed, pick_failed, going_away)
        if delay is None:
            return None
        if state.wait_for_new_picker:
            # A6 transparent retry of an attempt that never left the client:
            # the picker that chose its lost connection is not used again
            self._stale_picker = self._picked_by
            self._stale_until = time.monotonic() + STALE_PICKER_GRACE
        previous = state.previous_attempts
        if previous:
            self.send_metadata = (*self.metadata, (PREVIOUS_ATTEMPTS_KEY, str(previous)))
        if self.deadline is not None:
            delay = max(0.0, min(delay, self.deadline - time.monotonic()))
        return delay

    def commit(self) -> None:
        """The RPC committed: no retry from now on, no request kept."""
        self.committed = True
        if self.buffer is not None:
            self.buffer.commit()

    def cancel(self) -> bool:
        """The application cancels; False when the RPC was already over."""
        if self.phase is DONE:
            return False
        self.cancelled = True
        return True

    # ------------------------------------------------------------------
    # 4. The end
    # ------------------------------------------------------------------
    def finish(self, status: Status, call: Any = None) -> Status:
        """The RPC is over with ``status`` (``call``: its last attempt's
        grpcio call, when it reached a subchannel); returns ``status``.
        Once: a later finish changes nothing."""
        if self.phase is DONE:
            return status
        self.phase = DONE
        core = self.core
        if self._stale_picker is not None and status.code is _DEADLINE:
            self._stale_wait_ended(core)
        filters = self.filters
        if filters is not None and filters.done is not None and not self._filters_done:
            self._filters_done = True
            filters.done()  # e.g. the deadline came during a fault delay
        # the last attempt reaches the LB policy and its metrics (_report,
        # inline: every RPC ends here, most with neither hook nor metrics)
        if self._on_call_trailers is not None:
            self._trailers_to_policy(call)
        metrics = self.metrics
        if metrics is not None:
            metrics.attempt_ended(status, self._attempt_labels, True)
        done = self._on_call_done
        if done is not None:  # _call_done, inline
            self._on_call_done = None
            try:
                done(status)
            except Exception:
                _log.exception("pyxds: on_call_done raised")
        if status.code is _OK and core.retry_throttle is not None:
            core.retry_throttle.record_success()
        if metrics is not None:
            metrics.call_ended(status)
        config = self.call_config
        if config is not None and config.on_committed is not None:
            try:
                config.on_committed()
            except Exception:
                _log.exception("pyxds: on_committed raised")
        core.count_ended()
        return status

    def _stale_wait_ended(self, core: ChannelCore) -> None:
        """The deadline came while this RPC waited (within
        :data:`STALE_PICKER_GRACE`) for a picker other than the one that
        chose a connection its attempt found gone (A6 transparent retry):
        said, as nothing else would show why the RPC never had a second
        attempt."""
        if core.picker is self._stale_picker:
            _log.warning(
                "pyxds: %s on %s: deadline exceeded waiting for a new picker after an "
                "attempt that never left the client; no subchannel state changed since",
                self.path,
                core.target,
            )

    def _report(self, status: Status, call: Any = None, next_now: bool = True) -> None:
        """One attempt that is not the RPC's last (its pick, and the grpcio
        ``call`` when it reached the subchannel) reaches the LB policy, and
        its A66 metrics: its trailers to the pick's ``on_call_trailers``
        first (A51 per-call ORCA; read only when a policy asked), then
        ``on_call_done``.  :meth:`finish` does the same for the last one.
        ``next_now``: the next attempt starts now (the pick is made again at
        once); otherwise at the first pick after the retry backoff."""
        if self._on_call_trailers is not None:
            self._trailers_to_policy(call)
        metrics = self.metrics
        if metrics is not None:
            if next_now:
                if not metrics.attempt_ended(status, self._attempt_labels, False):
                    self.metrics = None  # turned off meanwhile
            else:
                metrics.attempt_failed(status, self._attempt_labels)
                if _metrics.RECORDER is None:
                    self.metrics = None
            self._attempt_labels = None  # the next attempt's pick sets its own
        if self._on_call_done is not None:
            self._call_done(status)

    def _call_done(self, status: Status) -> None:
        """The attempt's end to its pick's ``on_call_done``, once (called
        only when there is one: most RPCs have none and pay no frame)."""
        done = self._on_call_done
        self._on_call_done = None
        if done is not None:
            try:
                done(status)
            except Exception:
                _log.exception("pyxds: on_call_done raised")

    def _trailers_to_policy(self, call: Any) -> None:
        """The attempt's trailers to its pick's ``on_call_trailers`` (A51
        per-call ORCA), once, when the attempt's grpcio ``call`` reached the
        subchannel and ended with trailers."""
        trailers_hook = self._on_call_trailers
        self._on_call_trailers = None
        if trailers_hook is not None and call is not None:
            try:
                trailers = trailing_metadata_of(call)
                if trailers:
                    trailers_hook(trailers)
            except Exception:
                _log.exception("pyxds: on_call_trailers raised")
