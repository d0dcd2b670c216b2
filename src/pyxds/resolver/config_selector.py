"""The xds resolver's ConfigSelector (gRFC A31, A28 "Picking").

Theory of operation
-------------------

Built once per virtual host (on the serializer), used per RPC from any
thread.  Everything is precomputed: the :class:`RouteTable` index, one
action object per route, and for every (cluster, timeout) pair the very
:class:`CallConfig` object an RPC gets back, so ``select`` allocates
nothing on the success path:

1. Match the RPC against the routes, first match wins
   (:mod:`pyxds.resolver.route_matching`).  No match: UNAVAILABLE "No
   matching route found in xDS route config".  A non-forwarding route:
   UNAVAILABLE "Matching route has inappropriate action".
2. Pick the cluster: the route's cluster, or for ``weighted_clusters`` a
   random draw over the cumulative weights (their sum, not
   ``total_weight``), located with ``bisect``.
3. Take a reference on the cluster (:class:`ClusterRef`), released by
   ``CallConfig.on_committed`` when the RPC ends.  A cluster leaves the LB
   config only when no RPC holds it and the current route configuration no
   longer names it (A31's two steps).  If the reference cannot be taken
   because the cluster was already retired (an RPC raced a route change on
   a superseded selector), the RPC is routed again by the current selector.
4. ``call_attributes["cluster"]`` is the xds_cluster_manager child name
   ``cluster:NAME`` (``cluster_specifier_plugin:NAME`` for a route naming a
   cluster specifier plugin, RLS: that child, held by a ref of its own,
   runs the plugin's policy, which picks the cluster per RPC); ``timeout``
   is the route's max_stream_duration, else the listener's (0 or unset: no
   limit); ``retry_policy`` is the route's
   (else its virtual host's) A44 retry policy, the RPC's for all attempts.
5. A route with hash policies also gets ``call_attributes[REQUEST_HASH_KEY]``,
   the A42 request hash (:mod:`pyxds.resolver.request_hash`), in a small
   mapping built per RPC; without a hash (no policy produced a value) it
   gets the precomputed CallConfig.  Routes without hash policies never
   reach this code: their actions keep ``single`` set and return the
   precomputed CallConfig as before, so they pay nothing for it.
6. A route whose filter chain has a stateful session cookie (A55,
   :class:`~pyxds.resolver.stateful_session.SessionCookie`, taken out of the
   chain) takes the same slower path: when the RPC's path matches the
   cookie path, its cookie is read; A60: a cookie naming one of the
   route's clusters sends the RPC there (that cluster's reference is the
   one taken), else the route's draw stands.  A route naming a
   cluster specifier plugin (RLS) has no cluster the cookie can keep: its
   cookie's cluster part is empty (C-core: the cluster attribute is not a
   ``cluster:`` child), the address still pins.  The RPC gets its
   :class:`~pyxds.resolver.stateful_session.SessionCall` as the
   ``xds_override_host`` call attribute (the LB picker honours the cookie's
   address and writes the picked one) and as ``CallConfig.call_state`` (the
   channel asks it for the ``set-cookie`` of the response).  Filters and
   timeouts are those of the cluster the route drew, as in C-core where
   the filter only changes the cluster attribute.  Several session filters
   in one chain (a :class:`~pyxds.resolver.stateful_session.SessionChain`)
   are applied one after the other, as C-core runs them.
7. A route with A81 ``auto_host_rewrite`` (read only from a
   ``trusted_xds_server``) gives its RPCs
   ``call_attributes[AUTO_HOST_REWRITE_KEY] = True`` (A81 "xDS
   ConfigSelector Changes"): prebuilt per cluster like the rest, so an RPC
   pays nothing for it; xds_cluster_impl's picker reads it.
"""

from __future__ import annotations

import random as _random_module
import sys
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import grpc

from pyxds.lb.api import AUTO_HOST_REWRITE_KEY, OVERRIDE_HOST_ATTRIBUTE, REQUEST_HASH_KEY
from pyxds.resolver.api import CallConfig, ConfigSelector
from pyxds.resolver.http_filters import build_chain
from pyxds.resolver.retry_policy import RetryPolicy
from pyxds.resolver.route_matching import RouteTable
from pyxds.status import Status
from pyxds.xds.resources.types import RouteAction, VirtualHost

if TYPE_CHECKING:  # loaded by the first route with a hash policy / a session cookie
    from pyxds.resolver.request_hash import RequestHasher
    from pyxds.resolver.stateful_session import (
        SessionCall,
        SessionChain,
        SessionChainCall,
        SessionCookie,
    )

__all__ = [
    "CLUSTER_ATTRIBUTE",
    "NO_ROUTE_MESSAGE",
    "NON_FORWARDING_MESSAGE",
    "cluster_child_name",
    "plugin_child_name",
    "ClusterRef",
    "XdsConfigSelector",
    "FailingConfigSelector",
]

CLUSTER_ATTRIBUTE = "cluster"
NO_ROUTE_MESSAGE = "No matching route found in xDS route config"
NON_FORWARDING_MESSAGE = "Matching route has inappropriate action"
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def cluster_child_name(cluster: str) -> str:
    """The xds_cluster_manager child name of a cluster (``cluster:NAME``)."""
    return f"cluster:{cluster}"


def plugin_child_name(plugin: str) -> str:
    """The xds_cluster_manager child name of a cluster specifier plugin
    (``cluster_specifier_plugin:NAME``, C-core's)."""
    return f"cluster_specifier_plugin:{plugin}"


class ClusterRef:
    """In-flight RPC references on one cluster (A31 cluster lifecycle).

    ``acquire``/``release`` run on RPC threads; ``in_routes`` and
    ``try_retire`` on the serializer.  ``on_idle`` is called (from the
    releasing thread) when the last RPC lets go of a cluster that the
    routes no longer name; it must only schedule work on the serializer.

    Lock-free: the references are tokens in a deque (``append``/``pop``
    are atomic), and retiring is a two-sided handshake - the RPC adds its
    token *then* checks ``retired``; the serializer sets ``retired`` *then*
    counts tokens and backs out if there are any - so an RPC never keeps a
    reference on a retired cluster (it backs out and is re-routed).
    """

    __slots__ = ("name", "child_name", "attributes", "in_routes", "retired", "_tokens",
                 "_on_idle", "subscription", "child_policy")  # fmt: skip

    def __init__(
        self,
        name: str,
        on_idle: Callable[[], None],
        subscription: Any = None,
        child_policy: str | None = None,
    ) -> None:
        self.name = name
        #: a cluster specifier plugin's LB config (JSON text of a
        #: loadBalancingConfig list); None for a cluster
        self.child_policy = child_policy
        self.child_name = (
            cluster_child_name(name) if child_policy is None else plugin_child_name(name)
        )
        self.attributes: Mapping[str, Any] = MappingProxyType({CLUSTER_ATTRIBUTE: self.child_name})
        self.in_routes = True
        self.retired = False
        self._tokens: deque[None] = deque()
        self._on_idle = on_idle
        self.subscription = subscription

    @property
    def count(self) -> int:
        return len(self._tokens)

    def acquire(self) -> bool:
        # XdsConfigSelector.select does the same inline
        self._tokens.append(None)
        if self.retired:
            self._tokens.pop()
            return False
        return True

    def release(self) -> None:
        self._tokens.pop()
        if not self._tokens and not self.in_routes:
            self._on_idle()

    def try_retire(self) -> bool:
        """Retire when unreferenced and not routed to (serializer only)."""
        if self.retired:
            return True
        if self.in_routes or self._tokens:
            return False
        self.retired = True
        if self._tokens:  # an RPC got in between: it keeps the cluster
            self.retired = False
            return False
        return True

    def __repr__(self) -> str:
        return f"ClusterRef({self.name!r}, rpcs={self.count}, in_routes={self.in_routes})"


class _Choice:
    """A cluster an action can choose, with its ready-made CallConfig and
    the stateful session cookie of its filter chain (None: no session)."""

    __slots__ = ("ref", "config", "session")

    def __init__(
        self,
        ref: ClusterRef,
        config: CallConfig,
        session: SessionCookie | SessionChain | None = None,
    ) -> None:
        self.ref = ref
        self.config = config
        self.session = session


class _Action:
    """What a route does, precomputed.

    ``single`` set: always that cluster, nothing computed per RPC.  A route
    with hash policies keeps ``single`` None and sets ``hasher`` (its
    cluster, if only one, is ``choices[0]``), so the common case above
    never tests for hashing.
    """

    __slots__ = (
        "fail",
        "single",
        "cumulative",
        "total",
        "choices",
        "route_name",
        "hasher",
        "special",
        "by_cluster",
        "rewrite",
    )

    def __init__(self) -> None:
        self.fail: CallConfig | None = None
        self.single: _Choice | None = None
        self.cumulative: list[int] = []
        self.total = 0
        self.choices: list[_Choice] = []
        self.route_name = ""
        self.hasher: RequestHasher | None = None
        #: hash policies or a stateful session: routed by _select_special
        self.special = False
        #: cluster name -> its first choice (A60's cookie cluster)
        self.by_cluster: dict[str, _Choice] = {}
        #: the route's A81 ``auto_host_rewrite``
        self.rewrite = False


def _effective_timeout(route_value: float | None, listener_value: float | None) -> float | None:
    value = route_value if route_value is not None else listener_value
    if value is None or value <= 0:
        return None
    return value


def _retry_policy(action: RouteAction) -> RetryPolicy | None:
    """The route's A44 retry policy (the virtual host's when the route has
    none: the RDS parser already folded it in) as the channel applies it."""
    rp = action.retry_policy
    if rp is None:
        return None
    return RetryPolicy.from_xds(rp.retry_on, rp.num_retries, rp.base_interval, rp.max_interval)


#: the A55 filter's module (:mod:`pyxds.resolver.stateful_session`): it
#: loads with the first route chain naming the filter (the http_filters
#: registry), before which no route can have a session cookie; bound here
#: by the first selector with one (issue 18, start-up)
_SESSIONS = "pyxds.resolver.stateful_session"
_sessions: Any = None


# CallConfig is a frozen slotted dataclass: its __init__ (a frozen
# __setattr__ per field) costs microseconds; a per-RPC config is built
# through the slot descriptors instead, as the EDS parser builds its
# hot-loop values (a test checks every field is set).
_new = object.__new__


def _slot_setter(name: str) -> Callable[[CallConfig, Any], None]:
    setter: Callable[[CallConfig, Any], None] = getattr(CallConfig, name).__set__
    return setter


_set_attributes = _slot_setter("call_attributes")
_set_timeout = _slot_setter("timeout")
_set_committed = _slot_setter("on_committed")
_set_status = _slot_setter("status")
_set_no_config = _slot_setter("no_config")
_set_retry = _slot_setter("retry_policy")
_set_filters = _slot_setter("filters")
_set_wait_for_ready = _slot_setter("wait_for_ready")
_set_call_state = _slot_setter("call_state")


def _rewriting(ref: ClusterRef) -> Mapping[str, Any]:
    """The call attributes of a route with A81 ``auto_host_rewrite`` to
    ``ref``'s cluster: its own plus :data:`AUTO_HOST_REWRITE_KEY` (made once
    per selector and cluster; routes without it keep ``ref.attributes``, so
    their RPCs pay nothing for it)."""
    return MappingProxyType({**ref.attributes, AUTO_HOST_REWRITE_KEY: True})


def _per_rpc_config(
    base: CallConfig,
    call_attributes: Mapping[str, Any],
    on_committed: Callable[[], None],
    call_state: Any,
) -> CallConfig:
    """``base`` with this RPC's call attributes, reference release and call state."""
    config: CallConfig = _new(CallConfig)
    _set_attributes(config, call_attributes)
    _set_timeout(config, base.timeout)
    _set_committed(config, on_committed)
    _set_status(config, base.status)
    _set_no_config(config, base.no_config)
    _set_retry(config, base.retry_policy)
    _set_filters(config, base.filters)
    _set_wait_for_ready(config, base.wait_for_ready)
    _set_call_state(config, call_state)
    return config


def _open_session(
    cookie: SessionCookie,
    choice: _Choice,
    action: _Action,
    path: str,
    metadata: Sequence[tuple[str, str | bytes]],
) -> tuple[_Choice, SessionCall | None]:
    """One session filter on an RPC (module docstring, step 6): the choice
    its cookie's cluster leads to, and its session (None when the RPC's path
    is not the cookie's)."""
    if not cookie.applies_to(path):
        return choice, None
    address_list, cookie_cluster, addresses = cookie.read_split(metadata)
    if choice.ref.child_policy is not None:
        # a cluster specifier plugin's route (RLS): no cluster to keep or
        # write; the address still pins (C-core's empty cluster when the
        # attribute is no "cluster:" child)
        cluster = ""
    else:
        cluster = choice.ref.name
        if cookie_cluster and cookie_cluster != cluster:
            pinned = action.by_cluster.get(cookie_cluster)
            if pinned is not None:
                choice, cluster = pinned, cookie_cluster
    session: SessionCall = _sessions.SessionCall(
        cookie.config, address_list, cluster, cluster != cookie_cluster, addresses
    )
    return choice, session


class XdsConfigSelector(ConfigSelector):
    """Routes RPCs over one virtual host (module docstring)."""

    def __init__(
        self,
        virtual_host: VirtualHost,
        refs: Mapping[str, ClusterRef],
        listener_max_stream_duration: float | None = None,
        rng: _random_module.Random | None = None,
        fallback: Callable[[], ConfigSelector | None] | None = None,
        channel_id: int | None = None,
        http_filters: Sequence[Any] = (),
        plugin_refs: Mapping[str, ClusterRef] | None = None,
    ) -> None:
        self.virtual_host = virtual_host
        self._fallback = fallback
        # A42 channel_id hash policy: the resolver passes its own; a
        # standalone selector draws one (not from ``rng``, whose sequence
        # the weighted-cluster draws own).
        if channel_id is None:
            channel_id = _random_module.getrandbits(64)
        self.channel_id = channel_id
        rng = rng or _random_module.Random()
        uniform = rng.random
        self._draw: Callable[[int], int] = lambda n: int(uniform() * n)
        self._no_route = CallConfig(status=Status(UNAVAILABLE, NO_ROUTE_MESSAGE))
        self._lost_cluster = CallConfig(
            status=Status(UNAVAILABLE, "xDS cluster for this RPC was removed from the config")
        )
        configs: dict[tuple[Any, ...], CallConfig] = {}
        vh_overrides = virtual_host.filter_overrides
        chains: dict[tuple[Any, ...], tuple[Any, ...]] = {}

        def chain(*levels: tuple[tuple[str, str, bytes], ...]) -> tuple[Any, ...]:
            if not http_filters:
                return ()
            got = chains.get(levels)
            if got is None:
                got = chains[levels] = build_chain(http_filters, vh_overrides, *levels)
            return got

        def choice(
            cluster: str,
            timeout: float | None,
            retry: RetryPolicy | None,
            filters: tuple[Any, ...],
            plugin: bool = False,
            rewrite: bool = False,
        ) -> _Choice:
            global _sessions
            ref = (plugin_refs or {})[cluster] if plugin else refs[cluster]
            session: SessionCookie | SessionChain | None = None
            sessions = sys.modules.get(_SESSIONS)
            if sessions is not None and any(type(f) is sessions.SessionCookie for f in filters):
                _sessions = sessions
                cookie_type = sessions.SessionCookie
                cookies = tuple(f for f in filters if type(f) is cookie_type)
                session = cookies[0] if len(cookies) == 1 else sessions.SessionChain(cookies)
                filters = tuple(f for f in filters if type(f) is not cookie_type)
            key = (ref.child_name, timeout, retry, filters, rewrite)
            config = configs.get(key)
            if config is None:
                config = configs[key] = CallConfig(
                    call_attributes=_rewriting(ref) if rewrite else ref.attributes,
                    timeout=timeout,
                    on_committed=ref.release,
                    retry_policy=retry,
                    filters=filters,
                )
            return _Choice(ref, config, session)

        non_forwarding = CallConfig(status=Status(UNAVAILABLE, NON_FORWARDING_MESSAGE))
        routes = []
        for route in virtual_host.routes:
            action = _Action()
            action.route_name = route.name
            ra = route.action
            if not isinstance(ra, RouteAction):
                action.fail = non_forwarding
            else:
                timeout = _effective_timeout(ra.max_stream_duration, listener_max_stream_duration)
                retry = _retry_policy(ra)
                route_overrides = route.filter_overrides
                rewrite = ra.auto_host_rewrite
                action.rewrite = rewrite
                if ra.cluster is not None:
                    action.single = choice(
                        ra.cluster, timeout, retry, chain(route_overrides), rewrite=rewrite
                    )
                elif ra.weighted_clusters:
                    running = 0
                    for cw in ra.weighted_clusters:
                        if cw.weight <= 0:
                            continue
                        running += cw.weight
                        action.cumulative.append(running)
                        action.choices.append(
                            choice(
                                cw.name,
                                timeout,
                                retry,
                                chain(route_overrides, cw.filter_overrides),
                                rewrite=rewrite,
                            )
                        )
                    action.total = running
                    if running == 0:
                        action.fail = CallConfig(
                            status=Status(UNAVAILABLE, "weighted_clusters with total weight 0")
                        )
                    elif len(action.choices) == 1:
                        action.single = action.choices[0]
                elif ra.cluster_specifier_plugin is not None:
                    name = ra.cluster_specifier_plugin
                    if plugin_refs is not None and name in plugin_refs:
                        action.single = choice(
                            name, timeout, retry, chain(route_overrides), True, rewrite
                        )
                    else:
                        action.fail = CallConfig(
                            status=Status(
                                UNAVAILABLE, f"cluster specifier plugin {name} is not supported"
                            )
                        )
                else:
                    action.fail = non_forwarding
                if action.fail is None and ra.hash_policies:
                    from pyxds.resolver.request_hash import RequestHasher

                    hasher = RequestHasher(ra.hash_policies, channel_id)
                    if hasher:
                        action.hasher = hasher
                        action.special = True
                if action.fail is None:
                    if action.single is not None and not action.choices:
                        action.choices = [action.single]
                    for c in action.choices:
                        action.by_cluster.setdefault(c.ref.name, c)
                    if any(c.session is not None for c in action.choices):
                        action.special = True
                if action.special:
                    action.single = None
            routes.append((route.match, action))
        self._table: RouteTable[_Action] = RouteTable(routes)
        self._plans = self._table.plans

    @property
    def route_count(self) -> int:
        return self._table.size

    def select(self, path: str, metadata: Sequence[tuple[str, str | bytes]]) -> CallConfig:
        # Fast path: a memoised plan with nothing to check per RPC.
        plan = self._plans.get(path)
        if plan is not None and not plan.conditional and plan.terminal is not None:
            action: _Action | None = plan.terminal.payload
        else:
            action = self._table.match(path, metadata, self._draw)
        if action is None:
            return self._no_route
        choice = action.single
        if choice is None:
            if action.fail is not None:
                return action.fail
            if action.special:
                return self._select_special(action, path, metadata)
            index = bisect_right(action.cumulative, self._draw(action.total))
            choice = action.choices[index]
        # ClusterRef.acquire, inline (every RPC passes here)
        ref = choice.ref
        tokens = ref._tokens
        tokens.append(None)
        if not ref.retired:
            return choice.config
        tokens.pop()
        return self._reroute(path, metadata)

    def _select_special(
        self,
        action: _Action,
        path: str,
        metadata: Sequence[tuple[str, str | bytes]],
    ) -> CallConfig:
        """``select`` for a route with hash policies (A42) or a stateful
        session (A55/A60): the module docstring's steps 5 and 6."""
        choices = action.choices
        if len(choices) == 1:
            choice = choices[0]
        else:
            choice = choices[bisect_right(action.cumulative, self._draw(action.total))]
        drawn = choice
        session: SessionCall | None = None
        call_state: SessionCall | SessionChainCall | None = None
        cookie = choice.session
        if cookie is None:
            pass
        elif type(cookie) is _sessions.SessionCookie:
            choice, session = _open_session(cookie, choice, action, path, metadata)
            call_state = session
        else:
            assert isinstance(cookie, _sessions.SessionChain)
            calls = []
            for one in cookie.cookies:
                choice, opened = _open_session(one, choice, action, path, metadata)
                if opened is not None:
                    calls.append(opened)
            if calls:
                session = calls[-1]
                call_state = (
                    session if len(calls) == 1 else _sessions.SessionChainCall(tuple(calls))
                )
        hasher = action.hasher
        request_hash = hasher(metadata) if hasher is not None else None
        ref = choice.ref
        if not ref.acquire():
            return self._reroute(path, metadata)
        config = drawn.config
        if request_hash is None and session is None:
            return config if choice is drawn else choice.config
        attributes: dict[str, Any] = {CLUSTER_ATTRIBUTE: ref.child_name}
        if action.rewrite:
            attributes[AUTO_HOST_REWRITE_KEY] = True
        if request_hash is not None:
            attributes[REQUEST_HASH_KEY] = request_hash
        if session is not None:
            attributes[OVERRIDE_HOST_ATTRIBUTE] = session
        return _per_rpc_config(config, attributes, ref.release, call_state)

    def _reroute(self, path: str, metadata: Sequence[tuple[str, str | bytes]]) -> CallConfig:
        # The cluster was retired after a newer selector replaced this one.
        if self._fallback is not None:
            current = self._fallback()
            if current is not None and current is not self:
                return current.select(path, metadata)
        return self._lost_cluster


class FailingConfigSelector(ConfigSelector):
    """Fails every RPC with one status (no usable xDS config); wait_for_ready
    RPCs wait for the next config instead (``CallConfig.no_config``)."""

    def __init__(self, status: Status) -> None:
        self.status = status
        self._config = CallConfig(status=status, no_config=True)

    def select(self, path: str, metadata: Sequence[tuple[str, str | bytes]]) -> CallConfig:
        return self._config
