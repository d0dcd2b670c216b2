"""Validated xDS resources as frozen values (gRFC A27, A28, A31, A37, A52, A61).

Every class here is a frozen dataclass with structural equality: decoding the
same bytes twice gives equal (and, where practical, hashable) objects, so "the
same resource twice" is a no-op all the way down (TRAPS.md, "configs and
equality").  Sequences are tuples, maps are tuples of pairs or JSON strings.

Compiled RE2 regexes ride along in fields excluded from comparison and
hashing (``compare=False``), so matching never recompiles and equality is
decided by the regex text alone.

Shapes, one per resource type:

* :class:`Listener` (LDS): the HttpConnectionManager of an ``api_listener``.
* :class:`RouteConfiguration` (RDS or inline): virtual hosts, routes, actions.
* :class:`Cluster` (CDS): EDS, LOGICAL_DNS or aggregate, plus the gRPC LB
  config list (A52) as canonical JSON.
* :class:`ClusterLoadAssignment` (EDS): priorities of localities of endpoints,
  already normalised (weight-0 localities dropped, unhealthy endpoints
  excluded, priorities contiguous from 0).
"""

from __future__ import annotations

import json
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal, Union

from pyxds._values import dataclass

if TYPE_CHECKING:
    from re2 import _Regexp  # google-re2's compiled pattern (typings/re2.pyi)

    from pyxds.xds.resources.server_types import TcpListener

__all__ = [
    "ascii_lower",
    "HttpFilter",
    "Listener",
    "PrefixMatch",
    "PathMatch",
    "RegexMatch",
    "PathSpecifier",
    "FractionalPercent",
    "HeaderMatcher",
    "RouteMatch",
    "ClusterWeight",
    "HashPolicy",
    "RetryPolicy",
    "RouteAction",
    "NonForwardingAction",
    "UnsupportedAction",
    "Route",
    "VirtualHost",
    "ClusterSpecifierPlugin",
    "RouteConfiguration",
    "Cluster",
    "LocalityName",
    "EndpointAddress",
    "Locality",
    "DropOverload",
    "ClusterLoadAssignment",
    "DecodeResult",
    "UINT32_MAX",
]

UINT32_MAX = 0xFFFFFFFF


# --------------------------------------------------------------------------- LDS


@dataclass(frozen=True, slots=True)
class HttpFilter:
    """One entry of HttpConnectionManager.http_filters, its config kept opaque.

    ``type_url`` is the type of the filter config (for a TypedStruct, the
    wrapped type); ``config`` is the serialized typed config bytes.
    ``disabled``: the filter runs only where a ``typed_per_filter_config``
    override configures it (Envoy's meaning, as C-core 1.85 applies it;
    :func:`pyxds.resolver.http_filters.build_chain`).
    """

    name: str
    type_url: str
    config: bytes = b""
    is_optional: bool = False
    disabled: bool = False


@dataclass(frozen=True, slots=True)
class Listener:
    """An LDS resource (A27 "Listener Proto").

    Exactly one of ``route_config_name`` (RDS) and ``route_config`` (inline)
    is set for an API listener.  ``api_listener`` is False for a listener
    without an api_listener (a server/socket listener): it decodes, and the
    resolver reports "not an API listener".
    """

    name: str
    route_config_name: str | None = None
    route_config: RouteConfiguration | None = None
    http_filters: tuple[HttpFilter, ...] = ()
    max_stream_duration: float | None = None
    api_listener: bool = True
    #: A server listener (no ``api_listener``): the validated TCP listener (A36).
    tcp_listener: TcpListener | None = None


# --------------------------------------------------------------------------- RDS


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Path prefix match ("" matches every path)."""

    prefix: str


@dataclass(frozen=True, slots=True)
class PathMatch:
    """Exact path match."""

    path: str


@dataclass(frozen=True)
class RegexMatch:
    """Full-match of the path against an RE2 regex.

    ``regex`` is the compiled ``re2`` pattern (excluded from equality).
    """

    regex_str: str
    regex: _Regexp | None = field(default=None, compare=False, hash=False, repr=False)


PathSpecifier = Union[PrefixMatch, PathMatch, RegexMatch]


@dataclass(frozen=True, slots=True)
class FractionalPercent:
    """A fraction ``numerator / denominator``; denominator is 100, 10_000 or 1_000_000."""

    numerator: int
    denominator: int = 100

    @property
    def per_million(self) -> int:
        """The fraction in parts per million, clamped to 1_000_000."""
        return min(self.numerator * (1_000_000 // self.denominator), 1_000_000)


HeaderMatchKind = Literal["exact", "safe_regex", "range", "present", "prefix", "suffix", "contains"]


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def ascii_lower(text: str) -> str:
    """``text`` with ASCII letters lowercased, nothing else: C-core's
    ``ignore_case`` matching (absl's ``EqualsIgnoreCase``,
    ``AsciiStrToLower``).  Python's ``str.lower()`` also folds non-ASCII
    letters, some into ASCII (U+212A KELVIN SIGN -> "k")."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


@dataclass(frozen=True)
class HeaderMatcher:
    """A route's header matcher (A28 "Header matching").

    ``kind`` is one of exact, safe_regex, range, present, prefix, suffix,
    contains.  A ``string_match`` matcher is normalised to the kind of its
    inner StringMatcher with ``ignore_case`` taken from it (so the matching
    code needs one path per kind).  ``value`` is the string (or regex text)
    for string kinds; ``range_start``/``range_end`` for range (start
    inclusive, end exclusive); ``present_match`` for present.
    ``invert_match`` inverts the result, but an absent header never matches
    unless the matcher is ``present`` (Envoy semantics, grpc-go#4902): that
    rule belongs to the matcher, see :meth:`matches`.
    """

    name: str
    kind: str
    value: str | None = None
    invert_match: bool = False
    present_match: bool = False
    range_start: int = 0
    range_end: int = 0
    ignore_case: bool = False
    regex: _Regexp | None = field(default=None, compare=False, hash=False, repr=False)

    def matches(self, header_value: str | None) -> bool:
        """Evaluate against the (comma-joined) header value, None when absent."""
        kind = self.kind
        if kind == "present":
            present = (header_value is not None) == self.present_match
            return present != self.invert_match
        if header_value is None:
            return False
        value = self.value  # set for the string kinds (None never matches)
        if kind == "exact":
            if self.ignore_case:
                r = value is not None and ascii_lower(header_value) == ascii_lower(value)
            else:
                r = header_value == value
        elif kind == "safe_regex":
            r = self.regex is not None and self.regex.fullmatch(header_value) is not None
        elif kind == "range":
            # Like absl::SimpleAtoi: optional sign and surrounding spaces, ASCII
            # digits only (Python's int() would also take "1_0" and non-ASCII digits).
            text = header_value.strip()
            digits = text[1:] if text[:1] in ("+", "-") else text
            if digits.isascii() and digits.isdigit():
                r = self.range_start <= int(text) < self.range_end
            else:
                r = False
        elif kind == "prefix":
            if value is None:
                r = False
            elif self.ignore_case:
                r = ascii_lower(header_value).startswith(ascii_lower(value))
            else:
                r = header_value.startswith(value)
        elif kind == "suffix":
            if value is None:
                r = False
            elif self.ignore_case:
                r = ascii_lower(header_value).endswith(ascii_lower(value))
            else:
                r = header_value.endswith(value)
        elif kind == "contains":
            if value is None:
                r = False
            elif self.ignore_case:
                r = ascii_lower(value) in ascii_lower(header_value)
            else:
                r = value in header_value
        else:
            r = False
        return r != self.invert_match


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """A route's match (A28 "Route matching").

    ``case_sensitive`` applies to prefix and path (the regex is always case
    sensitive).  ``runtime_fraction`` is the default value of the runtime
    fraction, or None when absent.
    """

    path_specifier: PathSpecifier
    case_sensitive: bool = True
    headers: tuple[HeaderMatcher, ...] = ()
    runtime_fraction: FractionalPercent | None = None


@dataclass(frozen=True, slots=True)
class ClusterWeight:
    """One weighted cluster of a route."""

    name: str
    weight: int
    #: A39 ``typed_per_filter_config``: (filter name, config type, config bytes)
    filter_overrides: tuple[tuple[str, str, bytes], ...] = ()


@dataclass(frozen=True)
class HashPolicy:
    """A route hash policy for ring_hash (A42): ``header`` or ``channel_id``.

    For ``header``, ``header_name`` and optional regex rewrite
    (``regex_str``/``substitution``, compiled ``regex`` excluded from equality).
    """

    kind: str
    terminal: bool = False
    header_name: str = ""
    regex_str: str | None = None
    substitution: str = ""
    regex: Any = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A route retry policy (A44): retryable status codes and backoff."""

    retry_on: tuple[str, ...] = ()
    num_retries: int = 1
    base_interval: float = 0.025
    max_interval: float = 0.25


@dataclass(frozen=True, slots=True)
class RouteAction:
    """A forwarding route action (A28, A31).

    Exactly one of ``cluster``, ``weighted_clusters`` and
    ``cluster_specifier_plugin`` is set.  ``max_stream_duration`` is A31's
    effective per-route value: ``grpc_timeout_header_max`` if set, else
    ``max_stream_duration``, else None (the listener's value applies).
    ``RouteAction.timeout`` has no field here: gRPC does not support it (A31).
    ``auto_host_rewrite`` (A81): the route's value when the resource came
    from a server with the ``trusted_xds_server`` feature, else False.
    """

    cluster: str | None = None
    weighted_clusters: tuple[ClusterWeight, ...] | None = None
    cluster_specifier_plugin: str | None = None
    max_stream_duration: float | None = None
    hash_policies: tuple[HashPolicy, ...] = ()
    retry_policy: RetryPolicy | None = None
    auto_host_rewrite: bool = False

    @property
    def total_weight(self) -> int:
        """Sum of the weighted clusters' weights (0 for a single cluster)."""
        if self.weighted_clusters is None:
            return 0
        return sum(cw.weight for cw in self.weighted_clusters)


@dataclass(frozen=True, slots=True)
class NonForwardingAction:
    """A route with a non_forwarding_action (servers only; clients fail the RPC)."""


@dataclass(frozen=True, slots=True)
class UnsupportedAction:
    """A route whose action is neither ``route`` nor ``non_forwarding_action``
    (redirect, direct_response, filter_action, none): clients and servers
    both fail RPCs that match it with UNAVAILABLE (A28, A36)."""

    kind: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """One route: match plus action."""

    match: RouteMatch
    action: RouteAction | NonForwardingAction | UnsupportedAction
    name: str = ""
    #: A39 ``typed_per_filter_config``: (filter name, config type, config bytes)
    filter_overrides: tuple[tuple[str, str, bytes], ...] = ()

    @property
    def max_stream_duration(self) -> float | None:
        """A31 effective per-route max stream duration (None: use the listener's)."""
        a = self.action
        return a.max_stream_duration if isinstance(a, RouteAction) else None


@dataclass(frozen=True, slots=True)
class VirtualHost:
    """A virtual host: domains (matched per A27) and ordered routes."""

    name: str
    domains: tuple[str, ...]
    routes: tuple[Route, ...]
    retry_policy: RetryPolicy | None = None
    #: A39 ``typed_per_filter_config``: (filter name, config type, config bytes)
    filter_overrides: tuple[tuple[str, str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSpecifierPlugin:
    """A cluster specifier plugin of a RouteConfiguration that some route
    names: its config type and bytes, and ``lb_config``, the LB policy
    config (JSON text of a ``loadBalancingConfig`` list) of the
    cluster_manager child its routes go to (RLS: ``rls_experimental``)."""

    name: str
    type_url: str
    config: bytes = b""
    is_optional: bool = False
    lb_config: str = ""


@dataclass(frozen=True, slots=True)
class RouteConfiguration:
    """An RDS resource (or the route_config inlined in a Listener)."""

    name: str
    virtual_hosts: tuple[VirtualHost, ...]
    cluster_specifier_plugins: tuple[ClusterSpecifierPlugin, ...] = ()


# --------------------------------------------------------------------------- CDS


#: A55/A75: the EDS health statuses a session may stay on when the cluster
#: does not say (``common_lb_config.override_host_status`` unset).
DEFAULT_OVERRIDE_HOST_STATUSES = frozenset({"UNKNOWN", "HEALTHY"})


@dataclass(frozen=True, slots=True)
class BackendMetricPropagation:
    """Which ORCA fields a cluster's load reports carry (gRFC A85, the
    parsed ``lrs_report_endpoint_metrics``): the three top-level
    utilizations, every ``named_metrics`` key (``named_all``) or the keys
    named.  ``legacy`` is A64's rule (every named metric under its own
    name), used when GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION is false."""

    cpu_utilization: bool = False
    mem_utilization: bool = False
    application_utilization: bool = False
    named_all: bool = False
    named_keys: frozenset[str] = frozenset()
    legacy: bool = False

    @property
    def empty(self) -> bool:
        return not (
            self.cpu_utilization
            or self.mem_utilization
            or self.application_utilization
            or self.named_all
            or self.named_keys
            or self.legacy
        )

    def __str__(self) -> str:
        """C-core's AsString: ``{cpu_utilization,...,named_metrics.foo}``."""
        if self.legacy:
            return "{legacy: named_metrics}"
        parts = [
            name
            for name, on in (
                ("cpu_utilization", self.cpu_utilization),
                ("mem_utilization", self.mem_utilization),
                ("application_utilization", self.application_utilization),
            )
            if on
        ]
        if self.named_all:
            parts.append("named_metrics.*")
        else:
            parts.extend(f"named_metrics.{key}" for key in sorted(self.named_keys))
        return "{" + ",".join(parts) + "}"


NO_PROPAGATION = BackendMetricPropagation()


@dataclass(frozen=True, slots=True)
class Cluster:
    """A CDS resource (A27, A37, A52).

    ``kind`` is "EDS", "LOGICAL_DNS" or "AGGREGATE".  For EDS,
    ``eds_service_name`` is the EDS resource name to watch (None: use the
    cluster name, see :meth:`eds_resource_name`).  For LOGICAL_DNS,
    ``dns_hostname``/``dns_port``.  For AGGREGATE, ``aggregate_children`` in
    priority order.

    ``lb_policy_config`` is the gRPC LB policy config list (A52) as canonical
    JSON text, e.g. ``[{"xds_wrr_locality_experimental": {"childPolicy":
    [{"round_robin": {}}]}}]``; :meth:`lb_policy_json` returns a fresh copy.
    ``max_requests`` is the DEFAULT-priority circuit breaker (1024 unset).
    ``lrs_server`` is True when ``lrs_server`` is ``self`` (load reporting to
    the xDS server).  ``transport_socket`` is the serialized typed config of
    the transport socket, or None; ``security`` its validated
    UpstreamTlsContext (A29).
    ``idle_timeout`` is A75's upstream idle timeout in seconds (1 hour unset).
    ``outlier_detection`` is the ``outlier_detection_experimental`` config
    (A50, canonical JSON without ``childPolicy``) when the cluster sets
    ``outlier_detection``, else None (the cds policy then uses a no-op one).
    ``override_host_statuses`` (A55, A75) are the EDS health status names a
    stateful session may stay on (``common_lb_config.override_host_status``;
    UNKNOWN and HEALTHY when unset).  ``lrs_metrics`` (A64/A85) says which
    ORCA fields go into the cluster's load reports.
    """

    name: str
    kind: str
    eds_service_name: str | None = None
    dns_hostname: str | None = None
    dns_port: int | None = None
    aggregate_children: tuple[str, ...] = ()
    lb_policy_config: str = (
        '[{"xds_wrr_locality_experimental": {"childPolicy": [{"round_robin": {}}]}}]'
    )
    max_requests: int = 1024
    lrs_server: bool = False
    transport_socket: bytes | None = None
    transport_socket_type_url: str | None = None
    idle_timeout: float = 3600.0
    outlier_detection: str | None = None
    #: A29: the validated UpstreamTlsContext
    #: (:class:`pyxds.security.tls_config.UpstreamTlsConfig`), None without TLS.
    security: Any = None
    override_host_statuses: frozenset[str] = DEFAULT_OVERRIDE_HOST_STATUSES
    lrs_metrics: BackendMetricPropagation = NO_PROPAGATION

    def lb_policy_json(self) -> list[dict[str, Any]]:
        """The LB config list as a fresh list of dicts (safe to mutate)."""
        config: list[dict[str, Any]] = json.loads(self.lb_policy_config)
        return config

    @property
    def eds_resource_name(self) -> str:
        """The EDS resource to watch: ``eds_service_name`` or else the cluster name."""
        return self.eds_service_name or self.name

    @property
    def dns_target(self) -> str | None:
        """``host:port`` for LOGICAL_DNS (IPv6 literals bracketed), else None."""
        if self.dns_hostname is None:
            return None
        host = self.dns_hostname
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.dns_port}"


# --------------------------------------------------------------------------- EDS


@dataclass(frozen=True, slots=True, order=True)
class LocalityName:
    """A locality identity (region, zone, sub_zone); ordered and hashable."""

    region: str = ""
    zone: str = ""
    sub_zone: str = ""

    def __str__(self) -> str:
        return f"{{region={self.region}, zone={self.zone}, sub_zone={self.sub_zone}}}"

    def to_json(self) -> dict[str, str]:
        """The locality as a JSON object (for hierarchical child names)."""
        return {"region": self.region, "zone": self.zone, "subZone": self.sub_zone}


@dataclass(frozen=True, slots=True)
class EndpointAddress:
    """One endpoint: its addresses ("host:port", IPv6 bracketed; the first is
    the primary, the rest A61 additional_addresses), LB weight (default 1),
    health status name (UNKNOWN, HEALTHY or DRAINING: others are excluded
    when decoding; a DRAINING endpoint is kept for A55 session affinity but
    is not usable for new traffic, :attr:`usable`),
    ``endpoint.hostname`` ("" when unset) and ``hash_key``, the string
    ``metadata.filter_metadata["envoy.lb"]["hash_key"]`` (gRFC A76; "" when
    unset or not a string).
    """

    addresses: tuple[str, ...]
    weight: int = 1
    health_status: str = "UNKNOWN"
    hostname: str = ""
    hash_key: str = ""

    @property
    def usable(self) -> bool:
        """False for a DRAINING endpoint (A55: no new traffic)."""
        return self.health_status != "DRAINING"


@dataclass(frozen=True, slots=True)
class Locality:
    """One locality of one priority with its endpoints (DRAINING ones
    included, A55)."""

    name: LocalityName
    weight: int
    endpoints: tuple[EndpointAddress, ...]
    priority: int = 0

    @property
    def usable_count(self) -> int:
        """Endpoints that take new traffic (not DRAINING)."""
        return sum(1 for e in self.endpoints if e.health_status != "DRAINING")


@dataclass(frozen=True, slots=True)
class DropOverload:
    """An EDS drop category with its rate in parts per million."""

    category: str
    parts_per_million: int


@dataclass(frozen=True, slots=True)
class ClusterLoadAssignment:
    """An EDS resource (A27 "ClusterLoadAssignment Proto").

    ``priorities[i]`` are the localities of priority ``i`` (contiguous from
    0).  ``excluded_endpoints`` counts endpoints dropped for their health
    status (UNHEALTHY, TIMEOUT, DEGRADED); DRAINING ones are kept in their
    locality (A55) but are not usable, so "all endpoints unhealthy" can be
    said exactly; ``ignored_localities`` names the localities dropped
    because their ``load_balancing_weight`` is unset or 0 (A27), in
    resource order.
    """

    cluster_name: str
    priorities: tuple[tuple[Locality, ...], ...] = ()
    drop_overloads: tuple[DropOverload, ...] = ()
    excluded_endpoints: int = 0
    ignored_localities: tuple[LocalityName, ...] = ()

    @property
    def endpoint_count(self) -> int:
        """Number of usable (not DRAINING) endpoints over all priorities."""
        return sum(loc.usable_count for p in self.priorities for loc in p)

    @property
    def draining_count(self) -> int:
        """Number of DRAINING endpoints over all priorities (A55)."""
        return sum(len(loc.endpoints) - loc.usable_count for p in self.priorities for loc in p)

    @property
    def all_endpoints_unhealthy(self) -> bool:
        """True when there are no usable endpoints but some were excluded
        for health or are DRAINING."""
        return (self.excluded_endpoints > 0 or self.draining_count > 0) and (
            self.endpoint_count == 0
        )

    @property
    def no_endpoints_reason(self) -> str:
        """Why no endpoint is usable, in the words ``pyxds serve``, ``pyxds
        inspect`` and RPC errors share ("locality without weight ignored");
        meaningful when :attr:`endpoint_count` is 0."""
        parts = []
        ignored = len(self.ignored_localities)
        if ignored:
            parts.append(
                "locality without weight ignored"
                if ignored == 1
                else f"{ignored} localities without weight ignored"
            )
        if self.excluded_endpoints or self.draining_count:
            parts.append("all endpoints unhealthy")
        else:
            empty = sum(1 for p in self.priorities for loc in p if not loc.usable_count)
            if empty:
                parts.append(
                    "locality without endpoints"
                    if empty == 1
                    else f"{empty} localities without endpoints"
                )
        return "; ".join(parts) or "no localities"


# --------------------------------------------------------------------------- decode


Resource = Union[Listener, RouteConfiguration, Cluster, ClusterLoadAssignment]


@dataclass(frozen=True, slots=True)
class DecodeResult:
    """Result of decoding one resource.

    ``name`` is None only when the bytes could not be parsed at all;
    otherwise exactly one of ``resource`` and ``error`` is set and ``error``
    names the offending field.
    """

    name: str | None
    resource: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
