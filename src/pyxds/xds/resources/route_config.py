"""RouteConfiguration validation (A27 "RouteConfiguration Proto", A28 "Response
validation" as in today's text, A31 timeouts, A42 hash policies, A44 retries).

Rules, in the order they are applied to each route (C-core's where the
gRFCs leave room):

* ``match`` must be present; ``match.query_parameters`` present: the route
  is ignored (A28), before anything else is looked at.
* ``match.path_specifier`` must be ``prefix``, ``path`` or ``safe_regex``
  (anything else, or none, is an error).  A route that can never match a
  ``/service/method`` path is ignored: a non-empty prefix not starting with
  ``/``, with more than two ``/`` or starting with ``//``; a path that is not
  exactly ``/service/method``.
* ``safe_regex`` patterns (path, header, hash-policy rewrite) compile with RE2;
  a pattern RE2 rejects is an error naming the field.
* ``case_sensitive`` (default true) applies to prefix/path and the regex.
* Header matchers: exact / safe_regex / range (start <= end) / present /
  prefix / suffix / contains / string_match (normalised to its inner kind
  with ``ignore_case``); none set, or a ``custom`` string matcher, is an error.
* ``runtime_fraction``: only ``default_value`` is used; without one there is
  no fraction matcher.
* Action ``route``: ``cluster`` (non-empty) / ``weighted_clusters`` (each
  weight present, zero weights dropped, names non-empty, sum > 0 and <=
  uint32 max; ``total_weight``, deprecated, is ignored as C-core, grpc-go
  and grpc-java do, although A28's text asks that it equal the sum) /
  ``cluster_specifier_plugin`` (non-empty, must name a declared plugin; a
  declared optional plugin we do not support makes the route ignored).  Any
  other or unset cluster specifier (``cluster_header``, unknown fields): the
  route is ignored (A28 latest).
* Action ``non_forwarding_action``: :class:`NonForwardingAction` (what
  servers expect, A36); another action (redirect, direct_response,
  filter_action, none): :class:`UnsupportedAction`.  A client fails an RPC
  matching either (C-core: "Matching route has inappropriate action"); a
  server fails one matching the latter with UNAVAILABLE.
* ``max_stream_duration`` (A31): ``grpc_timeout_header_max`` if set, else
  ``max_stream_duration``.  ``RouteAction.timeout`` is not read at all (A31:
  gRPC does not support it; C-core accepts any value there, even negative).
* Retry policy (A44): the route's, else its virtual host's.
* ``typed_per_filter_config`` of virtual hosts, routes and weighted
  clusters (A39, as C-core): non-empty keys, configs of a filter type this
  client knows (the fault filter) unless marked optional by a
  ``FilterConfig`` wrapper; the router takes no override.  Kept per level as
  ``filter_overrides`` (a ``FilterConfig`` with ``disabled`` marked by
  ``_common.DISABLED_PREFIX``; applied by ``_common.effective_override``).
* ``virtual_hosts[i].domains`` must be non-empty, each non-empty and with a
  ``*`` only as its first or last character.

Hot loop note: this runs over every route of a large RouteConfiguration, so
it binds attributes to locals, asks ``HasField`` only when a cheap read
cannot answer, builds error paths only on error, and shares identical
action / match values between routes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyxds.xds import descriptors
from pyxds.xds.resources._common import (
    RLS_PLUGIN_TYPE,
    Errors,
    check_filter_overrides,
    duration,
    filter_overrides,
    re2_compile,
    rls_enabled,
)
from pyxds.xds.resources.types import UINT32_MAX as UINT32_MAX_
from pyxds.xds.resources.types import (
    ClusterSpecifierPlugin,
    ClusterWeight,
    FractionalPercent,
    HashPolicy,
    HeaderMatcher,
    NonForwardingAction,
    PathMatch,
    PathSpecifier,
    PrefixMatch,
    RegexMatch,
    RetryPolicy,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    UnsupportedAction,
    VirtualHost,
)

if TYPE_CHECKING:
    from envoy.config.route.v3 import route_pb2
else:  # loaded on first use without the generated modules (pyxds.xds.descriptors)
    route_pb2 = descriptors.module("envoy.config.route.v3.route_pb2")

__all__ = ["parse_route_configuration", "SUPPORTED_CLUSTER_SPECIFIER_PLUGINS"]

#: Cluster specifier plugin config types this client implements (RLS).
SUPPORTED_CLUSTER_SPECIFIER_PLUGINS: frozenset[str] = frozenset({RLS_PLUGIN_TYPE})

_DENOMINATORS = (100, 10_000, 1_000_000)  # FractionalPercent.DenominatorType
_RETRYABLE_CODES = frozenset(
    {"cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable"}
)
_NON_FORWARDING = NonForwardingAction()
# Frozen slotted dataclasses built in the per-route loop go through their slot
# descriptors (equal values, half the cost of calling the class).
_new = object.__new__
_set_path: Callable[[PathMatch, str], None] = vars(PathMatch)["path"].__set__
_set_spec: Callable[[RouteMatch, PathSpecifier], None] = vars(RouteMatch)["path_specifier"].__set__
_set_case: Callable[[RouteMatch, bool], None] = vars(RouteMatch)["case_sensitive"].__set__
_set_headers: Callable[[RouteMatch, tuple[HeaderMatcher, ...]], None] = vars(RouteMatch)[
    "headers"
].__set__
_set_fraction: Callable[[RouteMatch, FractionalPercent | None], None] = vars(RouteMatch)[
    "runtime_fraction"
].__set__
_set_match: Callable[[Route, RouteMatch], None] = vars(Route)["match"].__set__
_set_action: Callable[[Route, RouteAction | NonForwardingAction | UnsupportedAction], None] = vars(
    Route
)["action"].__set__
_set_name: Callable[[Route, str], None] = vars(Route)["name"].__set__
_set_overrides: Callable[[Route, tuple[tuple[str, str, bytes], ...]], None] = vars(Route)[
    "filter_overrides"
].__set__
_PREFIX_ALL = PrefixMatch("")
_BAD_REGEX = "Invalid regex string specified in matcher: "  # C-core's StringMatcher words
# Keys of the per-decode sharing cache: cluster names are str, so every
# other kind of key is a tuple and cannot collide with a cluster name.
_MATCH_ALL_KEY = ("match_all",)
# The sharing cache of one decode: the key says what the value is (a cluster
# name: its RouteAction; ("p", prefix): a PrefixMatch; ("match_all",): the
# match-all RouteMatch; a tuple of (name, weight, overrides) triples: a
# weighted-clusters RouteAction).
_ShareCache = dict[str | tuple[Any, ...], Any]


def parse_route_configuration(
    rc: Any, errs: Errors, path: str = "", trusted: bool = False
) -> RouteConfiguration:
    """Validate a ``envoy.config.route.v3.RouteConfiguration`` message.

    ``path`` is the field path of ``rc`` itself ("" for an RDS resource,
    ``"...route_config"`` when inlined in a Listener); errors go to ``errs``.
    ``trusted``: the resource came from a server with the bootstrap feature
    ``trusted_xds_server``, so ``RouteAction.auto_host_rewrite`` is read (A81
    "xDS Resource Validation"; otherwise it is ignored, as in C-core).
    """
    pre = f"{path}." if path else ""
    rls = rls_enabled()
    if rls and rc.cluster_specifier_plugins:
        # loaded with the first RouteConfiguration that declares a plugin
        from pyxds.xds.resources.cluster_specifier import parse_cluster_specifier_plugins

        parsed = parse_cluster_specifier_plugins(rc, errs, pre)
        declared: set[str] | None = parsed.declared
        ignored_plugins = parsed.optional_unsupported
    else:
        parsed = None
        declared = set() if rls else None  # None: plugin routes are ignored
        ignored_plugins = set()
    vhosts = []
    # Values shared between routes: identical clusters and matches become one object.
    cache: _ShareCache = {}
    for vi, vh in enumerate(rc.virtual_hosts):
        domains = tuple(vh.domains)
        if not domains:
            errs.add(f"{pre}virtual_hosts[{vi}].domains", "must be non-empty")
        for di, d in enumerate(domains):
            if not _valid_domain(d):
                errs.add(f"{pre}virtual_hosts[{vi}].domains[{di}]", f'invalid domain pattern "{d}"')
        vh_overrides: tuple[tuple[str, str, bytes], ...] = ()
        if vh.typed_per_filter_config:
            p = f"{pre}virtual_hosts[{vi}].typed_per_filter_config"
            n_errors = len(errs)
            check_filter_overrides(vh.typed_per_filter_config, p, errs)
            if len(errs) == n_errors:
                vh_overrides = filter_overrides(vh.typed_per_filter_config)
        retry = None
        if vh.HasField("retry_policy"):
            retry = _parse_retry(vh.retry_policy, errs, f"{pre}virtual_hosts[{vi}].retry_policy")
        routes: list[Route] = []
        append = routes.append
        for ri, r in enumerate(vh.routes):
            route = _parse_route(r, errs, pre, vi, ri, cache, declared, ignored_plugins, trusted)
            if route is not None:
                if retry is not None:
                    route = _with_vhost_retry(route, retry)
                append(route)
        vhosts.append(VirtualHost(vh.name, domains, tuple(routes), retry, vh_overrides))
    plugins: tuple[ClusterSpecifierPlugin, ...] = ()
    if parsed is not None and parsed.supported:
        used = {
            r.action.cluster_specifier_plugin
            for v in vhosts
            for r in v.routes
            if isinstance(r.action, RouteAction)
        }
        plugins = tuple(p for name, p in parsed.supported.items() if name in used)
    return RouteConfiguration(rc.name, tuple(vhosts), plugins)


def _with_vhost_retry(route: Route, retry: RetryPolicy) -> Route:
    """A route without its own retry policy takes its virtual host's (A44)."""
    action = route.action
    if isinstance(action, RouteAction) and action.retry_policy is None:
        return Route(
            route.match,
            dataclasses.replace(action, retry_policy=retry),
            route.name,
            route.filter_overrides,
        )
    return route


def _valid_domain(d: str) -> bool:
    """C-core's rule: exact (no ``*``), or ``*`` first (suffix) or last (prefix)."""
    if not d:
        return False
    return "*" not in d or d[0] == "*" or d[-1] == "*"


def _prefix_can_match(prefix: str) -> bool:
    """A non-empty prefix can match "/service/method" only if it starts with
    "/", has at most one more "/", and does not start with "//"."""
    if prefix[0] != "/":
        return False
    i = prefix.find("/", 1)
    return i < 0 or (i > 1 and prefix.find("/", i + 1) < 0)


def _path_can_match(path: str) -> bool:
    """A path can match only if it is exactly "/service/method", both non-empty."""
    if not path or path[0] != "/":
        return False
    i = path.find("/", 1)
    return 1 < i < len(path) - 1 and path.find("/", i + 1) < 0


def _route_path(pre: str, vi: int, ri: int) -> str:
    return f"{pre}virtual_hosts[{vi}].routes[{ri}]"


def _parse_route(
    r: Any,
    errs: Errors,
    pre: str,
    vi: int,
    ri: int,
    cache: _ShareCache,
    declared: set[str] | None,
    ignored_plugins: set[str],
    trusted: bool = False,
) -> Route | None:
    m = r.match
    # One ListFields() call tells which match fields are set (cheaper than a
    # HasField/WhichOneof per field); field numbers per route_components.proto.
    spec_field: tuple[int, Any] | None = None
    case_sensitive = True
    headers: tuple[HeaderMatcher, ...] = ()
    header_msgs = None
    fraction = None
    fraction_msg = None
    for fd, value in m.ListFields():
        num = fd.number
        if num == 1 or num == 2 or num == 10:  # prefix, path, safe_regex
            spec_field = (num, value)
        elif num == 4:  # case_sensitive (BoolValue)
            case_sensitive = value.value
        elif num == 6:  # headers (parsed below, once the route is known to count)
            header_msgs = value
        elif num == 7:  # query_parameters: A28, the route is ignored
            return None
        elif num == 9:  # runtime_fraction
            fraction_msg = value
        elif num == 12 or num == 14 or num == 15:  # other path specifiers
            spec_field = (num, fd.name)
    if spec_field is None:
        # An explicitly empty prefix is still "set" (a oneof member), in case
        # ListFields omits it: ask the oneof.
        if m.WhichOneof("path_specifier") == "prefix":
            spec_field = (1, "")
        elif not r.HasField("match"):
            errs.add(f"{_route_path(pre, vi, ri)}.match", "field not present")
            return None
        else:  # C-core's words and field
            errs.add(f"{_route_path(pre, vi, ri)}.match", "invalid path specifier")
            return None
    spec_value: Any  # the field's value (a str, a RegexMatcher) or its name
    num, spec_value = spec_field
    spec: PathSpecifier
    if num == 1:
        if not spec_value:
            spec = _PREFIX_ALL
        elif not _prefix_can_match(spec_value):
            return None  # can never match a gRPC path: ignored (as C-core)
        else:
            key = ("p", spec_value)
            shared: PrefixMatch | None = cache.get(key)
            if shared is None:
                shared = cache[key] = PrefixMatch(spec_value)
            spec = shared
    elif num == 2:
        if not _path_can_match(spec_value):
            return None
        spec = _new(PathMatch)
        _set_path(spec, spec_value)
    elif num == 10:
        pattern = spec_value.regex
        rx, problem = re2_compile(pattern, case_sensitive)
        if rx is None:  # C-core's words and field
            errs.add(
                f"{_route_path(pre, vi, ri)}.match",
                f"error creating path matcher: {_BAD_REGEX}{problem}",
            )
            return None
        spec = RegexMatch(pattern, rx)
    else:
        # path_separated_prefix, path_match_policy, ...: C-core's words and field
        errs.add(f"{_route_path(pre, vi, ri)}.match", "invalid path specifier")
        return None
    if header_msgs is not None:
        headers = tuple(
            h
            for h in (
                _parse_header(h, errs, f"{_route_path(pre, vi, ri)}.match.headers[{hi}]")
                for hi, h in enumerate(header_msgs)
            )
            if h is not None
        )
    if fraction_msg is not None and fraction_msg.HasField("default_value"):
        # Only default_value is used (A28); without one the route has no
        # fraction matcher at all (as C-core), not a 0% one.
        dv = fraction_msg.default_value
        den = dv.denominator
        if 0 <= den < 3:
            fraction = FractionalPercent(dv.numerator, _DENOMINATORS[den])
        else:
            errs.add(
                f"{_route_path(pre, vi, ri)}.match.runtime_fraction.default_value.denominator",
                "unknown denominator type",
            )
    if spec is _PREFIX_ALL and case_sensitive and not headers and fraction is None:
        match = cache.get(_MATCH_ALL_KEY)
        if match is None:
            match = cache[_MATCH_ALL_KEY] = RouteMatch(spec)
    else:
        match = _new(RouteMatch)
        _set_spec(match, spec)
        _set_case(match, case_sensitive)
        _set_headers(match, headers)
        _set_fraction(match, fraction)

    action_kind = r.WhichOneof("action")
    action: RouteAction | NonForwardingAction | UnsupportedAction | None
    if action_kind == "route":
        action = _parse_action(
            r.route, errs, pre, vi, ri, cache, declared, ignored_plugins, trusted
        )
        if action is None:
            return None
    elif action_kind == "non_forwarding_action":
        action = _NON_FORWARDING
    else:
        action = cache.get(("other", action_kind))
        if action is None:
            action = cache[("other", action_kind)] = UnsupportedAction(action_kind or "")
    overrides: tuple[tuple[str, str, bytes], ...] = ()
    if r.typed_per_filter_config:
        n_errors = len(errs)
        check_filter_overrides(
            r.typed_per_filter_config, f"{_route_path(pre, vi, ri)}.typed_per_filter_config", errs
        )
        if len(errs) == n_errors:
            overrides = filter_overrides(r.typed_per_filter_config)
    route = _new(Route)
    _set_match(route, match)
    _set_action(route, action)
    _set_name(route, r.name)
    _set_overrides(route, overrides)
    return route


def _parse_header(h: Any, errs: Errors, path: str) -> HeaderMatcher | None:
    name = h.name
    invert = h.invert_match
    kind = h.WhichOneof("header_match_specifier")
    if kind == "exact_match":
        return HeaderMatcher(name, "exact", h.exact_match, invert)
    if kind == "safe_regex_match":
        pattern = h.safe_regex_match.regex
        rx, problem = re2_compile(pattern)
        if rx is None:  # C-core's words and field
            errs.add(path, f"cannot create header matcher: {_BAD_REGEX}{problem}")
            return None
        return HeaderMatcher(name, "safe_regex", pattern, invert, regex=rx)
    if kind == "range_match":
        start, end = h.range_match.start, h.range_match.end
        if end < start:  # C-core's words and field
            errs.add(
                path,
                "cannot create header matcher: Invalid range specifier specified: "
                "end cannot be smaller than start.",
            )
            return None
        return HeaderMatcher(name, "range", None, invert, range_start=start, range_end=end)
    if kind == "present_match":
        return HeaderMatcher(name, "present", None, invert, present_match=h.present_match)
    if kind == "prefix_match":
        return HeaderMatcher(name, "prefix", h.prefix_match, invert)
    if kind == "suffix_match":
        return HeaderMatcher(name, "suffix", h.suffix_match, invert)
    if kind == "contains_match":
        return HeaderMatcher(name, "contains", h.contains_match, invert)
    if kind == "string_match":
        sm = h.string_match
        ic = sm.ignore_case
        sk = sm.WhichOneof("match_pattern")
        if sk == "exact":
            return HeaderMatcher(name, "exact", sm.exact, invert, ignore_case=ic)
        if sk == "prefix":
            return HeaderMatcher(name, "prefix", sm.prefix, invert, ignore_case=ic)
        if sk == "suffix":
            return HeaderMatcher(name, "suffix", sm.suffix, invert, ignore_case=ic)
        if sk == "contains":
            return HeaderMatcher(name, "contains", sm.contains, invert, ignore_case=ic)
        if sk == "safe_regex":
            if ic:
                # C-core: "string_match.ignore_case error:not supported for regex matcher".
                errs.add(f"{path}.string_match.ignore_case", "not supported for regex matcher")
                return None
            pattern = sm.safe_regex.regex
            rx, problem = re2_compile(pattern)
            if rx is None:  # C-core's words and field
                errs.add(f"{path}.string_match", f"{_BAD_REGEX}{problem}")
                return None
            return HeaderMatcher(name, "safe_regex", pattern, invert, regex=rx)
        errs.add(f"{path}.string_match", "invalid string matcher")
        return None
    errs.add(path, "invalid header matcher")
    return None


def _parse_action(
    ra: Any,
    errs: Errors,
    pre: str,
    vi: int,
    ri: int,
    cache: _ShareCache,
    declared: set[str] | None,
    ignored_plugins: set[str],
    trusted: bool = False,
) -> RouteAction | None:
    spec = None
    spec_value: Any = None
    msd = retry = None
    hashes: tuple[HashPolicy, ...] = ()
    rewrite = False
    for fd, value in ra.ListFields():
        num = fd.number
        if num == 1 or num == 3 or num == 37:  # cluster, weighted_clusters, plugin
            spec = num
            spec_value = value
        elif num == 36:  # max_stream_duration (A31)
            p = f"{_route_path(pre, vi, ri)}.route.max_stream_duration"
            if value.HasField("grpc_timeout_header_max"):
                msd = duration(value.grpc_timeout_header_max, f"{p}.grpc_timeout_header_max", errs)
            elif value.HasField("max_stream_duration"):
                msd = duration(value.max_stream_duration, f"{p}.max_stream_duration", errs)
        elif num == 15:
            hashes = _parse_hash_policies(
                value, errs, f"{_route_path(pre, vi, ri)}.route.hash_policy"
            )
        elif num == 9:
            retry = _parse_retry(value, errs, f"{_route_path(pre, vi, ri)}.route.retry_policy")
        elif num == 7 and trusted:  # auto_host_rewrite (A81), from a trusted server only
            rewrite = value.value
    plain = msd is None and not hashes and retry is None and not rewrite

    if spec == 1:
        name = spec_value
        if not name:
            errs.add(f"{_route_path(pre, vi, ri)}.route.cluster", "must be non-empty")
            return None
        if plain:
            action = cache.get(name)
            if action is None:
                action = cache[name] = RouteAction(cluster=name)
            return action
        return RouteAction(
            cluster=name,
            max_stream_duration=msd,
            hash_policies=hashes,
            retry_policy=retry,
            auto_host_rewrite=rewrite,
        )
    if spec == 3:
        wc = spec_value
        pairs = []
        total = 0
        for ci, cw in enumerate(wc.clusters):
            cw_overrides: tuple[tuple[str, str, bytes], ...] = ()
            if cw.typed_per_filter_config:
                n_errors = len(errs)
                check_filter_overrides(
                    cw.typed_per_filter_config,
                    f"{_route_path(pre, vi, ri)}.route.weighted_clusters.clusters[{ci}]"
                    ".typed_per_filter_config",
                    errs,
                )
                if len(errs) == n_errors:
                    cw_overrides = filter_overrides(cw.typed_per_filter_config)
                    plain = False
            w = cw.weight.value
            name = cw.name
            if not name:
                errs.add(
                    f"{_route_path(pre, vi, ri)}.route.weighted_clusters.clusters[{ci}].name",
                    "must be non-empty",
                )
            if not w and not cw.HasField("weight"):
                errs.add(
                    f"{_route_path(pre, vi, ri)}.route.weighted_clusters.clusters[{ci}].weight",
                    "field not present",
                )
            elif w:
                total += w
                pairs.append((name, w, cw_overrides))
        # ``total_weight`` (deprecated in Envoy's API) is ignored: the sum of
        # the weights is the total, as C-core, grpc-go and grpc-java do.
        if total == 0:
            errs.add(
                f"{_route_path(pre, vi, ri)}.route.weighted_clusters",
                "no valid clusters specified",
            )
            return None
        if total > UINT32_MAX_:
            errs.add(
                f"{_route_path(pre, vi, ri)}.route.weighted_clusters",
                "sum of cluster weights exceeds uint32 max",
            )
            return None
        key = tuple(pairs)
        if plain:
            action = cache.get(key)
            if action is None:
                weights = tuple(ClusterWeight(n, w) for n, w, _ in pairs)
                action = cache[key] = RouteAction(weighted_clusters=weights)
            return action
        weights = tuple(ClusterWeight(n, w, o) for n, w, o in pairs)
        return RouteAction(
            weighted_clusters=weights,
            max_stream_duration=msd,
            hash_policies=hashes,
            retry_policy=retry,
            auto_host_rewrite=rewrite,
        )
    if spec == 37:
        if declared is None:
            return None  # GRPC_EXPERIMENTAL_XDS_RLS_LB off: not a supported specifier
        name = spec_value
        if not name:
            errs.add(
                f"{_route_path(pre, vi, ri)}.route.cluster_specifier_plugin", "must be non-empty"
            )
            return None
        if name in ignored_plugins:
            return None
        if name not in declared:
            errs.add(
                f"{_route_path(pre, vi, ri)}.route.cluster_specifier_plugin",
                f'unknown cluster specifier plugin name "{name}"',
            )
            return None
        return RouteAction(
            cluster_specifier_plugin=name,
            max_stream_duration=msd,
            hash_policies=hashes,
            retry_policy=retry,
            auto_host_rewrite=rewrite,
        )
    if spec is None and ra.WhichOneof("cluster_specifier") in (
        "cluster",
        "cluster_specifier_plugin" if declared is not None else "cluster",
    ):
        # Present but empty (ListFields omits empty strings).
        errs.add(
            f"{_route_path(pre, vi, ri)}.route.{ra.WhichOneof('cluster_specifier')}",
            "must be non-empty",
        )
        return None
    # cluster_header, inline plugins, unknown or unset: the route is ignored (A28).
    return None


def _parse_hash_policies(policies: Any, errs: Errors, path: str) -> tuple[HashPolicy, ...]:
    out = []
    for i, hp in enumerate(policies):
        kind = hp.WhichOneof("policy_specifier")
        if kind == "header":
            h = hp.header
            if not h.header_name:
                errs.add(f"{path}[{i}].header.header_name", "must be non-empty")
                continue
            rx = None
            pattern = None
            subst = ""
            if h.HasField("regex_rewrite"):
                pattern = h.regex_rewrite.pattern.regex
                subst = h.regex_rewrite.substitution
                p = f"{path}[{i}].header.regex_rewrite.pattern"
                if not h.regex_rewrite.HasField("pattern"):
                    errs.add(p, "field not present")
                    continue
                if not pattern:
                    errs.add(f"{p}.regex", "field not present")
                    continue
                rx, problem = re2_compile(pattern)
                if rx is None:  # C-core's words
                    errs.add(f"{p}.regex", f"errors compiling regex: {problem}")
                    continue
            out.append(HashPolicy("header", hp.terminal, h.header_name, pattern, subst, rx))
        elif kind == "filter_state" and hp.filter_state.key == "io.grpc.channel_id":
            out.append(HashPolicy("channel_id", hp.terminal))
        # other policy types are ignored (A42)
    return tuple(out)


def _parse_retry(rp: Any, errs: Errors, path: str) -> RetryPolicy:
    # A44: the x-envoy-retry-grpc-on words, compared exactly as C-core does
    # (no trimming, no case folding: " unavailable" and "UNAVAILABLE" are
    # not words it knows; grpcio 1.85 seen live)
    codes = tuple(c for c in rp.retry_on.split(",") if c in _RETRYABLE_CODES)
    num = 1
    if rp.HasField("num_retries"):
        num = rp.num_retries.value
        if num == 0:
            errs.add(f"{path}.num_retries", "must be greater than 0")
    base, cap = 0.025, 0.25
    if rp.HasField("retry_back_off"):
        bo = rp.retry_back_off
        if not bo.HasField("base_interval"):
            errs.add(f"{path}.retry_back_off.base_interval", "field not present")
        else:
            b = duration(bo.base_interval, f"{path}.retry_back_off.base_interval", errs)
            if b is not None:
                if b == 0:
                    errs.add(f"{path}.retry_back_off.base_interval", "must be greater than 0")
                base = b
        cap = 10 * base
        if bo.HasField("max_interval"):
            c = duration(bo.max_interval, f"{path}.retry_back_off.max_interval", errs)
            if c is not None:
                if c < base:
                    errs.add(
                        f"{path}.retry_back_off.max_interval",
                        "must be greater than or equal to base_interval",
                    )
                cap = c
    return RetryPolicy(codes, num, base, cap)


def decode_route_configuration(
    data: bytes, memo: bool = True, trusted: bool = False
) -> tuple[str | None, Any, str | None]:
    """Parse and validate serialized RouteConfiguration bytes: (name, resource, error).
    ``trusted``: see :func:`parse_route_configuration`."""
    rc = route_pb2.RouteConfiguration()
    try:
        rc.ParseFromString(data)
    except Exception as err:
        return None, None, f"could not parse RouteConfiguration: {err}"
    errs = Errors()
    resource = parse_route_configuration(rc, errs, trusted=trusted)
    if errs:
        return rc.name, None, errs.text()
    return rc.name, resource, None
