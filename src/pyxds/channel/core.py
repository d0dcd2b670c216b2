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

Per RPC: :class:`pyxds.channel.rpc.Rpc` reads the published selector and
picker (its module docstring tells one RPC's story); it counts itself in
and out here (:meth:`ChannelCore.call_started`, :meth:`ChannelCore.call_ended`:
the idle timer's activity), and its adapters wait for publications here
(:meth:`ChannelCore.add_waiter`, :meth:`ChannelCore.wait_for_publication`).
The core never calls into an RPC.

Idle (A62 ``IDLE_TIMEOUT``, ``grpc.client_idle_timeout_ms``, default 30
min): the channel starts IDLE (nothing resolved, nothing connected); the
first RPC (or ``subscribe(try_to_connect=True)``) starts the resolver.  A
timer looks at the RPC counts every quarter timeout; after a full timeout
with no RPC in flight, none started and none ended (so one to 1.25
timeouts after the last RPC ended, as C-core's one timeout after it), the
LB policy and resolver are shut down (their subchannels close) and the
channel is IDLE again until the next RPC.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from pyxds._uri import urlsplit
from pyxds.channel import lifecycle
from pyxds.channel.subchannel import (
    ChannelSubchannel,
    Closing,
    TransportFactory,
)
from pyxds.channel.subchannel_pool import SubchannelPool
from pyxds.clock import Clock, RealClock, Timer, on_timer_thread
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    FailPicker,
    Helper,
    PickArgs,
    Picker,
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
from pyxds.resolver.api import Closing as ResolverClosing
from pyxds.resolver.retry_policy import RetryThrottle
from pyxds.resolver.service_config import (
    MethodConfigSelector,
    ServiceConfig,
    parse_service_config,
)
from pyxds.resolver.static_resolver import lb_selection_from_options
from pyxds.security.credentials import xds_info
from pyxds.serializer import WorkSerializer

_log = logging.getLogger(__name__)

#: A62: "A default value of 30 minutes is recommended."
DEFAULT_IDLE_TIMEOUT = 30 * 60.0
#: Looks of the idle timer per timeout.  C-core (its idle filter), grpc-go
#: (its idleness manager, from the last call's end) and grpc-java (from the
#: in-use count reaching zero) go idle one full timeout after the last RPC
#: ended; a look every quarter timeout does so 1-1.25 timeouts after it,
#: never before, with no clock read per RPC (the RPCs only count themselves).
IDLE_LOOKS = 4

_CLOSED = Status(grpc.StatusCode.CANCELLED, "Channel closed!")

_TO_GRPC = {
    ConnectivityState.IDLE: grpc.ChannelConnectivity.IDLE,
    ConnectivityState.CONNECTING: grpc.ChannelConnectivity.CONNECTING,
    ConnectivityState.READY: grpc.ChannelConnectivity.READY,
    ConnectivityState.TRANSIENT_FAILURE: grpc.ChannelConnectivity.TRANSIENT_FAILURE,
    ConnectivityState.SHUTDOWN: grpc.ChannelConnectivity.SHUTDOWN,
}


class ChannelHelper(Helper):
    """The top-level LB policy's helper.  Stale after idle/close: a policy
    that was shut down can no longer publish or create subchannels."""

    def __init__(self, core: ChannelCore, generation: int) -> None:
        self._core = core
        self._generation = generation
        self.clock = core.clock
        self.random = core.random
        self.channel_target = core.metrics_target
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
        subchannel = self._core.pool.create(address, attributes)
        if not self._live():
            # a policy the channel shut down (idle, close): C-core's helper
            # gives it no subchannel, grpc-java no connection; this one is
            # shut down already (never connects, holds nothing of the pool)
            subchannel.shutdown()
        return subchannel

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


def subchannel_authority(target: str) -> str | None:
    """The authority a channel for ``target`` gives its subchannels'
    grpcio channels (:func:`pyxds.channel.subchannel.subchannel_options`):
    C-core's default authority of the target (the path of a URI target,
    ``host:port`` of a dns one); None for ``unix:`` targets and pyxds's own
    ``static:`` address lists (no C-core scheme to follow: each subchannel
    keeps its address as authority, so TLS checks each backend against its
    own address, as before), whose subchannels keep grpcio's own."""
    scheme, authority = parse_target(target)
    if scheme.startswith("unix") or scheme == "static":
        return None
    return authority or None


def canonical_target(target: str) -> str:
    """A66's ``grpc.target``: "the form with the scheme included if the user
    didn't mention the scheme (``scheme://[authority]/path``)": a target
    that names its scheme as is, any other (``host:port``) as
    ``dns:///host:port``, C-core's default prefix (C++ and grpc-go record
    this form; grpcio's Python plugin records the target as given)."""
    if "://" in target:
        return target
    head = target.split(":", 1)[0].lower()
    if ":" in target and (
        head in ("dns", "ipv4", "ipv6", "unix") or resolver_registry.get(head) is not None
    ):
        return target
    return "dns:///" + target


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


def _lame_status(target: str, raw: Any, parsed: ServiceConfig | None) -> Status | None:
    """The status of every RPC on a channel whose ``grpc.service_config``
    option is not a valid service config, None when it is (or absent).
    C-core (grpcio 1.85) validates that option when it creates the channel,
    whatever the target (xds: too), and makes a lame channel when it fails:
    INVALID_ARGUMENT "Failed to create channel to '<target>':<why>"."""
    if raw is None or parsed is not None:
        return None
    try:
        parse_service_config(raw)
    except ValueError as err:
        return Status(
            grpc.StatusCode.INVALID_ARGUMENT, f"Failed to create channel to '{target}':{err}"
        )
    return None


def _health_service(config: ServiceConfig | None, options: Sequence[tuple[str, Any]]) -> str | None:
    """The service name the channel health checks for (A17), or None; the
    health check module loads only for a config that names it."""
    if config is None or not config.raw.get("healthCheckConfig"):
        return None
    from pyxds.channel.health_check import service_name

    return service_name(config.raw, options)


class _FailSelector(ConfigSelector):
    """Every RPC fails with one status (a lame channel)."""

    def __init__(self, status: Status) -> None:
        self._config = CallConfig(status=status)

    def select(self, path: str, metadata: Sequence[tuple[str, str | bytes]]) -> CallConfig:
        return self._config


class ChannelCore:
    """See the module docstring."""

    def __init__(
        self,
        target: str,
        make_transport: TransportFactory,
        credentials: grpc.ChannelCredentials | None = None,
        bootstrap: Any = None,
        options: Sequence[tuple[str, Any]] | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        service_config: ServiceConfig | None = None,
        defer: Callable[[Callable[[], None]], bool] | None = None,
    ) -> None:
        self.target = target
        #: the target in A66's canonical form: the ``grpc.target`` of metrics
        self.metrics_target = canonical_target(target)
        #: the paths of the multicallables made with ``_registered_method=True``
        #: (generated stubs): A66 metrics record their names, any other
        #: method as "other" (:class:`pyxds.channel.call_metrics.CallMetrics`)
        self.registered_methods: set[str] = set()
        self.scheme, self.authority = parse_target(target)
        self.options = tuple(options or ())
        self.bootstrap = bootstrap
        self.serializer = WorkSerializer()
        self.clock = clock or RealClock(dispatch=self.serializer.run, defer=defer)
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
            make_transport,
            self.serializer,
            self.clock,
            self.random,
            credentials,
            self.options,
            health_service=_health_service(self.service_config, self.options),
        )
        opts = dict(self.options)
        #: the channel's authority: ``grpc.default_authority`` when set, else
        #: ``grpc.ssl_target_name_override`` (C-core's channel creation makes
        #: the override the default authority), else the target's
        self.default_authority = str(
            opts.get("grpc.default_authority")
            or opts.get("grpc.ssl_target_name_override")
            or self.authority
        )
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
        #: set when the ``grpc.service_config`` option is not a valid service config
        self.lame_status = _lame_status(target, opts.get("grpc.service_config"), service_config)
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
        #: RPCs started and ended, counted without a lock (``next()`` of an
        #: ``itertools.count`` is one C call, atomic under the GIL): every RPC
        #: pays two such calls, the idle timer reads them now and then
        self._started = itertools.count(1)
        self._ended = itertools.count(1)
        self.count_started: Callable[[], int] = self._started.__next__
        self.count_ended: Callable[[], int] = self._ended.__next__
        #: the idle timer's last look: (RPCs started, RPCs ended), and how
        #: many looks in a row have seen nothing change since
        self._idle_counts = (0, 0)
        self._quiet_looks = 0
        #: the PickArgs of RPCs without metadata, shared per (path, id of the
        #: call attributes): see Rpc.pick (each value holds its attributes,
        #: so their id stays theirs while the entry lives)
        self.shared_pick_args: dict[tuple[str, int], PickArgs] = {}
        self._state_watchers: list[Callable[[ConnectivityState], None]] = []
        #: what resolver shutdowns started and finishes later (an XdsClient's
        #: close and its ADS connection; ResolverArgs.on_closing): close()
        #: waits for it (lock)
        self._resolver_closing: list[ResolverClosing] = []
        lifecycle.track(self)  # closed at interpreter exit if never closed

    # ------------------------------------------------------------------
    # RPC side (any thread, never enters the serializer except to exit idle)
    # ------------------------------------------------------------------
    def call_started(self) -> None:
        """An RPC (or ``subscribe(try_to_connect=True)``-like use) starts:
        counted, and the channel leaves idle.  An :class:`Rpc` counts itself
        with :attr:`count_started` and calls :meth:`exit_idle_for_rpc` only
        while idle."""
        self.count_started()
        if self.idle and not self.closed:
            self.serializer.run(self._exit_idle)

    def call_ended(self) -> None:
        self.count_ended()

    def exit_idle_for_rpc(self) -> None:
        if self.idle and not self.closed:
            self.serializer.run(self._exit_idle)

    @property
    def calls_started(self) -> int:
        return _count_of(self._started)

    @property
    def active_calls(self) -> int:
        """RPCs started and not ended yet."""
        return _count_of(self._started) - _count_of(self._ended)

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

    def wait_for_publication(self, generation: int, timeout: float | None) -> bool:
        """Block the calling thread until the next publication after
        ``generation`` (at once when there was one already); False when
        ``timeout`` seconds passed first."""
        event = threading.Event()
        if not self.add_waiter(generation, event.set):
            return True
        if event.wait(timeout):
            return True
        self.remove_waiter(event.set)
        return False

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
        if self.lame_status is not None:
            self._go_lame(self.lame_status)
            return
        self._set_state(ConnectivityState.CONNECTING, OK_STATUS)
        holder: list[Resolver] = []

        def on_result(result: ResolverResult) -> None:
            if holder:
                self._on_result(result, holder[0])
            else:  # delivered inside start(): defer until holder is set
                self.serializer.run(lambda: self._on_result(result, holder[0]))

        args = ResolverArgs(
            target=self.target,
            # the channel's default authority (``grpc.default_authority`` when
            # given): the xDS resolver picks its virtual host by it (A74 "a
            # virtual host matching the channel's default authority"; C-core)
            authority=self.default_authority,
            serializer=self.serializer,
            clock=self.clock,
            random=self.random,
            on_result=on_result,
            bootstrap=self.bootstrap,
            options=dict(self.options),
            on_closing=self._on_resolver_closing,
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
        self._idle_counts = (_count_of(self._started), _count_of(self._ended))
        self._quiet_looks = 0
        self._arm_idle_timer()

    def _go_lame(self, status: Status) -> None:
        """C-core's lame channel: no resolver, every RPC (wait_for_ready too)
        fails with ``status``, the channel stays in TRANSIENT_FAILURE."""
        self.selector = _FailSelector(status)
        self.picker = FailPicker(status)
        self._set_state(ConnectivityState.TRANSIENT_FAILURE, status)
        self._publish()

    def _arm_idle_timer(self) -> None:
        if self.idle_timeout <= 0:
            return
        self._idle_timer = self.clock.call_later(self.idle_timeout / IDLE_LOOKS, self._check_idle)

    def _check_idle(self) -> None:
        """One look of the idle timer: the channel goes idle at the
        :data:`IDLE_LOOKS`-th look in a row that saw no RPC running, none
        started and none ended since the look before."""
        self._idle_timer = None
        if self.idle or self.closed:
            return
        ended = _count_of(self._ended)  # first: started >= ended, whatever runs meanwhile
        counts = (_count_of(self._started), ended)
        if counts[0] != ended or counts != self._idle_counts:
            self._idle_counts = counts
            self._quiet_looks = 0
        else:
            self._quiet_looks += 1
            if self._quiet_looks >= IDLE_LOOKS:
                self._enter_idle()
                return
        self._arm_idle_timer()

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

    def _on_resolver_closing(self, closing: ResolverClosing) -> None:
        """ResolverArgs.on_closing: keep ``closing`` for close() to wait for
        (an idle channel's earlier ones, already done, are dropped)."""
        with self._lock:
            kept = [c for c in self._resolver_closing if not c.is_set()]
            kept.append(closing)
            self._resolver_closing = kept

    def close(self, wait: float = 0.0) -> None:
        """Close the channel.  ``wait`` > 0 (a user's ``close()``): return once
        every connection is closed, as grpcio's own ``close()`` does, so a
        server stopped right after sees no live client (no GOAWAY noise):
        the subchannels' transports and what the resolver left closing (the
        xDS client's ADS connection); at most ``wait`` seconds.  ``wait`` 0
        (``pyxds.aio``'s close, whose own loop closes its transports; the
        exit hook; the reaper): only what the resolver left closing, at most
        ``RELEASE_WAIT``.  Never waits from inside the serializer or on the
        process's timer thread (an RPC's done-callback runs there when its
        deadline ends it), and the teardown itself never blocks: it runs on
        whichever thread drains the serializer, which may be the timer
        thread (docs/architecture.md, "Rules that keep it fast and
        correct")."""
        if self.closed:
            return
        closing: list[Closing] = []
        closed = threading.Event()

        def go() -> None:
            closing.extend(self.pool.close())  # first: cancels RPCs in flight
            self._teardown()
            closing.extend(self.pool.close())
            self.picker = FailPicker(_CLOSED)
            self._set_state(ConnectivityState.SHUTDOWN, _CLOSED)
            self._publish()
            close_clock = getattr(self.clock, "close", None)
            if close_clock is not None:
                close_clock()
            # after what the teardown queued behind this callback (the
            # resolver's shutdown releases the xDS client and hands over the
            # event of its close, on_closing): set directly, a close() that
            # found the serializer busy on another thread would not wait for
            # the ADS connection, and a control plane stopped right after
            # sent it a GOAWAY (seen under load)
            self.serializer.run(closed.set)

        self.closed = True
        lifecycle.closed(self)  # the reaper may go once none is open
        self.serializer.run(go)
        if self.serializer.in_serializer or on_timer_thread():
            return  # e.g. a done-callback of an RPC its deadline ended
        deadline = time.monotonic() + (wait if wait > 0 else RELEASE_WAIT)
        if not closed.wait(max(0.0, deadline - time.monotonic())):
            return
        with self._lock:
            waits: list[ResolverClosing] = list(self._resolver_closing)
        if wait > 0:
            waits += [transport.close_done for transport in closing]
        for each in waits:
            if not each.wait(max(0.0, deadline - time.monotonic())):
                break


RELEASE_WAIT = 10.0
"""At most this long, ``close(wait=0)`` waits for what the resolver's
shutdown left closing (the xDS client's ADS connection, then the watcher
callbacks queued before it)."""


def _count_of(counter: itertools.count[int]) -> int:
    """How many times ``next(counter)`` was called (counters start at 1),
    read from its ``repr`` (``count(N)``, N the next value): itertools'
    ``__reduce__`` is deprecated since Python 3.12 and gone in 3.14."""
    return int(repr(counter)[6:-1]) - 1


_DEADLINE_CLOCK = RealClock()
"""Deadline and backoff timers of non-blocking RPCs (run on the timer thread)."""
