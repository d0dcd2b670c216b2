"""The ``xds`` resolver (gRFC A74 latest, A31, A28, A47 naming).

Theory of operation
-------------------

``start`` loads the bootstrap, gets the shared XdsClient
(``XdsClient.get_or_create``), names the listener from the target (A47
template in the bootstrap) and creates the :class:`DependencyManager`.
Everything else happens on the channel's serializer, driven by the
manager's ``on_update``:

* **XdsConfig**: compile an :class:`XdsConfigSelector` for the virtual host
  (reused while the virtual host and the listener's max_stream_duration are
  unchanged), and publish it together with the LB config in one
  :class:`ResolverResult`.
* **Cluster lifecycle (A31)**: every cluster in the LB config has a
  :class:`ClusterRef` and holds a dependency-manager subscription, so the
  XdsConfig always contains every cluster the LB config names.  A cluster
  enters with the first route config naming it; it leaves when the routes
  no longer name it *and* no RPC holds a reference; the last RPC's release
  schedules a sweep on the serializer, which publishes the LB config
  without it and releases the subscription.
* **Cluster specifier plugins** (RLS): a plugin the routes name gets a
  :class:`ClusterRef` too (child ``cluster_specifier_plugin:NAME``, no
  subscription: the clusters its policy picks subscribe themselves, cds
  ``isDynamic``, A74), with the same two-step lifecycle; its child policy is
  the plugin's config, the newest the route configuration gave (an RPC may
  keep a plugin the routes no longer name: its last config stays; C-core
  looks the config up in the current route configuration there).
* **LB config**: ``xds_cluster_manager_experimental`` with a child
  ``cluster:NAME`` -> ``cds_experimental {"cluster": NAME}`` per cluster
  and ``cluster_specifier_plugin:NAME`` -> the plugin's config per plugin,
  with attributes ``xds_config``, ``dependency_manager`` and ``xds_client``
  (xds_cluster_impl's load reporting, A27).
* **Errors**: before any good config, a ``Status`` becomes a
  ``service_config_error`` and a selector failing RPCs with it (UNAVAILABLE,
  naming the resource).  After a good config, every Status the manager
  reports drops the config (A74 latest: the listener or route configuration
  does not exist or failed before any data, a socket listener, no matching
  virtual host; C-core clears its config for each); ambient errors never
  reach the resolver (they become resolution notes in the XdsConfig).
"""

from __future__ import annotations

import importlib
import json
import logging
import random
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from pyxds import gc_hold
from pyxds._uri import quote, unquote, urlsplit
from pyxds.lb import registry
from pyxds.lb.errors import LBConfigError
from pyxds.lb.registry import PolicySelection
from pyxds.resolver.api import Closing, ConfigSelector, Resolver, ResolverArgs, ResolverResult
from pyxds.resolver.config_selector import (
    ClusterRef,
    FailingConfigSelector,
    XdsConfigSelector,
    cluster_child_name,
    plugin_child_name,
)
from pyxds.resolver.dependency_manager import DependencyManager, route_cluster_names
from pyxds.resolver.xds_config import (
    DEPENDENCY_MANAGER_ATTRIBUTE,
    XDS_CLIENT_ATTRIBUTE,
    XDS_CONFIG_ATTRIBUTE,
    XdsConfig,
)
from pyxds.status import Status
from pyxds.xds.resources.types import HttpFilter, VirtualHost

if TYPE_CHECKING:  # DNS loads with the first LOGICAL_DNS cluster
    from pyxds.resolver.dns import DnsResolver

__all__ = ["XdsResolver", "cluster_manager_config", "parse_xds_target"]

_log = logging.getLogger(__name__)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
CLUSTER_MANAGER_POLICY = "xds_cluster_manager_experimental"
CDS_POLICY = "cds_experimental"


def _load_policies_ahead() -> None:
    """The first ``xds:`` resolver of a process loads the policies of the
    xDS tree (:data:`pyxds.lb.registry.XDS_TREE`) on a short-lived thread
    while its ADS stream connects and the first resources come (issue 18,
    start-up: on loopback the control plane's first answer takes ~5 ms, about
    what the loading takes; loaded when the cluster's config arrives, it
    followed that wait instead of filling it), and with them grpcio's sync
    channel module where the sync channel is in use (its subchannels'
    transports are grpcio channels: ~2 ms; an asyncio program never loads
    it), and takes the lean unary call's check of grpcio
    (:func:`_check_lean_calls`).  Only loads: what a config names is still
    looked up when it comes, and a policy the tree does not use is not
    loaded."""
    if _loading_ahead[0]:
        return
    _loading_ahead[0] = True
    if _ahead_already():
        return  # loaded and checked already (a program that made a config before): no thread
    try:
        threading.Thread(target=_load_ahead, name="pyxds-load-ahead", daemon=True).start()
    except RuntimeError:  # no thread at interpreter exit: each loads when used
        pass


def _ahead_already() -> bool:
    """Whether :func:`_load_ahead` has nothing left to do: the policies
    loaded, and the lean unary call of the API in use checked (with
    grpcio's sync channel module, for the sync channel).  A program that
    loaded the modules itself (an asyncio one naming the resolver and the
    policies before its first channel) still has the check to take: left
    to the first unary call, it ran on the event loop between the pick and
    the call (~0.8 ms of the first RPC's wall time)."""
    if not all(registry.BUILTINS[name] in sys.modules for name in registry.XDS_TREE):
        return False
    if "pyxds.channel.channel" in sys.modules:
        return "grpc._channel" in sys.modules and _lean_checked("pyxds.channel.grpc_unary")
    if "pyxds.channel.aio" in sys.modules:
        return _lean_checked("pyxds.channel.grpc_aio_unary")
    return True


def _lean_checked(name: str) -> bool:
    """Whether the lean unary call module ``name`` has taken its check (or
    is off); reads, never takes it."""
    module = sys.modules.get(name)
    if module is None or not getattr(module, "ENABLED", True):
        return module is not None
    check = getattr(module, "available", None)
    return getattr(check, "answer", None) is not None


def _load_ahead() -> None:
    with gc_hold.held():  # a bulk job (pyxds.gc_hold, rule 6)
        registry.load_ahead()
        if "pyxds.channel.channel" in sys.modules:
            try:
                importlib.import_module("grpc._channel")
                _check_lean_calls("pyxds.channel.grpc_unary")
            except Exception:  # grpc.insecure_channel raises it again where it matters
                _log.debug("loading grpc._channel ahead failed", exc_info=True)
        elif "pyxds.channel.aio" in sys.modules:
            try:
                _check_lean_calls("pyxds.channel.grpc_aio_unary")
            except Exception:  # the first unary call raises it again where it matters
                _log.debug("loading the lean grpc.aio call ahead failed", exc_info=True)


def _check_lean_calls(name: str) -> None:
    """The lean unary call's check of grpcio's sources (its ``available()``:
    a digest of the grpcio functions it mirrors, ~4.5 M instructions sync,
    ~3.4 M grpc.aio), taken here instead of by the first unary call, which
    makes it after the config came and its subchannel connected: the last
    step before the first RPC goes out (issue 18, start-up).  A program
    whose calls are all streaming never needed it."""
    module: Any = importlib.import_module(name)
    if getattr(module, "ENABLED", True):
        module.available()


def parse_xds_target(target: str) -> tuple[str | None, str]:
    """``xds://[authority]/service`` -> (xDS authority or None, service name)."""
    parts = urlsplit(target)
    if parts.scheme != "xds":
        raise ValueError(f"not an xds target: {target!r}")
    if not parts.path or parts.path.endswith("/"):
        # C-core's XdsResolverFactory::IsValidUri: an empty path or one
        # ending in "/" has no valid data plane authority.
        raise ValueError(f"xds target {target!r} has no service name")
    service = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    return (parts.netloc or None), service


#: characters C-core's URI writer leaves as they are, beyond the unreserved
#: ones (RFC 3986 pchar, authority and query/fragment characters)
#: whether this process has started loading the xDS tree's policies ahead
#: (:func:`_load_policies_ahead`)
_loading_ahead = [False]
_PATH_SAFE = "!$&'()*+,;=:@/"
_AUTHORITY_SAFE = "!$&'()*+,;=:@[]"
_QUERY_SAFE = "!$&'()*+,;=:@/?"


def xds_client_scope(target: str) -> str:
    """The key of a target's XdsClient and its CSDS ``client_scope`` (A71:
    "the key channels use to lookup their XdsClient instance, such as
    dataplane target"), written as C-core writes it: the parsed target URI
    serialized again, so an empty authority is left out
    (``xds:///svc`` -> ``xds:/svc``), ``xds:svc`` stays ``xds:svc``, the path
    is percent-encoded again and a query or fragment is kept.  Checked
    against grpcio-csds over C-core (tests/e2e/test_admin_csds.py)."""
    parts = urlsplit(target)
    out = f"{parts.scheme}:"
    if parts.netloc:
        out += "//" + quote(unquote(parts.netloc), safe=_AUTHORITY_SAFE)
    out += quote(unquote(parts.path), safe=_PATH_SAFE)
    if parts.query:
        out += "?" + quote(unquote(parts.query), safe=_QUERY_SAFE)
    if parts.fragment:
        out += "#" + quote(unquote(parts.fragment), safe=_QUERY_SAFE)
    return out


def cluster_manager_config(
    clusters: list[str], plugins: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``xds_cluster_manager_experimental`` JSON config for ``clusters``
    and cluster specifier ``plugins`` (name -> LB config JSON text)."""
    children: dict[str, Any] = {
        cluster_child_name(name): {"childPolicy": [{CDS_POLICY: {"cluster": name}}]}
        for name in clusters
    }
    for name, config in (plugins or {}).items():
        children[plugin_child_name(name)] = {"childPolicy": json.loads(config)}
    return {CLUSTER_MANAGER_POLICY: {"children": children}}


def route_plugins(config: XdsConfig) -> dict[str, str]:
    """The cluster specifier plugins the virtual host's routes name: name ->
    LB config (JSON text)."""
    from pyxds.xds.resources.types import RouteAction

    by_name = {p.name: p.lb_config for p in config.route_config.cluster_specifier_plugins}
    out: dict[str, str] = {}
    for route in config.virtual_host.routes:
        action = route.action
        if isinstance(action, RouteAction) and action.cluster_specifier_plugin is not None:
            lb_config = by_name.get(action.cluster_specifier_plugin)
            if lb_config:
                out[action.cluster_specifier_plugin] = lb_config
    return out


class XdsResolver(Resolver):
    """See the module docstring.  ``xds_client``/``listener_name`` (with
    ``dns_resolver``) may be injected by tests; otherwise ``start`` builds
    them from the bootstrap."""

    def __init__(
        self,
        args: ResolverArgs,
        *,
        xds_client: Any = None,
        listener_name: str | None = None,
        dns_resolver: DnsResolver | None = None,
    ) -> None:
        self._args = args
        self._client = xds_client
        self._release_client: Callable[[], Closing] | None = None
        self._listener_name = listener_name
        self._dns_resolver = dns_resolver
        self._manager: DependencyManager | None = None
        self._refs: dict[str, ClusterRef] = {}
        #: cluster specifier plugins (RLS) the LB config has, by plugin name
        self._plugin_refs: dict[str, ClusterRef] = {}
        self._selector: ConfigSelector | None = None
        self._selector_key: tuple[VirtualHost, float | None, tuple[HttpFilter, ...]] | None = None
        self._xds_config: XdsConfig | None = None
        self._had_good_config = False
        self._last_error: Status | None = None
        self._lb_cache: tuple[tuple[Any, ...], PolicySelection] | None = None
        self._sweep_scheduled = False
        self._shutdown = False
        self.results: int = 0  # how many ResolverResults were published
        #: A42 ``channel_id`` hash policy value: one random 64-bit id per
        #: resolver, i.e. per channel (C-core draws it in its resolver too).
        #: Not from ``args.random``: that would shift every seeded sequence
        #: the channel's other users draw.
        self.channel_id: int = random.getrandbits(64)

    # -- Resolver ------------------------------------------------------------
    def start(self) -> None:
        self._args.serializer.run(self._start)

    def request_reresolution(self) -> None:
        self._args.serializer.run(self._reresolve)

    def shutdown(self) -> None:
        self._args.serializer.run(self._shutdown_now)

    def config_dump(self) -> dict[str, Any]:
        dump: dict[str, Any] = {
            "target": self._args.target,
            "clusters": {name: ref.count for name, ref in sorted(self._refs.items())},
        }
        if self._plugin_refs:
            dump["cluster_specifier_plugins"] = {
                name: ref.count for name, ref in sorted(self._plugin_refs.items())
            }
        if self._last_error is not None:
            dump["last_error"] = str(self._last_error)
        if self._manager is not None:
            dump["dependency_manager"] = self._manager.config_dump()
        return dump

    @property
    def dependency_manager(self) -> DependencyManager | None:
        return self._manager

    @property
    def current_selector(self) -> ConfigSelector | None:
        return self._selector

    # -- serializer-side -----------------------------------------------------
    def _start(self) -> None:
        if self._shutdown or self._manager is not None:
            return
        try:
            target_authority, service = parse_xds_target(self._args.target)
            if self._client is None or self._listener_name is None:
                self._connect(target_authority, service)
        except Exception as err:  # bad target or bootstrap: report, never raise
            self._fail_before_config(Status(UNAVAILABLE, f"xds resolver: {err}"))
            return
        assert self._listener_name is not None
        self._manager = DependencyManager(
            self._client,
            self._listener_name,
            self._args.authority or service,
            self._args.serializer.run,
            self._on_update,
            dns_resolver=self._dns_resolver,
            clock=self._args.clock,
        )
        _load_policies_ahead()  # the LDS request is on its way

    def _connect(self, target_authority: str | None, service: str) -> None:
        # the xDS client's modules: a bulk job (pyxds.gc_hold)
        gc_hold.import_held("pyxds.xds.bootstrap", "pyxds.xds.client")
        from pyxds.xds import bootstrap as bootstrap_module  # lands with the xDS client
        from pyxds.xds.client import XdsClient

        if self._args.bootstrap is None:
            bootstrap = bootstrap_module.load_bootstrap()
        else:
            bootstrap = bootstrap_module.load_bootstrap(self._args.bootstrap)
        if self._listener_name is None:
            self._listener_name = bootstrap_module.listener_resource_name(
                bootstrap, target_authority, service
            )
        if self._client is None:
            # A71: one XdsClient per data-plane target (fallback stays per target).
            scope = xds_client_scope(self._args.target)
            self._client, self._release_client = XdsClient.get_or_create(bootstrap, scope)

    def _reresolve(self) -> None:
        if self._manager is not None and not self._shutdown:
            self._manager.request_reresolution()

    def _shutdown_now(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        if self._manager is not None:
            self._manager.shutdown()
        for ref in [*self._refs.values(), *self._plugin_refs.values()]:
            ref.in_routes = False
        self._refs.clear()
        self._plugin_refs.clear()
        if self._release_client is not None:
            # never blocks: the client closes on its own threads, and the
            # channel's close() waits for it (ResolverArgs.on_closing)
            self._args.on_closing(self._release_client())
            self._release_client = None

    def _on_update(self, value: XdsConfig | Status) -> None:
        if self._shutdown:
            return
        if isinstance(value, XdsConfig):
            self._apply(value)
            return
        self._last_error = value
        status = Status(UNAVAILABLE, value.details)
        if not self._had_good_config:
            self._fail_before_config(status)
        else:
            # A74 latest: the manager reports a Status only when the config
            # must stop being used (LDS/RDS does not exist or failed with no
            # data, socket listener, no matching virtual host); ambient
            # errors never get here.
            _log.warning("xds resolver: dropping the config: %s", value.details)
            self._drop(status)

    def _apply(self, config: XdsConfig) -> None:
        self._had_good_config = True
        self._last_error = None
        self._xds_config = config
        names = route_cluster_names(config.virtual_host)
        self._hold(names, route_plugins(config))
        key = (
            config.virtual_host,
            config.listener.max_stream_duration,
            config.listener.http_filters,
        )
        if key != self._selector_key or not isinstance(self._selector, XdsConfigSelector):
            self._selector = XdsConfigSelector(
                config.virtual_host,
                self._refs,
                config.listener.max_stream_duration,
                self._args.random,
                fallback=lambda: self._selector,
                channel_id=self.channel_id,
                http_filters=config.listener.http_filters,
                plugin_refs=self._plugin_refs,
            )
            self._selector_key = key
        self._retire_idle()
        self._publish()

    def _drop(self, status: Status) -> None:
        """A74: the listener or route configuration is gone; fail RPCs."""
        self._hold([], {})
        self._selector = FailingConfigSelector(status)
        self._selector_key = None
        self._retire_idle()
        self._publish(error=status)

    def _fail_before_config(self, status: Status) -> None:
        self._selector = FailingConfigSelector(status)
        self._selector_key = None
        self.results += 1
        self._args.on_result(
            ResolverResult(
                endpoints=status,
                config_selector=self._selector,
                resolution_note=status.details,
                service_config_error=status,
            )
        )

    def _hold(self, names: list[str], plugins: Mapping[str, str]) -> None:
        """Mark route clusters and plugins; new ones get a ref (clusters a
        subscription), plugins their newest config."""
        wanted = set(names)
        for name in names:
            if name not in self._refs:
                assert self._manager is not None
                self._refs[name] = ClusterRef(
                    name, self._schedule_sweep, self._manager.subscribe_cluster(name)
                )
        for name, ref in self._refs.items():
            ref.in_routes = name in wanted
        for name, config in plugins.items():
            plugin_ref = self._plugin_refs.get(name)
            if plugin_ref is None:
                self._plugin_refs[name] = ClusterRef(name, self._schedule_sweep, None, config)
            else:
                plugin_ref.child_policy = config
        for name, ref in self._plugin_refs.items():
            ref.in_routes = name in plugins

    def _retire_idle(self) -> bool:
        retired = [name for name, ref in self._refs.items() if ref.try_retire()]
        for name in retired:
            ref = self._refs.pop(name)
            if ref.subscription is not None:
                ref.subscription.release()
        plugins = [name for name, ref in self._plugin_refs.items() if ref.try_retire()]
        for name in plugins:
            del self._plugin_refs[name]
        return bool(retired or plugins)

    def _schedule_sweep(self) -> None:
        """Called from an RPC thread when a cluster's last RPC ends."""
        if self._sweep_scheduled:
            return
        self._sweep_scheduled = True
        self._args.serializer.run(self._sweep)

    def _sweep(self) -> None:
        self._sweep_scheduled = False
        if self._shutdown:
            return
        if self._retire_idle():
            error = (
                self._selector.status if isinstance(self._selector, FailingConfigSelector) else None
            )
            self._publish(error=error)

    def _lb_policy(self) -> PolicySelection:
        names = tuple(sorted(self._refs))
        plugins = {n: r.child_policy or "" for n, r in sorted(self._plugin_refs.items())}
        key = (names, tuple(plugins.items()))
        if self._lb_cache is not None and self._lb_cache[0] == key:
            return self._lb_cache[1]
        selection = registry.select_policy([cluster_manager_config(list(names), plugins)])
        self._lb_cache = (key, selection)
        return selection

    def _publish(self, error: Status | None = None) -> None:
        try:
            lb_policy = self._lb_policy()
        except LBConfigError as err:
            status = Status(UNAVAILABLE, f"xds resolver: invalid generated LB config: {err}")
            self._fail_before_config(status)
            return
        attributes: dict[str, Any] = {DEPENDENCY_MANAGER_ATTRIBUTE: self._manager}
        if self._client is not None:
            attributes[XDS_CLIENT_ATTRIBUTE] = self._client
        if self._xds_config is not None:
            attributes[XDS_CONFIG_ATTRIBUTE] = self._xds_config
        self.results += 1
        # Even when dropping (A74), the LB tree gets a normal update: the
        # clusters RPCs still hold stay usable; new RPCs fail in the selector.
        self._args.on_result(
            ResolverResult(
                endpoints=(),
                lb_policy=lb_policy,
                attributes=attributes,
                config_selector=self._selector,
                resolution_note=error.details if error is not None else "",
            )
        )
