"""The channel's control side, shared by the sync and asyncio channels.

Theory of operation
-------------------

One :class:`ChannelCore` per pyxds channel.  It owns the channel's
:class:`~pyxds.serializer.WorkSerializer`, its clock (a ``RealClock`` whose
timers run on the serializer), the resolver (chosen by the target's scheme),
the top-level LB policy (a ``ChildPolicyHandler`` fed the resolver result's
``lb_policy``, pick_first by default) and the subchannel pool.

Published state, read lock-free by the RPC path (reference swaps, never
mutated in place): the current ``ConfigSelector`` and ``Picker``, the status
to fail RPCs with while there is no config at all, and a *generation*
counter.  Every publication (a new picker, a new config selector, a resolver
error, idle, close) bumps the generation and wakes every queued RPC, so a
queued RPC re-picks on every new picker AND every new config (TRAPS.md: a
wait_for_ready RPC queued while nothing was cached waited out its whole
deadline in C-core).  Waiters register with the generation they saw; a
registration that comes after a publication fires at once, so no wake-up is
lost and nothing busy-waits.

A31 ordering: on a resolver result the LB policy is updated first (it
publishes a picker that knows every new cluster before ``update`` returns),
then the config selector is swapped, then queued RPCs are woken.

Per RPC (:meth:`ChannelCore.try_pick`): once a config selector exists, call
it once (A31: "invoked once at the beginning of every RPC"; a status fails
the RPC), cap the deadline at its timeout, then pick from the current
picker on every attempt.  ``PickComplete`` -> send on the picked
subchannel's grpcio channel; ``PickQueue`` -> wait for the next publication;
``PickFail`` -> fail, unless wait_for_ready (then wait); ``PickDrop`` -> fail.

Idle (A62 ``IDLE_TIMEOUT``, ``grpc.client_idle_timeout_ms``, default 30
min): the channel starts IDLE (nothing resolved, nothing connected); the
first RPC (or ``subscribe(try_to_connect=True)``) starts the resolver.  A
timer checks for RPC activity; after a full timeout with no RPC in flight
and none started, the LB policy and resolver are shut down (their
subchannels close) and the channel is IDLE again until the next RPC.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import grpc

from pyxds import metrics as _metrics
from pyxds.channel import lifecycle
from pyxds.channel.retry import PREVIOUS_ATTEMPTS_KEY, RetryState
from pyxds.channel.subchannel import (
    ChannelSubchannel,
    SubchannelCore,
    Transport,
    TransportFactory,
    core_of,
)
from pyxds.channel.subchannel_pool import SubchannelPool
from pyxds.clock import Clock, RealClock, Timer
from pyxds.lb.api import (
    ATTEMPT_NOT_STARTED,
    OK_STATUS,
    ConnectivityState,
    FailPicker,
    Helper,
    PickArgs,
    PickComplete,
    PickDrop,
    Picker,
    PickFail,
    QueuePicker,
    ResolverUpdate,
    Status,
)
from pyxds.lb.child_handler import ChildPolicyHandler
from pyxds.lb.registry import select_policy
from pyxds.resolver import registry as resolver_registry
from pyxds.resolver.api import (
    CallConfig,
    ConfigSelector,
    DefaultConfigSelector,
    Resolver,
    ResolverArgs,
    ResolverResult,
)
from pyxds.resolver.http_filters import FilterVerdict, run_chain
from pyxds.resolver.retry_policy import RetryThrottle
from pyxds.resolver.service_config import MethodConfigSelector, ServiceConfig
from pyxds.resolver.static_resolver import lb_selection_from_options
from pyxds.security.credentials import xds_info
from pyxds.serializer import WorkSerializer
from pyxds.xds.bootstrap import BootstrapSource

_log = logging.getLogger(__name__)

#: A62: "A default value of 30 minutes is recommended."
DEFAULT_IDLE_TIMEOUT = 30 * 60.0
_MAX_REROUTES = 2
DEADLINE_EXCEEDED = Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
#: a unary call's deadline as C-core words it on a channel without its retry
#: filter (the subchannels' grpcio channels have retries off)
_STREAM_REMOVED_DEADLINE = Status(
    grpc.StatusCode.DEADLINE_EXCEEDED, "Stream removed (Deadline Exceeded)"
)


def unary_deadline_status(status: Status) -> Status:
    """``status`` of a unary-response call as grpcio's own channel words it:
    its deadline is DEADLINE_EXCEEDED "Deadline Exceeded" (sync, future and
    aio calls share this one rule; streams keep C-core's words, as grpcio)."""
    return DEADLINE_EXCEEDED if status == _STREAM_REMOVED_DEADLINE else status


_OK = grpc.StatusCode.OK
CHANNEL_CLOSED = Status(grpc.StatusCode.CANCELLED, "Channel closed!")
#: grpcio's ValueError text for an RPC invoked on a closed sync channel
CLOSED_CHANNEL_MESSAGE = "Cannot invoke RPC on closed channel!"
CLOSED_CHANNEL_MESSAGE_ASYNC = "Cannot invoke RPC: Channel closed!"

_TO_GRPC = {
    ConnectivityState.IDLE: grpc.ChannelConnectivity.IDLE,
    ConnectivityState.CONNECTING: grpc.ChannelConnectivity.CONNECTING,
    ConnectivityState.READY: grpc.ChannelConnectivity.READY,
    ConnectivityState.TRANSIENT_FAILURE: grpc.ChannelConnectivity.TRANSIENT_FAILURE,
    ConnectivityState.SHUTDOWN: grpc.ChannelConnectivity.SHUTDOWN,
}


def _attempt_started(core: ChannelCore, path: str) -> float:
    """A66 ``grpc.client.attempt.started``; returns the attempt's start time."""
    _metrics.add(
        "grpc.client.attempt.started",
        1,
        {"grpc.method": path.lstrip("/"), "grpc.target": core.target},
    )
    return time.perf_counter()


def _attempt_ended(rpc: Rpc, status: Status) -> float | None:
    """A66 ``grpc.client.attempt.duration`` and the attempt's message sizes;
    the next attempt's start unless the RPC ended."""
    labels = {
        "grpc.method": rpc.path.lstrip("/"),
        "grpc.target": rpc._core.target,
        "grpc.status": status.code.name,
    }
    if rpc.attempt_labels is not None:
        # A78: the optional labels the picker set (grpc.lb.locality); the
        # recorder emits those the user enabled
        labels.update(rpc.attempt_labels)
    assert rpc._attempt_start is not None
    _metrics.record(
        "grpc.client.attempt.duration", time.perf_counter() - rpc._attempt_start, labels
    )
    sizes = rpc.sizes
    if sizes is not None:
        _metrics.record("grpc.client.attempt.sent_total_compressed_message_size", sizes[0], labels)
        _metrics.record("grpc.client.attempt.rcvd_total_compressed_message_size", sizes[1], labels)
    if rpc._finished or _metrics.RECORDER is None:
        rpc.sizes = None
        return None
    rpc.sizes = [0, 0]
    return _attempt_started(rpc._core, rpc.path)


def _call_ended(rpc: Rpc, status: Status) -> None:
    """A66 ``grpc.client.call.duration``: from the call's start to its end."""
    assert rpc._call_start is not None
    _metrics.record(
        "grpc.client.call.duration",
        time.perf_counter() - rpc._call_start,
        {
            "grpc.method": rpc.path.lstrip("/"),
            "grpc.target": rpc._core.target,
            "grpc.status": status.code.name,
        },
    )


class Rpc:
    """Per-RPC bookkeeping for the pick: the CallConfig (once chosen), the
    deadline, and the exactly-once completion hooks."""

    __slots__ = (
        "path",
        "metadata",
        "wait_for_ready",
        "deadline",
        "call_config",
        "selector",
        "reselects",
        "on_call_done",
        "picked_by",
        "stale_picker",
        "on_call_trailers",
        "attempt_labels",
        "pick_metadata",
        "send_metadata",
        "retry",
        "fault",
        "hold_until",
        "wfr_explicit",
        "sizes",
        "_finished",
        "_core",
        "_attempt_start",
        "_call_start",
    )

    def __init__(
        self,
        core: ChannelCore,
        path: str,
        metadata: Sequence[tuple[str, Any]] | None,
        timeout: float | None,
        wait_for_ready: bool | None,
    ) -> None:
        self._core = core
        self.path = path
        self.metadata = tuple(metadata) if metadata else ()
        #: the metadata the next attempt sends (the user's, plus
        #: ``grpc-previous-rpc-attempts`` on a retry)
        self.send_metadata = metadata
        #: the retry decision, made on the first failed attempt
        self.retry: RetryState | None = None
        #: the A39 filters' verdict (A33 fault) still to carry out
        self.fault: FilterVerdict | None = None
        self.hold_until: float | None = None
        self.wait_for_ready = bool(wait_for_ready)
        self.wfr_explicit = wait_for_ready is not None
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.call_config: CallConfig | None = None
        self.selector: ConfigSelector | None = None
        self.reselects = 0
        self.on_call_done: Callable[[Status], None] | None = None
        self.picked_by: Picker | None = None  # the picker of the last completed pick
        self.stale_picker: Picker | None = None  # never pick with it again
        self.on_call_trailers: Callable[[Sequence[tuple[str, Any]]], None] | None = None
        #: the last pick's ``PickComplete.attempt_labels`` (A78), for its attempt's metrics
        self.attempt_labels: Mapping[str, str] | None = None
        #: the last pick's ``PickComplete.metadata``: headers its attempt adds
        self.pick_metadata: tuple[tuple[str, str], ...] | None = None
        self._finished = False
        # A66 per-attempt metrics: the attempt's start, None while metrics are off.
        self._attempt_start = None if _metrics.RECORDER is None else _attempt_started(core, path)
        self._call_start = self._attempt_start  # the first attempt starts with the call
        #: A66 message sizes of the current attempt, [sent, received] bytes
        #: (None while metrics are off): :func:`counting` fills it
        self.sizes: list[int] | None = None if self._attempt_start is None else [0, 0]

    def remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    def attempt_metadata(self) -> Any:
        """The metadata the attempt sends: ``send_metadata`` plus the pick's
        headers (``PickComplete.metadata``), which replace the RPC's values
        of their keys."""
        extra = self.pick_metadata
        base = self.send_metadata
        if extra is None:
            return base
        keys = {k for k, _ in extra}
        return (*(kv for kv in (base or ()) if kv[0] not in keys), *extra)

    def attempt_done(self, status: Status, call: Any = None) -> None:
        """The subchannel call of one pick ended (report to the LB policy).

        ``call``: the finished grpcio call (sync or aio call object, or the
        ``grpc.RpcError`` it raised) when the attempt reached the
        subchannel.  The pick's ``on_call_trailers`` gets its trailing
        metadata first (A51 per-call ORCA), then ``on_call_done`` the
        status.  This is the one place the channel hands trailers to the LB
        policy; the trailers are read only when a policy asked for them."""
        trailers_hook, self.on_call_trailers = self.on_call_trailers, None
        if trailers_hook is not None and call is not None:
            try:
                trailers = trailing_metadata_of(call)
                if trailers:
                    trailers_hook(trailers)
            except Exception:
                _log.exception("pyxds: on_call_trailers raised")
        done, self.on_call_done = self.on_call_done, None
        if self._attempt_start is not None:
            self._attempt_start = _attempt_ended(self, status)
        self.attempt_labels = None
        if done is not None:
            try:
                done(status)
            except Exception:
                _log.exception("pyxds: on_call_done raised")

    def retry_after(
        self,
        status: Status,
        trailing_metadata: Sequence[tuple[str, Any]] | None = None,
        committed: bool = False,
        pick_failed: bool = False,
    ) -> float | None:
        """One attempt ended with ``status`` (already reported through
        :meth:`attempt_done`; ``pick_failed``: its pick failed, nothing was
        sent): seconds to wait before the next attempt (a fresh pick), or
        None to end the RPC with ``status``.  The policy is
        the one of this RPC's CallConfig, chosen once (A31), and the wait
        never goes past the deadline (the next attempt then fails with
        DEADLINE_EXCEEDED)."""
        state = self.retry
        if state is None:
            if not self._core.retries_enabled:
                return None
            config = self.call_config
            policy = config.retry_policy if config is not None else None
            state = self.retry = RetryState(policy, self._core.retry_throttle, self._core.random)
        delay = state.on_attempt_end(status, trailing_metadata, committed, pick_failed)
        if delay is None:
            return None
        if state.wait_for_new_picker:
            # A6 transparent retry of an attempt that never left the client:
            # the picker that chose its lost connection is not used again
            self.stale_picker = self.picked_by
        previous = state.previous_attempts
        if previous:
            self.send_metadata = (*self.metadata, (PREVIOUS_ATTEMPTS_KEY, str(previous)))
        if self.deadline is not None:
            delay = max(0.0, min(delay, self.deadline - time.monotonic()))
        return delay

    def release_config(self) -> None:
        """Forget the CallConfig (committing it) so the RPC is routed again."""
        config, self.call_config = self.call_config, None
        self.selector = None
        if config is not None and config.on_committed is not None:
            try:
                config.on_committed()
            except Exception:
                _log.exception("pyxds: on_committed raised")

    def finish(self, status: Status, call: Any = None) -> None:
        """The RPC ended: report the last attempt (``call``: its finished
        grpcio call, see :meth:`attempt_done`), commit the CallConfig once."""
        if self._finished:
            return
        self._finished = True
        fault = self.fault
        if fault is not None and fault.done is not None:
            fault.done()  # e.g. the deadline came during a fault delay
        self.attempt_done(status, call)
        if status.code is _OK and self._core.retry_throttle is not None:
            self._core.retry_throttle.record_success()
        if self._call_start is not None:
            _call_ended(self, status)
        config = self.call_config
        if config is not None and config.on_committed is not None:
            try:
                config.on_committed()
            except Exception:
                _log.exception("pyxds: on_committed raised")
        self._core.call_ended()


def call_metadata(call: Any) -> tuple[Any, Any]:
    """(initial, trailing) metadata of a finished grpcio call (a sync call
    object or the ``grpc.RpcError`` it raised, or a ``grpc.aio`` call), read
    without blocking or awaiting; None for what cannot be read.  A sync
    rendezvous' ``initial_metadata()`` waits for its receive-initial-metadata
    batch, which can complete after the status (on the very thread running
    the terminal callback), and a grpc.aio call's readers are coroutines: both
    keep what arrived on their state (the rendezvous' ``_state``, the aio
    call's Cython call), which is read directly."""
    cython_call = getattr(call, "_cython_call", None)
    if cython_call is not None:
        raw = getattr(cython_call, "_status", None)
        trailing = raw.trailing_metadata() if raw is not None else None
        return getattr(cython_call, "_initial_metadata", None), trailing
    state = getattr(call, "_state", None)
    if state is not None and hasattr(state, "initial_metadata"):
        return state.initial_metadata, getattr(state, "trailing_metadata", None)
    return _read(call, "initial_metadata"), _read(call, "trailing_metadata")


def _read(call: Any, name: str) -> Any:
    reader = getattr(call, name, None)
    if reader is None:
        return None
    try:
        value = reader()
    except Exception:
        return None
    if hasattr(value, "close") and hasattr(value, "send"):  # a coroutine
        value.close()
        return None
    return value


def trailing_metadata_of(call: Any) -> tuple[tuple[str, Any], ...]:
    """The trailing metadata of a finished grpcio call as ``(key, value)``
    pairs (:func:`call_metadata`); empty when nothing can be read."""
    metadata = call_metadata(call)[1]
    if not metadata:
        return ()
    return tuple((item[0], item[1]) for item in metadata)


class ChannelHelper(Helper):
    """The top-level LB policy's helper.  Stale after idle/close: a policy
    that was shut down can no longer publish or create subchannels."""

    def __init__(self, core: ChannelCore, generation: int) -> None:
        self._core = core
        self._generation = generation
        self.clock = core.clock
        self.random = core.random
        self.channel_target = core.target
        self.channel_authority = core.default_authority

    def create_route_lookup_channel(self, target: str, service_config: str | None) -> Any:
        """A channel to a Route Lookup Service (``rls_experimental``):
        :class:`pyxds.channel.rls_channel.GrpcRouteLookupChannel`."""
        from pyxds.channel.rls_channel import GrpcRouteLookupChannel

        core = self._core
        return GrpcRouteLookupChannel(
            target,
            core.lookup_credentials,
            core.default_authority,
            service_config,
            core.serializer.run,
        )

    def _live(self) -> bool:
        return self._core._lb_generation == self._generation and not self._core.closed

    def create_subchannel(self, address: str, attributes: Mapping[str, Any]) -> ChannelSubchannel:
        return self._core.pool.create(address, attributes)

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self._live():
            self._core._on_lb_state(state, status, picker)

    def request_reresolution(self) -> None:
        if self._live() and self._core.resolver is not None:
            self._core.resolver.request_reresolution()


def parse_target(target: str) -> tuple[str, str]:
    """(scheme, authority-for-data-plane).  A target without a scheme is dns."""
    if "://" in target:
        scheme = target.split("://", 1)[0].lower()
        path = urlsplit(target).path.lstrip("/")
        return scheme, path
    head = target.split(":", 1)[0].lower()
    if head in ("ipv4", "ipv6", "unix"):
        return head, target.split(":", 1)[1]
    if head not in ("", "dns") and ":" in target and resolver_registry.get(head) is not None:
        # C-core: a target that parses as a URI of a registered scheme is
        # that scheme's even without "//" (``xds:service``); anything else
        # (``host:port``) is dns
        return head, target.split(":", 1)[1]
    return "dns", target


def build_resolver(scheme: str, target: str, args: ResolverArgs) -> Resolver:
    """The resolver registered for ``scheme`` in :mod:`pyxds.resolver.registry`
    (``xds`` and the built-in static/ipv4/ipv6/dns ones, or a user's).  A bare
    ``host:port`` target is ``dns:///host:port``."""
    if scheme == "dns" and "://" not in target:
        args = dataclasses.replace(args, target="dns:///" + target)
    factory = resolver_registry.get(scheme)
    if factory is None:
        raise ValueError(f"pyxds: no resolver for target {target!r} (scheme {scheme!r})")
    build = getattr(factory, "build", None)
    return build(args) if build is not None else factory(args)


class ChannelCore:
    """See the module docstring."""

    def __init__(
        self,
        target: str,
        make_transport: TransportFactory,
        credentials: grpc.ChannelCredentials | None = None,
        bootstrap: BootstrapSource = None,
        options: Sequence[tuple[str, Any]] | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        service_config: ServiceConfig | None = None,
    ) -> None:
        self.target = target
        self.scheme, self.authority = parse_target(target)
        self.options = tuple(options or ())
        self.bootstrap = bootstrap
        self.serializer = WorkSerializer()
        self.clock = clock or RealClock(dispatch=self.serializer.run)
        self.random = rng or random.Random()
        #: the channel's own service config (``service_config=`` or the
        #: ``grpc.service_config`` option); for xds: targets the xDS config wins
        self.service_config = service_config if self.scheme != "xds" else None
        #: A6 retry throttling of this channel (service config), or None
        self.retry_throttle: RetryThrottle | None = (
            self.service_config.retry_throttle if self.service_config is not None else None
        )
        #: deadlines of queued non-blocking RPCs (not on the serializer)
        self.deadline_clock: Clock = clock or _DEADLINE_CLOCK
        self.pool = SubchannelPool(
            make_transport, self.serializer, self.clock, self.random, credentials, self.options
        )
        opts = dict(self.options)
        #: the channel's authority (``grpc.default_authority`` when set)
        self.default_authority = str(opts.get("grpc.default_authority") or self.authority)
        #: credentials of channels the LB policies make (RLS): the channel's
        #: own, the fallback ones of xDS credentials
        xds = xds_info(credentials)
        self.lookup_credentials = xds.fallback if xds is not None else credentials
        self.idle_timeout = float(
            opts.get("grpc.client_idle_timeout_ms", DEFAULT_IDLE_TIMEOUT * 1000)
        )
        self.idle_timeout = self.idle_timeout / 1000 if self.idle_timeout > 0 else 0.0
        #: C-core's channel args: ``grpc.enable_retries`` (0: no retries at
        #: all, transparent ones included, A6 "Disabling Retries") and
        #: ``grpc.per_rpc_retry_buffer_size`` (bytes of requests kept for a retry)
        self.retries_enabled = bool(int(opts.get("grpc.enable_retries", 1)))
        self.retry_buffer_size = int(opts.get("grpc.per_rpc_retry_buffer_size", 256 * 1024))
        # -- published, read lock-free by RPCs ---------------------------
        self.selector: ConfigSelector | None = None
        self.picker: Picker = QueuePicker()
        self.no_config_status: Status | None = None
        self.generation = 0
        self.applying = False  # a resolver result is being applied
        self.idle = True
        self.closed = False
        # -- serializer-owned --------------------------------------------
        self.resolver: Resolver | None = None
        self.lb: ChildPolicyHandler | None = None
        self._lb_generation = 0
        self._lb_selection: Any = None
        self.state = ConnectivityState.IDLE
        self.status = OK_STATUS
        self.last_result: ResolverResult | None = None
        self._idle_timer: Timer | None = None
        # -- waiters and activity (lock) ---------------------------------
        self._lock = threading.Lock()
        self._waiters: list[Callable[[], None]] = []
        self._active_calls = 0
        self._calls_started = 0
        self._idle_checked_started = 0
        self._state_watchers: list[Callable[[ConnectivityState], None]] = []
        lifecycle.track(self)  # closed at interpreter exit if never closed

    # ------------------------------------------------------------------
    # RPC side (any thread, never enters the serializer except to exit idle)
    # ------------------------------------------------------------------
    def call_started(self) -> None:
        with self._lock:
            self._active_calls += 1
            self._calls_started += 1
        if self.idle and not self.closed:
            self.serializer.run(self._exit_idle)

    def call_ended(self) -> None:
        with self._lock:
            self._active_calls -= 1

    def new_rpc(
        self,
        path: str,
        metadata: Sequence[tuple[str, Any]] | None,
        timeout: float | None,
        wait_for_ready: bool | None,
        blocking: bool = True,
    ) -> Rpc:
        """A new RPC's bookkeeping.  On a closed channel raises ValueError
        with grpcio's words (its sync channels raise it at invocation; its
        non-blocking calls, future() and streams, say it differently)."""
        if self.closed:
            raise ValueError(CLOSED_CHANNEL_MESSAGE if blocking else CLOSED_CHANNEL_MESSAGE_ASYNC)
        rpc = Rpc(self, path, metadata, timeout, wait_for_ready)
        self.call_started()
        return rpc

    def try_pick(self, rpc: Rpc) -> SubchannelCore | Status | float | None:
        """One pick attempt: a core to send on, a Status to fail with, None
        to wait for the next publication, or a float: seconds to wait (an
        A33 fault delay, or the retry backoff after a failed pick; never
        past the deadline) before trying again."""
        if self.closed:
            return CHANNEL_CLOSED
        remaining = rpc.remaining() if rpc.retry is not None else None
        if remaining is not None and remaining <= 0:
            # a retry whose backoff ran into the deadline: no pick for it
            return DEADLINE_EXCEEDED
        config = rpc.call_config
        if config is None:
            selector = self.selector
            if selector is None:
                status = self.no_config_status
                if status is not None and not rpc.wait_for_ready:
                    return status
                return None
            try:
                config = selector.select(rpc.path, rpc.metadata)
            except Exception as err:  # a selector bug must not escape as a crash
                _log.exception("pyxds: config selector raised")
                return Status(grpc.StatusCode.INTERNAL, f"config selector failed: {err}")
            if config.status is not None and not config.status.ok:
                if config.no_config and rpc.wait_for_ready:
                    return None  # no usable config: wait for the next one
                rpc.call_config = config
                rpc.selector = selector
                return config.status
            rpc.call_config = config
            rpc.selector = selector
            if config.wait_for_ready is not None and not rpc.wfr_explicit:
                rpc.wait_for_ready = config.wait_for_ready
            if config.timeout is not None and config.timeout > 0:
                cap = time.monotonic() + config.timeout
                if rpc.deadline is None or cap < rpc.deadline:
                    rpc.deadline = cap
            if config.filters:
                rpc.fault = run_chain(config.filters, rpc.metadata, self.random)
        if rpc.fault is not None:
            held = self._carry_out_fault(rpc, rpc.fault)
            if held is not None:
                return held
        picker = self.picker
        if picker is rpc.stale_picker:
            return None  # it chose a lost connection for this RPC: wait for the next
        try:
            result = picker.pick(PickArgs(rpc.path, rpc.metadata, config.call_attributes))
        except Exception as err:
            _log.exception("pyxds: picker raised")
            return Status(grpc.StatusCode.INTERNAL, f"picker failed: {err}")
        if isinstance(result, PickComplete):
            core = core_of(result.subchannel)
            if core is None or core.transport is None or core.transport.closed:
                # not one of ours, or lost its connection since the picker
                # was built: the next picker will say more.
                if result.on_call_done is not None:
                    result.on_call_done(ATTEMPT_NOT_STARTED)
                return None
            rpc.on_call_done = result.on_call_done
            rpc.picked_by = picker
            rpc.on_call_trailers = result.on_call_trailers
            rpc.attempt_labels = result.attempt_labels
            rpc.pick_metadata = result.metadata
            return core
        if isinstance(result, PickFail):
            if rpc.wait_for_ready:
                return None
            outcome = self._reroute(rpc, result.status)
            if isinstance(outcome, Status) and config.retry_policy is not None:
                # A6: a pick that fails (not a drop) is handled by the policy
                delay = rpc.retry_after(outcome, pick_failed=True)
                if delay is not None:
                    return delay
            return outcome
        if isinstance(result, PickDrop):
            return self._reroute(rpc, result.status)
        return None

    @staticmethod
    def _carry_out_fault(rpc: Rpc, fault: FilterVerdict) -> Status | float | None:
        """The filters' verdict before the pick (A33: delay, then abort, both
        before anything is sent): seconds still to wait (never past the
        deadline), the abort status (DEADLINE_EXCEEDED when the delay ran
        into the deadline), or None to go on to the pick."""
        outcome = fault.abort
        if fault.delay > 0:
            now = time.monotonic()
            if rpc.hold_until is None:
                rpc.hold_until = now + fault.delay
            left = rpc.hold_until - now
            if left > 0:
                to_deadline = None if rpc.deadline is None else rpc.deadline - now
                if to_deadline is None or to_deadline > left:
                    return left
                if to_deadline > 0:
                    return to_deadline  # then DEADLINE_EXCEEDED
                outcome = DEADLINE_EXCEEDED
        rpc.fault = None
        if fault.done is not None:
            fault.done()
        return outcome

    def _reroute(self, rpc: Rpc, status: Status) -> SubchannelCore | Status | float | None:
        """A failed pick of an RPC routed by a config that is being replaced
        (the LB tree already dropped the old route's cluster, the new config
        selector is not published yet) is routed again by the new config
        instead of failing: a route switch fails no RPC."""
        if rpc.reselects >= _MAX_REROUTES:
            return status
        if self.applying:
            rpc.reselects += 1
            rpc.release_config()
            return None  # the publication that ends the update wakes it
        if rpc.selector is not None and rpc.selector is not self.selector:
            rpc.reselects += 1
            rpc.release_config()
            return self.try_pick(rpc)
        return status

    def add_waiter(self, generation: int, fn: Callable[[], None]) -> bool:
        """Call ``fn`` at the next publication after ``generation``.  False
        (and nothing registered) when one happened already: retry now."""
        with self._lock:
            if self.generation != generation:
                return False
            self._waiters.append(fn)
            return True

    def remove_waiter(self, fn: Callable[[], None]) -> None:
        with self._lock:
            try:
                self._waiters.remove(fn)
            except ValueError:
                pass

    def pick_blocking(self, rpc: Rpc) -> SubchannelCore | Status:
        """Pick for a thread that may block: waits (bounded by the deadline)
        on an Event per wait, woken by publications."""
        while True:
            generation = self.generation
            outcome = self.try_pick(rpc)
            if outcome is not None:
                if not isinstance(outcome, float):
                    return outcome
                time.sleep(outcome)
                continue
            remaining = rpc.remaining()
            if remaining is not None and remaining <= 0:
                return DEADLINE_EXCEEDED
            event = threading.Event()
            if not self.add_waiter(generation, event.set):
                continue
            if not event.wait(remaining):
                self.remove_waiter(event.set)
                return DEADLINE_EXCEEDED

    def pick_async(
        self,
        rpc: Rpc,
        on_done: Callable[[SubchannelCore | Status], None],
    ) -> Callable[[], None]:
        """Pick without blocking: ``on_done`` runs (on this thread, or on the
        publishing thread later, or the timer thread at the deadline) at most
        once with a core or a Status.  Returns a cancel function (after it,
        ``on_done`` is not called)."""
        state: dict[str, Any] = {"done": False, "timer": None, "hold": None}
        lock = threading.Lock()

        def complete(outcome: SubchannelCore | Status) -> None:
            with lock:
                if state["done"]:
                    return
                state["done"] = True
                timer = state["timer"]
            if timer is not None:
                timer.cancel()
            on_done(outcome)

        def attempt() -> None:
            while True:
                with lock:
                    if state["done"]:
                        return
                generation = self.generation
                outcome = self.try_pick(rpc)
                if outcome is not None:
                    if isinstance(outcome, float):  # a fault delay: try again after it
                        state["hold"] = self.deadline_clock.call_later(outcome, attempt)
                        return
                    complete(outcome)
                    return
                if self.add_waiter(generation, attempt):
                    return

        def expire() -> None:
            self.remove_waiter(attempt)
            complete(DEADLINE_EXCEEDED)

        def cancel() -> None:
            with lock:
                state["done"] = True
                timer = state["timer"]
                hold = state["hold"]
            if timer is not None:
                timer.cancel()
            if hold is not None:
                hold.cancel()
            self.remove_waiter(attempt)

        remaining = rpc.remaining()
        if remaining is not None:
            if remaining <= 0:
                complete(DEADLINE_EXCEEDED)
                return cancel
            state["timer"] = self.deadline_clock.call_later(remaining, expire)
        attempt()
        return cancel

    # ------------------------------------------------------------------
    # Publication (serializer)
    # ------------------------------------------------------------------
    def _publish(self) -> None:
        if self.applying:
            return  # _on_result publishes once at its end
        with self._lock:
            self.generation += 1
            waiters, self._waiters = self._waiters, []
        for fn in waiters:
            try:
                fn()
            except Exception:
                _log.exception("pyxds: queued RPC wake-up raised")

    def _set_state(self, state: ConnectivityState, status: Status) -> None:
        changed = state is not self.state
        self.state, self.status = state, status
        if changed:
            self._notify_state(state)

    def _on_lb_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self.picker = picker
        self._set_state(state, status)
        self._publish()

    # ------------------------------------------------------------------
    # Resolver results (serializer)
    # ------------------------------------------------------------------
    def _on_result(self, result: ResolverResult, resolver: Resolver) -> None:
        if self.closed or resolver is not self.resolver:
            return
        self.applying = True
        try:
            self._apply_result(result)
        finally:
            # one publication for the whole result: the LB policy's new
            # picker and the new config selector wake queued RPCs together
            self.applying = False
            self._publish()

    def _apply_result(self, result: ResolverResult) -> None:
        self.last_result = result
        if result.service_config_error is not None and self.selector is None:
            # Never had a config: fail (non-wait_for_ready) RPCs with it.
            self.no_config_status = result.service_config_error
            if self.lb is None:
                self.picker = FailPicker(result.service_config_error)
                self._set_state(ConnectivityState.TRANSIENT_FAILURE, result.service_config_error)
            self._publish()
            return
        if isinstance(result.endpoints, Status) and result.lb_policy is None and self.lb is None:
            self.no_config_status = result.endpoints
            if result.config_selector is not None:
                self.selector = result.config_selector
            self.picker = FailPicker(result.endpoints)
            self._set_state(ConnectivityState.TRANSIENT_FAILURE, result.endpoints)
            self._publish()
            return
        if result.service_config_error is None and result.lb_policy is not None:
            self._lb_selection = result.lb_policy
        if self._lb_selection is None:
            self._lb_selection = self._default_selection()
        if self.lb is None:
            self._lb_generation += 1
            self.lb = ChildPolicyHandler(ChannelHelper(self, self._lb_generation))
        if isinstance(result.endpoints, Status) and result.lb_policy is None:
            self.lb.resolver_error(result.endpoints)
        else:
            try:
                rejected = self.lb.update(
                    ResolverUpdate(
                        result.endpoints,
                        self._lb_selection,
                        result.attributes,
                        result.resolution_note,
                    )
                )
            except Exception as err:
                _log.exception("pyxds: LB policy update raised")
                rejected = Status(grpc.StatusCode.UNAVAILABLE, f"LB policy update failed: {err}")
            if rejected is not None:
                _log.info("pyxds: %s: LB policy rejected the update: %s", self.target, rejected)
        if result.service_config_error is None and result.config_selector is not None:
            self.selector = self._with_method_config(result.config_selector)
        elif self.selector is None:
            self.selector = self._with_method_config(DefaultConfigSelector())
        self.no_config_status = None
        self._publish()

    def _with_method_config(self, selector: ConfigSelector) -> ConfigSelector:
        """The resolver's selector, plus the channel's methodConfig (a
        non-xDS target with a service config that has one)."""
        config = self.service_config
        if config is None or not config.methods:
            return selector
        return MethodConfigSelector(config, selector)

    def _default_selection(self) -> Any:
        """The channel's LB policy when the resolver names none: the
        channel options' service config / ``grpc.lb_policy_name``, else
        pick_first (gRPC's default service config rule)."""
        selection = lb_selection_from_options(self.options)
        if isinstance(selection, Status):
            _log.warning("pyxds: %s: %s; using pick_first", self.target, selection.details)
            return select_policy([{"pick_first": {}}])
        return selection

    # ------------------------------------------------------------------
    # Idle (serializer)
    # ------------------------------------------------------------------
    def exit_idle(self) -> None:
        """Leave IDLE now (subscribe(try_to_connect=True))."""
        if self.idle and not self.closed:
            self.serializer.run(self._exit_idle)
        elif self.lb is not None:
            self.serializer.run(lambda: self.lb.exit_idle() if self.lb is not None else None)

    def _exit_idle(self) -> None:
        if not self.idle or self.closed:
            return
        self.idle = False
        self._set_state(ConnectivityState.CONNECTING, OK_STATUS)
        holder: list[Resolver] = []

        def on_result(result: ResolverResult) -> None:
            if holder:
                self._on_result(result, holder[0])
            else:  # delivered inside start(): defer until holder is set
                self.serializer.run(lambda: self._on_result(result, holder[0]))

        args = ResolverArgs(
            target=self.target,
            authority=self.authority,
            serializer=self.serializer,
            clock=self.clock,
            random=self.random,
            on_result=on_result,
            bootstrap=self.bootstrap,
            options=dict(self.options),
        )
        try:
            resolver = build_resolver(self.scheme, self.target, args)
        except Exception as err:
            status = Status(grpc.StatusCode.UNAVAILABLE, f"cannot resolve {self.target}: {err}")
            self.no_config_status = status
            self.picker = FailPicker(status)
            self._set_state(ConnectivityState.TRANSIENT_FAILURE, status)
            self._publish()
            return
        holder.append(resolver)
        self.resolver = resolver
        try:
            resolver.start()
        except Exception as err:
            _log.exception("pyxds: resolver start failed")
            status = Status(grpc.StatusCode.UNAVAILABLE, f"resolver failed: {err}")
            self.no_config_status = status
            self._publish()
        self._arm_idle_timer(self.idle_timeout)

    def _arm_idle_timer(self, delay: float) -> None:
        if self.idle_timeout <= 0:
            return
        with self._lock:
            self._idle_checked_started = self._calls_started
        self._idle_timer = self.clock.call_later(delay, self._check_idle)

    def _check_idle(self) -> None:
        self._idle_timer = None
        if self.idle or self.closed:
            return
        with self._lock:
            busy = self._active_calls > 0 or self._calls_started != self._idle_checked_started
        if busy:
            self._arm_idle_timer(self.idle_timeout)
            return
        self._enter_idle()

    def _enter_idle(self) -> None:
        self._teardown()
        self.idle = True
        self.selector = None
        self.picker = QueuePicker()
        self.no_config_status = None
        self._set_state(ConnectivityState.IDLE, OK_STATUS)
        self._publish()

    def _teardown(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._lb_generation += 1
        lb, self.lb = self.lb, None
        resolver, self.resolver = self.resolver, None
        if lb is not None:
            try:
                lb.shutdown()
            except Exception:
                _log.exception("pyxds: LB shutdown raised")
        if resolver is not None:
            try:
                resolver.shutdown()
            except Exception:
                _log.exception("pyxds: resolver shutdown raised")

    # ------------------------------------------------------------------
    # Connectivity subscription, close, dump
    # ------------------------------------------------------------------
    def grpc_state(self) -> grpc.ChannelConnectivity:
        return _TO_GRPC[self.state]

    def add_state_watcher(self, fn: Callable[[ConnectivityState], None]) -> None:
        with self._lock:
            self._state_watchers.append(fn)

    def remove_state_watcher(self, fn: Callable[[ConnectivityState], None]) -> None:
        with self._lock:
            if fn in self._state_watchers:
                self._state_watchers.remove(fn)

    def _notify_state(self, state: ConnectivityState) -> None:
        with self._lock:
            watchers = list(self._state_watchers)
        for fn in watchers:
            try:
                fn(state)
            except Exception:
                _log.exception("pyxds: connectivity watcher raised")

    def close(self, wait: float = 0.0) -> None:
        """Close the channel.  ``wait`` > 0 (a user's ``close()``): return once
        every connection is closed, as grpcio's own ``close()`` does, so a
        server stopped right after sees no live client (no GOAWAY noise);
        at most ``wait`` seconds, and never from inside the serializer."""
        if self.closed:
            return
        closing: list[Transport] = []
        closed = threading.Event()

        def go() -> None:
            closing.extend(self.pool.close())  # first: cancels RPCs in flight
            self._teardown()
            closing.extend(self.pool.close())
            self.picker = FailPicker(CHANNEL_CLOSED)
            self._set_state(ConnectivityState.SHUTDOWN, CHANNEL_CLOSED)
            self._publish()
            close_clock = getattr(self.clock, "close", None)
            if close_clock is not None:
                close_clock()
            closed.set()

        self.closed = True
        self.serializer.run(go)
        if wait <= 0 or self.serializer.in_serializer:
            return
        deadline = time.monotonic() + wait
        if closed.wait(wait):
            for transport in closing:
                if not transport.close_done.wait(max(0.0, deadline - time.monotonic())):
                    break


_DEADLINE_CLOCK = RealClock()
"""Deadline timers of queued non-blocking RPCs (run on the timer thread)."""
