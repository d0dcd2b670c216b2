"""Compact builders of the Envoy v3 resources a gRPC client uses (A27, A28, A37).

Every function returns an envoy proto. The shapes follow what gRPC clients
require: a Listener is an HTTP API listener whose HttpConnectionManager gets
its routes over ADS (or inline) and ends its filter chain with the router
filter; an EDS Cluster takes its endpoints from ADS.

Durations are seconds (float) or ``datetime.timedelta``. Addresses are
``"host:port"`` (``"[::1]:port"`` for IPv6).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2
from envoy.config.core.v3 import (
    address_pb2,
    base_pb2,
    config_source_pb2,
    extension_pb2,
    health_check_pb2,
    protocol_pb2,
)
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2 as aggregate_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from envoy.type.v3 import percent_pb2, range_pb2
from google.protobuf import any_pb2, duration_pb2, message, wrappers_pb2

Seconds = float | int | datetime.timedelta

__all__ = [
    "ads_config_source",
    "cluster",
    "endpoint",
    "endpoints",
    "hash_policy",
    "header_matcher",
    "http_connection_manager",
    "listener",
    "locality",
    "pack",
    "route",
    "route_config",
    "route_lookup_config",
    "rls_key_builder",
    "rls_plugin",
    "router_filter",
    "virtual_host",
]


def pack(msg: message.Message) -> any_pb2.Any:
    """Wrap a message in an Any (type URL ``type.googleapis.com/<full name>``)."""
    out = any_pb2.Any()
    out.Pack(msg)
    return out


def _duration(value: Seconds, what: str) -> duration_pb2.Duration:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what}: expected a non-negative number of seconds, got {value!r}")
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise ValueError(f"address {address!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def ads_config_source() -> config_source_pb2.ConfigSource:
    """A ConfigSource that says "use the ADS stream" (A27: RDS and EDS must use ADS)."""
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def router_filter() -> hcm_pb2.HttpFilter:
    """The terminal router filter (must be last in ``http_filters``)."""
    return hcm_pb2.HttpFilter(name="router", typed_config=pack(router_pb2.Router()))


_DENOMINATORS = {100: 0, 10_000: 1, 1_000_000: 2}


def _percent(value: float | tuple[int, int]) -> percent_pb2.FractionalPercent:
    """A FractionalPercent from a percentage (50 -> 50/HUNDRED) or an
    explicit (numerator, denominator) with denominator 100, 10000 or 1000000."""
    if isinstance(value, tuple):
        numerator, denominator = value
    else:
        numerator, denominator = round(value * 10_000), 1_000_000
    return percent_pb2.FractionalPercent(
        numerator=numerator, denominator=_DENOMINATORS[denominator]
    )


def fault_config(
    abort_grpc_status: int | None = None,
    abort_http_status: int | None = None,
    header_abort: bool = False,
    abort_percent: float | tuple[int, int] | None = None,
    delay: Seconds | None = None,
    header_delay: bool = False,
    delay_percent: float | tuple[int, int] | None = None,
    max_active_faults: int | None = None,
) -> Any:
    """An HTTPFault (A33) for an HCM filter or a ``typed_per_filter_config``
    override.  Percentages: a number of percent, or (numerator, denominator)."""
    from envoy.extensions.filters.common.fault.v3 import fault_pb2 as common_fault_pb2
    from envoy.extensions.filters.http.fault.v3 import fault_pb2

    fault = fault_pb2.HTTPFault()
    if abort_grpc_status is not None or abort_http_status is not None or header_abort:
        abort = fault_pb2.FaultAbort()
        if abort_grpc_status is not None:
            abort.grpc_status = abort_grpc_status
        elif abort_http_status is not None:
            abort.http_status = abort_http_status
        else:
            abort.header_abort.SetInParent()
        if abort_percent is not None:
            abort.percentage.CopyFrom(_percent(abort_percent))
        fault.abort.CopyFrom(abort)
    if delay is not None or header_delay:
        fault_delay = common_fault_pb2.FaultDelay()
        if delay is not None:
            fault_delay.fixed_delay.CopyFrom(_duration(delay, "fault delay"))
        else:
            fault_delay.header_delay.SetInParent()
        if delay_percent is not None:
            fault_delay.percentage.CopyFrom(_percent(delay_percent))
        fault.delay.CopyFrom(fault_delay)
    if max_active_faults is not None:
        fault.max_active_faults.CopyFrom(wrappers_pb2.UInt32Value(value=max_active_faults))
    return fault


def fault_filter(name: str = "fault", config: Any = None, **kwargs: Any) -> hcm_pb2.HttpFilter:
    """An HCM fault injection filter (A33): ``config`` an HTTPFault, else
    :func:`fault_config` of ``kwargs``."""
    if config is None:
        config = fault_config(**kwargs)
    return hcm_pb2.HttpFilter(name=name, typed_config=pack(config))


def stateful_session_config(
    cookie_name: str = "global-session-cookie",
    path: str = "",
    ttl: Seconds | None = None,
) -> Any:
    """A StatefulSession (A55) with a CookieBasedSessionState: the session
    cookie's name, path ("" = every path) and TTL (None = no Max-Age)."""
    from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2
    from envoy.extensions.http.stateful_session.cookie.v3 import cookie_pb2
    from envoy.type.http.v3 import cookie_pb2 as http_cookie_pb2

    cookie = http_cookie_pb2.Cookie(name=cookie_name, path=path)
    if ttl is not None:
        cookie.ttl.CopyFrom(_duration(ttl, "ttl"))
    state = cookie_pb2.CookieBasedSessionState(cookie=cookie)
    return stateful_session_pb2.StatefulSession(
        session_state=extension_pb2.TypedExtensionConfig(
            name="envoy.http.stateful_session.cookie", typed_config=pack(state)
        )
    )


def stateful_session_filter(
    name: str = "envoy.filters.http.stateful_session", config: Any = None, **kwargs: Any
) -> hcm_pb2.HttpFilter:
    """An HCM stateful session filter (A55): ``config`` a StatefulSession,
    else :func:`stateful_session_config` of ``kwargs``."""
    if config is None:
        config = stateful_session_config(**kwargs)
    return hcm_pb2.HttpFilter(name=name, typed_config=pack(config))


def stateful_session_per_route(disabled: bool = False, **kwargs: Any) -> Any:
    """A StatefulSessionPerRoute override (A55 via A39): ``disabled``, or
    another cookie (:func:`stateful_session_config` of ``kwargs``)."""
    from envoy.extensions.filters.http.stateful_session.v3 import stateful_session_pb2

    if disabled:
        return stateful_session_pb2.StatefulSessionPerRoute(disabled=True)
    return stateful_session_pb2.StatefulSessionPerRoute(
        stateful_session=stateful_session_config(**kwargs)
    )


def http_connection_manager(
    route_config_name: str | None = None,
    route_config: route_pb2.RouteConfiguration | None = None,
    max_stream_duration: Seconds | None = None,
    http_filters: Sequence[hcm_pb2.HttpFilter] = (),
) -> hcm_pb2.HttpConnectionManager:
    """An HttpConnectionManager using RDS over ADS or an inline route config.

    ``http_filters`` go before the router filter, which is always last.
    """
    if (route_config_name is None) == (route_config is None):
        raise ValueError("give exactly one of route_config_name and route_config")
    hcm = hcm_pb2.HttpConnectionManager(
        http_filters=[*http_filters, router_filter()],
    )
    if route_config is not None:
        hcm.route_config.CopyFrom(route_config)
    else:
        hcm.rds.CopyFrom(
            hcm_pb2.Rds(config_source=ads_config_source(), route_config_name=route_config_name)
        )
    if max_stream_duration is not None:
        hcm.common_http_protocol_options.CopyFrom(
            protocol_pb2.HttpProtocolOptions(
                max_stream_duration=_duration(max_stream_duration, "max_stream_duration")
            )
        )
    return hcm


def listener(
    name: str,
    route_config_name: str | None = None,
    route_config: route_pb2.RouteConfiguration | None = None,
    max_stream_duration: Seconds | None = None,
    http_filters: Sequence[hcm_pb2.HttpFilter] = (),
) -> listener_pb2.Listener:
    """An HTTP API listener (A27 "Listener Proto").

    Routes come from RDS (``route_config_name``, default ``name + "-route"``) or
    inline (``route_config``).
    """
    if route_config is None and route_config_name is None:
        route_config_name = f"{name}-route"
    hcm = http_connection_manager(
        route_config_name, route_config, max_stream_duration, http_filters=http_filters
    )
    return listener_pb2.Listener(
        name=name, api_listener=api_listener_pb2.ApiListener(api_listener=pack(hcm))
    )


def route_config(
    name: str,
    virtual_hosts: Iterable[route_components_pb2.VirtualHost],
    cluster_specifier_plugins: Iterable[route_components_pb2.ClusterSpecifierPlugin] = (),
) -> route_pb2.RouteConfiguration:
    """A RouteConfiguration (A28); ``cluster_specifier_plugins`` (see
    :func:`rls_plugin`) for routes built with ``cluster_specifier_plugin``."""
    return route_pb2.RouteConfiguration(
        name=name,
        virtual_hosts=list(virtual_hosts),
        cluster_specifier_plugins=list(cluster_specifier_plugins),
    )


def rls_key_builder(
    services: str | Iterable[str | tuple[str, str]],
    headers: Mapping[str, str | Sequence[str]] | None = None,
    constant_keys: Mapping[str, str] | None = None,
    host_key: str | None = None,
    service_key: str | None = None,
    method_key: str | None = None,
) -> Any:
    """A ``grpc.lookup.v1.GrpcKeyBuilder`` for the RPCs of ``services``
    (``"pkg.Service"`` for every method, or ``("pkg.Service", "Method")``):
    ``headers`` maps a key to the header (or headers, first present wins)
    that gives its value; ``host_key``/``service_key``/``method_key`` name
    the extra keys."""
    from pyxds.protos import rls_config_pb2

    if isinstance(services, str):
        services = (services,)
    names = []
    for entry in services:
        service, method = (entry, "") if isinstance(entry, str) else entry
        names.append(rls_config_pb2.GrpcKeyBuilder.Name(service=service, method=method))
    builder = rls_config_pb2.GrpcKeyBuilder(names=names, constant_keys=dict(constant_keys or {}))
    for key, header_names in (headers or {}).items():
        if isinstance(header_names, str):
            header_names = (header_names,)
        builder.headers.add(key=key, names=list(header_names))
    for field, value in (("host", host_key), ("service", service_key), ("method", method_key)):
        if value is not None:
            setattr(builder.extra_keys, field, value)
    return builder


def route_lookup_config(
    lookup_service: str,
    key_builders: Iterable[Any],
    cache_size_bytes: int = 1024 * 1024,
    max_age: Seconds | None = None,
    stale_age: Seconds | None = None,
    lookup_service_timeout: Seconds | None = None,
    default_target: str | None = None,
) -> Any:
    """A ``grpc.lookup.v1.RouteLookupConfig``: the RLS server at
    ``lookup_service`` (a gRPC target), the key builders (see
    :func:`rls_key_builder`), the cache (bytes, ages) and the target used
    when a lookup fails."""
    from pyxds.protos import rls_config_pb2

    config = rls_config_pb2.RouteLookupConfig(
        lookup_service=lookup_service,
        grpc_keybuilders=list(key_builders),
        cache_size_bytes=cache_size_bytes,
        default_target=default_target or "",
    )
    if max_age is not None:
        config.max_age.CopyFrom(_duration(max_age, "max_age"))
    if stale_age is not None:
        config.stale_age.CopyFrom(_duration(stale_age, "stale_age"))
    if lookup_service_timeout is not None:
        config.lookup_service_timeout.CopyFrom(
            _duration(lookup_service_timeout, "lookup_service_timeout")
        )
    return config


def rls_plugin(
    name: str, config: Any, optional: bool = False
) -> route_components_pb2.ClusterSpecifierPlugin:
    """A RouteConfiguration's RLS cluster specifier plugin named ``name``
    (a ``grpc.lookup.v1.RouteLookupClusterSpecifier`` over ``config``, a
    :func:`route_lookup_config`); routes name it with
    ``route(..., cluster_specifier_plugin=name)``."""
    from envoy.config.core.v3 import extension_pb2

    from pyxds.protos import rls_config_pb2

    specifier = rls_config_pb2.RouteLookupClusterSpecifier(route_lookup_config=config)
    return route_components_pb2.ClusterSpecifierPlugin(
        extension=extension_pb2.TypedExtensionConfig(name=name, typed_config=pack(specifier)),
        is_optional=optional,
    )


def virtual_host(
    name: str,
    domains: Iterable[str] = ("*",),
    routes: Iterable[route_components_pb2.Route] = (),
    retry_policy: route_components_pb2.RetryPolicy | None = None,
    typed_per_filter_config: Mapping[str, message.Message] | None = None,
) -> route_components_pb2.VirtualHost:
    """A VirtualHost matching ``domains`` (default: every domain);
    ``retry_policy``: the one of its routes that have none (A44);
    ``typed_per_filter_config``: filter name -> config override (A39)."""
    if isinstance(domains, str):
        domains = (domains,)
    vh = route_components_pb2.VirtualHost(name=name, domains=list(domains), routes=list(routes))
    if retry_policy is not None:
        vh.retry_policy.CopyFrom(retry_policy)
    for filter_name, override in (typed_per_filter_config or {}).items():
        vh.typed_per_filter_config[filter_name].CopyFrom(pack(override))
    return vh


def retry_policy(
    retry_on: str = "unavailable",
    num_retries: int | None = None,
    base_interval: Seconds | None = None,
    max_interval: Seconds | None = None,
) -> route_components_pb2.RetryPolicy:
    """An RDS RetryPolicy (A44): ``retry_on`` comma-separated gRPC code names
    ("cancelled", "deadline-exceeded", "internal", "resource-exhausted",
    "unavailable"), ``num_retries`` (unset: 1), ``retry_back_off``
    base/max intervals (unset: 25 ms and 10x base)."""
    rp = route_components_pb2.RetryPolicy(retry_on=retry_on)
    if num_retries is not None:
        rp.num_retries.CopyFrom(wrappers_pb2.UInt32Value(value=num_retries))
    if base_interval is not None or max_interval is not None:
        if base_interval is not None:
            rp.retry_back_off.base_interval.CopyFrom(_duration(base_interval, "base_interval"))
        if max_interval is not None:
            rp.retry_back_off.max_interval.CopyFrom(_duration(max_interval, "max_interval"))
    return rp


def _string_matcher(
    exact: str | None,
    prefix: str | None,
    suffix: str | None,
    contains: str | None,
    safe_regex: str | None,
    ignore_case: bool,
) -> string_pb2.StringMatcher:
    m = string_pb2.StringMatcher(ignore_case=ignore_case)
    if exact is not None:
        m.exact = exact
    elif prefix is not None:
        m.prefix = prefix
    elif suffix is not None:
        m.suffix = suffix
    elif contains is not None:
        m.contains = contains
    elif safe_regex is not None:
        m.safe_regex.CopyFrom(_regex(safe_regex))
    return m


def _regex(pattern: str) -> regex_pb2.RegexMatcher:
    return regex_pb2.RegexMatcher(regex=pattern, google_re2=regex_pb2.RegexMatcher.GoogleRE2())


def header_matcher(
    name: str,
    *,
    exact: str | None = None,
    prefix: str | None = None,
    suffix: str | None = None,
    contains: str | None = None,
    safe_regex: str | None = None,
    range: tuple[int, int] | None = None,
    present: bool | None = None,
    invert_match: bool = False,
    ignore_case: bool = False,
    legacy: bool = False,
) -> route_components_pb2.HeaderMatcher:
    """A HeaderMatcher (A28 "Header matching"); give exactly one way to match.

    String matches use ``string_match`` unless ``legacy`` asks for the older
    ``exact_match``/``prefix_match``/... fields. ``range`` is [start, end).
    """
    given = [
        k
        for k, v in {
            "exact": exact,
            "prefix": prefix,
            "suffix": suffix,
            "contains": contains,
            "safe_regex": safe_regex,
            "range": range,
            "present": present,
        }.items()
        if v is not None
    ]
    if len(given) != 1:
        raise ValueError(f"header_matcher({name!r}): give exactly one matcher, got {given}")
    m = route_components_pb2.HeaderMatcher(name=name, invert_match=invert_match)
    if range is not None:
        m.range_match.CopyFrom(range_pb2.Int64Range(start=range[0], end=range[1]))
    elif present is not None:
        m.present_match = present
    elif legacy:
        if exact is not None:
            m.exact_match = exact
        elif prefix is not None:
            m.prefix_match = prefix
        elif suffix is not None:
            m.suffix_match = suffix
        elif contains is not None:
            m.contains_match = contains
        else:
            m.safe_regex_match.CopyFrom(_regex(safe_regex or ""))
    else:
        m.string_match.CopyFrom(
            _string_matcher(exact, prefix, suffix, contains, safe_regex, ignore_case)
        )
    return m


def _fraction(value: Any) -> base_pb2.RuntimeFractionalPercent:
    if isinstance(value, base_pb2.RuntimeFractionalPercent):
        return value
    if isinstance(value, percent_pb2.FractionalPercent):
        return base_pb2.RuntimeFractionalPercent(default_value=value)
    if isinstance(value, tuple) and len(value) == 2:
        numerator, denominator = value
        denominators = percent_pb2.FractionalPercent.DenominatorType
        return base_pb2.RuntimeFractionalPercent(
            default_value=percent_pb2.FractionalPercent(
                numerator=numerator, denominator=denominators.Value(denominator)
            )
        )
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1:
        return base_pb2.RuntimeFractionalPercent(
            default_value=percent_pb2.FractionalPercent(
                numerator=round(value * 1_000_000),
                denominator=percent_pb2.FractionalPercent.MILLION,
            )
        )
    raise ValueError(
        "runtime_fraction: expected a fraction in [0, 1], (numerator, "
        f"'HUNDRED'|'TEN_THOUSAND'|'MILLION') or a proto, got {value!r}"
    )


def route(
    prefix: str | None = None,
    path: str | None = None,
    regex: str | None = None,
    headers: Iterable[route_components_pb2.HeaderMatcher] = (),
    cluster: str | None = None,
    weighted_clusters: Mapping[str, int] | Sequence[tuple[str, int]] | None = None,
    case_sensitive: bool | None = None,
    runtime_fraction: Any = None,
    timeout: Seconds | None = None,
    max_stream_duration: Seconds | None = None,
    grpc_timeout_header_max: Seconds | None = None,
    hash_policies: Iterable[route_components_pb2.RouteAction.HashPolicy] = (),
    retry_policy: route_components_pb2.RetryPolicy | None = None,
    typed_per_filter_config: Mapping[str, message.Message] | None = None,
    cluster_specifier_plugin: str | None = None,
    auto_host_rewrite: bool | None = None,
) -> route_components_pb2.Route:
    """A Route: one path matcher (default ``prefix=""``) and one action (A28).

    ``weighted_clusters`` maps cluster name to weight (or lists (name,
    weight) pairs, where a name may repeat); ``cluster_specifier_plugin``
    names a plugin of the route config (RLS, :func:`rls_plugin`). With none of
    ``cluster``, ``weighted_clusters`` and ``cluster_specifier_plugin`` the
    route is non-forwarding (``non_forwarding_action``).
    ``hash_policies`` (see :func:`hash_policy`) feed ring_hash clusters (A42).
    ``retry_policy`` (see :func:`retry_policy`): the route's A44 retry policy.
    ``typed_per_filter_config``: filter name -> config override (A39).
    ``auto_host_rewrite``: the route's A81 authority rewriting (a client
    heeds it from a server with the ``trusted_xds_server`` feature).
    """
    matchers = [k for k, v in {"prefix": prefix, "path": path, "regex": regex}.items() if v]
    if len(matchers) > 1:
        raise ValueError(f"route: give at most one of prefix, path, regex; got {matchers}")
    given = [cluster, weighted_clusters, cluster_specifier_plugin]
    if sum(v is not None for v in given) > 1:
        raise ValueError(
            "route: give at most one of cluster, weighted_clusters and cluster_specifier_plugin"
        )
    match = route_components_pb2.RouteMatch(headers=list(headers))
    if path is not None:
        match.path = path
    elif regex is not None:
        match.safe_regex.CopyFrom(_regex(regex))
    else:
        match.prefix = prefix or ""
    if case_sensitive is not None:
        match.case_sensitive.CopyFrom(wrappers_pb2.BoolValue(value=case_sensitive))
    if runtime_fraction is not None:
        match.runtime_fraction.CopyFrom(_fraction(runtime_fraction))
    out = route_components_pb2.Route(match=match)
    for filter_name, override in (typed_per_filter_config or {}).items():
        out.typed_per_filter_config[filter_name].CopyFrom(pack(override))
    if all(v is None for v in given):
        out.non_forwarding_action.SetInParent()
        return out
    action = route_components_pb2.RouteAction()
    if cluster is not None:
        action.cluster = cluster
    elif cluster_specifier_plugin is not None:
        action.cluster_specifier_plugin = cluster_specifier_plugin
    else:
        assert weighted_clusters is not None
        action.weighted_clusters.CopyFrom(
            route_components_pb2.WeightedCluster(
                clusters=[
                    route_components_pb2.WeightedCluster.ClusterWeight(
                        name=name, weight=wrappers_pb2.UInt32Value(value=weight)
                    )
                    for name, weight in (
                        weighted_clusters.items()
                        if isinstance(weighted_clusters, Mapping)
                        else weighted_clusters
                    )
                ]
            )
        )
    if timeout is not None:
        action.timeout.CopyFrom(_duration(timeout, "route timeout"))
    if max_stream_duration is not None:
        action.max_stream_duration.max_stream_duration.CopyFrom(
            _duration(max_stream_duration, "route max_stream_duration")
        )
    if grpc_timeout_header_max is not None:
        action.max_stream_duration.grpc_timeout_header_max.CopyFrom(
            _duration(grpc_timeout_header_max, "route grpc_timeout_header_max")
        )
    action.hash_policy.extend(hash_policies)
    if retry_policy is not None:
        action.retry_policy.CopyFrom(retry_policy)
    if auto_host_rewrite is not None:
        action.auto_host_rewrite.value = auto_host_rewrite
    out.route.CopyFrom(action)
    return out


def hash_policy(
    header: str | None = None,
    channel_id: bool = False,
    terminal: bool = False,
    regex: str | None = None,
    substitution: str = "",
) -> route_components_pb2.RouteAction.HashPolicy:
    """A route hash policy (A42): hash the ``header``'s value (optionally
    rewritten by ``regex`` -> ``substitution``), or, with ``channel_id``,
    the channel's id (filter_state ``io.grpc.channel_id``)."""
    if (header is None) == (not channel_id):
        raise ValueError("hash_policy: give exactly one of header and channel_id=True")
    out = route_components_pb2.RouteAction.HashPolicy(terminal=terminal)
    if channel_id:
        out.filter_state.key = "io.grpc.channel_id"
        return out
    out.header.header_name = header
    if regex is not None:
        out.header.regex_rewrite.pattern.CopyFrom(_regex(regex))
        out.header.regex_rewrite.substitution = substitution
    return out


_LB_POLICIES = {
    name: cluster_pb2.Cluster.LbPolicy.Value(name)
    for name in cluster_pb2.Cluster.LbPolicy.keys()  # noqa: SIM118 - enum wrapper
}


def _load_balancing_policy(value: Any) -> cluster_pb2.LoadBalancingPolicy:
    if isinstance(value, cluster_pb2.LoadBalancingPolicy):
        return value
    if isinstance(value, message.Message):
        value = [value]
    policies = []
    for i, item in enumerate(value):
        if isinstance(item, tuple):
            name, msg = item
        else:
            name, msg = item.DESCRIPTOR.full_name, item
        if not isinstance(msg, message.Message):
            raise ValueError(f"load_balancing_policy[{i}]: expected a protobuf message")
        policies.append(
            cluster_pb2.LoadBalancingPolicy.Policy(
                typed_extension_config=_typed_extension(name, msg)
            )
        )
    return cluster_pb2.LoadBalancingPolicy(policies=policies)


def _typed_extension(name: str, msg: message.Message) -> Any:  # a TypedExtensionConfig
    return extension_pb2.TypedExtensionConfig(name=name, typed_config=pack(msg))


def cluster(
    name: str,
    eds_service_name: str | None = None,
    lb_policy: str = "ROUND_ROBIN",
    kind: str = "EDS",
    dns_host: str | None = None,
    dns_port: int | None = None,
    aggregate_children: Sequence[str] | None = None,
    max_requests: int | None = None,
    load_balancing_policy: Any = None,
    lrs_server: bool = False,
    upstream_tls: Any = None,
    override_host_status: Sequence[str] | None = None,
    lrs_report_endpoint_metrics: Sequence[str] = (),
) -> cluster_pb2.Cluster:
    """A Cluster of ``kind`` "EDS", "LOGICAL_DNS" or "AGGREGATE" (A27, A37).

    ``lrs_server``: set ``lrs_server: {self: {}}`` (A27: report load to the
    xDS server on LRS).

    EDS takes endpoints over ADS (``eds_service_name`` names the EDS resource;
    default: the cluster name). LOGICAL_DNS needs ``dns_host`` and ``dns_port``.
    AGGREGATE lists ``aggregate_children`` in priority order.
    ``load_balancing_policy`` (A52): a LoadBalancingPolicy proto, a message, or a
    list of messages or (name, message) pairs, first supported wins.
    ``upstream_tls``: an UpstreamTlsContext (see :func:`upstream_tls_context`)
    set as the ``transport_socket`` (A29).
    ``override_host_status``: health status names stateful sessions may stay
    on (A55 ``common_lb_config.override_host_status``; None leaves it unset).
    ``lrs_report_endpoint_metrics``: the ORCA metrics load reports carry (A85).
    """
    kind = kind.upper()
    if aggregate_children is not None:
        kind = "AGGREGATE"
    if lb_policy not in _LB_POLICIES:
        raise ValueError(f"cluster {name!r}: unknown lb_policy {lb_policy!r}")
    c = cluster_pb2.Cluster(name=name, lb_policy=_LB_POLICIES[lb_policy])
    if kind == "EDS":
        c.type = cluster_pb2.Cluster.EDS
        c.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
        if eds_service_name:
            c.eds_cluster_config.service_name = eds_service_name
    elif kind == "LOGICAL_DNS":
        if not dns_host or dns_port is None:
            raise ValueError(f"cluster {name!r}: LOGICAL_DNS needs dns_host and dns_port")
        c.type = cluster_pb2.Cluster.LOGICAL_DNS
        c.load_assignment.CopyFrom(
            endpoints(name, [locality(endpoints=[endpoint(f"{dns_host}:{dns_port}")])])
        )
    elif kind == "AGGREGATE":
        children = list(aggregate_children or ())
        c.cluster_type.name = "envoy.clusters.aggregate"
        c.cluster_type.typed_config.CopyFrom(pack(aggregate_pb2.ClusterConfig(clusters=children)))
    else:
        raise ValueError(f"cluster {name!r}: kind must be EDS, LOGICAL_DNS or AGGREGATE")
    if max_requests is not None:
        c.circuit_breakers.CopyFrom(
            circuit_breaker_pb2.CircuitBreakers(
                thresholds=[
                    circuit_breaker_pb2.CircuitBreakers.Thresholds(
                        max_requests=wrappers_pb2.UInt32Value(value=max_requests)
                    )
                ]
            )
        )
    if load_balancing_policy is not None:
        c.load_balancing_policy.CopyFrom(_load_balancing_policy(load_balancing_policy))
    if lrs_server:
        c.lrs_server.self.SetInParent()
    if upstream_tls is not None:
        c.transport_socket.name = "envoy.transport_sockets.tls"
        c.transport_socket.typed_config.CopyFrom(pack(upstream_tls))
    if override_host_status is not None:
        statuses = c.common_lb_config.override_host_status
        statuses.SetInParent()
        for status in override_host_status:
            if status not in _HEALTH:
                raise ValueError(f"cluster {name!r}: unknown health status {status!r}")
            statuses.statuses.append(_HEALTH[status])
    c.lrs_report_endpoint_metrics.extend(lrs_report_endpoint_metrics)
    return c


def upstream_tls_context(
    ca_instance: str | None,
    identity_instance: str | None = None,
    san_matchers: Sequence[Mapping[str, Any]] = (),
    sni: str = "",
    auto_host_sni: bool = False,
    auto_sni_san_validation: bool = False,
) -> Any:
    """An UpstreamTlsContext (A29): the CA from certificate provider instance
    ``ca_instance``, the client identity from ``identity_instance`` (mTLS),
    ``san_matchers`` as StringMatcher kwargs (``{"exact": "x"}``,
    ``{"prefix": "spiffe://", "ignore_case": True}``, ``{"safe_regex": ".*"}``);
    ``sni``, ``auto_host_sni``, ``auto_sni_san_validation`` as A101."""
    from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

    common = tls_pb2.CommonTlsContext()
    if identity_instance is not None:
        common.tls_certificate_provider_instance.instance_name = identity_instance
    vc = common.validation_context
    if ca_instance is not None:
        vc.ca_certificate_provider_instance.instance_name = ca_instance
    for m in san_matchers:
        vc.match_subject_alt_names.append(
            _string_matcher(
                m.get("exact"),
                m.get("prefix"),
                m.get("suffix"),
                m.get("contains"),
                m.get("safe_regex"),
                bool(m.get("ignore_case", False)),
            )
        )
    if not vc.ByteSize():
        common.ClearField("validation_context")
    return tls_pb2.UpstreamTlsContext(
        common_tls_context=common,
        sni=sni,
        auto_host_sni=auto_host_sni,
        auto_sni_san_validation=auto_sni_san_validation,
    )


_HEALTH = {
    name: health_check_pb2.HealthStatus.Value(name)
    for name in health_check_pb2.HealthStatus.keys()  # noqa: SIM118 - enum wrapper
}


def endpoint(
    address: str,
    weight: int | None = None,
    health_status: str | int = "UNKNOWN",
    hostname: str = "",
) -> endpoint_components_pb2.LbEndpoint:
    """One LbEndpoint at ``"host:port"`` with an optional weight and a health status name."""
    host, port = _split_address(address)
    if isinstance(health_status, str):
        if health_status not in _HEALTH:
            raise ValueError(f"endpoint {address}: unknown health_status {health_status!r}")
        health_status = _HEALTH[health_status]
    lb = endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(
            address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(address=host, port_value=port)
            ),
            hostname=hostname,
        ),
        health_status=health_status,
    )
    if weight is not None:
        lb.load_balancing_weight.value = weight
    return lb


def locality(
    region: str = "",
    zone: str = "",
    sub_zone: str = "",
    weight: int | None = 1,
    priority: int = 0,
    endpoints: Iterable[str | endpoint_components_pb2.LbEndpoint] = (),
) -> endpoint_components_pb2.LocalityLbEndpoints:
    """A locality's endpoints (strings are ``"host:port"``); ``weight=None`` leaves it unset."""
    out = endpoint_components_pb2.LocalityLbEndpoints(
        locality=base_pb2.Locality(region=region, zone=zone, sub_zone=sub_zone),
        lb_endpoints=[endpoint(e) if isinstance(e, str) else e for e in endpoints],
        priority=priority,
    )
    if weight is not None:
        out.load_balancing_weight.value = weight
    return out


def endpoints(
    cluster_name: str,
    localities: Iterable[endpoint_components_pb2.LocalityLbEndpoints] = (),
    drop_overloads: Mapping[str, int] | None = None,
) -> endpoint_pb2.ClusterLoadAssignment:
    """A ClusterLoadAssignment; ``drop_overloads`` maps category to parts per million."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster_name, endpoints=list(localities))
    for category, ppm in (drop_overloads or {}).items():
        cla.policy.drop_overloads.add(
            category=category,
            drop_percentage=percent_pb2.FractionalPercent(
                numerator=ppm, denominator=percent_pb2.FractionalPercent.MILLION
            ),
        )
    return cla
