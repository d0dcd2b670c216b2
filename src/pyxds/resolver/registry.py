"""Resolver registry: URI scheme -> resolver factory.

Built in:

* ``xds`` -> :class:`pyxds.resolver.xds_resolver.XdsResolver`.
* ``static`` and ``ipv4`` / ``ipv6`` -> the channel's static resolver
  (``pyxds.channel.static_resolver``, which honours LB policy options), or
  else :class:`StaticResolver`, which publishes a fixed address list once
  (tests and demos), e.g.
  ``static:///127.0.0.1:50051,127.0.0.1:50052`` or
  ``ipv4:127.0.0.1:1,127.0.0.1:2`` (gRPC's own target syntax).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

import grpc

from pyxds.lb.api import Endpoint, Status
from pyxds.resolver.api import Resolver, ResolverArgs, ResolverResult

__all__ = [
    "ResolverFactory",
    "register",
    "get",
    "scheme_of",
    "create",
    "StaticResolver",
    "parse_static_addresses",
]

ResolverFactory = Callable[[ResolverArgs], Resolver]

_factories: dict[str, ResolverFactory] = {}
_lock = threading.Lock()


def register(scheme: str, factory: ResolverFactory) -> None:
    """Register (or replace) the factory for ``scheme``."""
    with _lock:
        _factories[scheme.lower()] = factory


def get(scheme: str) -> ResolverFactory | None:
    _load_builtins()
    return _factories.get(scheme.lower())


def scheme_of(target: str) -> str:
    """The URI scheme of a target ("" when it has none)."""
    head, sep, _ = target.partition(":")
    if not sep or not head or not head.replace("+", "").replace("-", "").isalnum():
        return ""
    return head.lower()


def create(args: ResolverArgs) -> Resolver:
    """Build the resolver for ``args.target``; ValueError for an unknown scheme."""
    scheme = scheme_of(args.target)
    factory = get(scheme)
    if factory is None:
        raise ValueError(f"no resolver for scheme {scheme!r} in target {args.target!r}")
    return factory(args)


def parse_static_addresses(target: str) -> list[str]:
    """``static:///a:1,b:2``, ``ipv4:a:1,b:2`` or ``ipv6:[::1]:1`` -> addresses."""
    scheme = scheme_of(target)
    rest = target[len(scheme) + 1 :]
    if rest.startswith("//"):
        rest = urlsplit(target).path.lstrip("/")
    rest = unquote(rest)
    addresses = [a.strip() for a in rest.split(",") if a.strip()]
    if not addresses:
        raise ValueError(f"target {target!r} names no addresses")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"target {target!r}: {address!r} is not host:port")
    return addresses


class StaticResolver(Resolver):
    """Publishes a fixed list of addresses, one endpoint each."""

    def __init__(self, args: ResolverArgs) -> None:
        self._args = args

    def _result(self) -> ResolverResult:
        try:
            addresses = parse_static_addresses(self._args.target)
        except ValueError as err:
            status = Status(grpc.StatusCode.UNAVAILABLE, str(err))
            return ResolverResult(endpoints=status, service_config_error=status)
        return ResolverResult(endpoints=tuple(Endpoint((a,)) for a in addresses))

    def start(self) -> None:
        self._args.serializer.run(lambda: self._args.on_result(self._result()))

    def request_reresolution(self) -> None:
        """Static addresses never change."""

    def shutdown(self) -> None:
        """Nothing to release."""


def _xds_factory(args: ResolverArgs) -> Resolver:
    from pyxds.resolver.xds_resolver import XdsResolver

    return XdsResolver(args)


def _static_factory(args: ResolverArgs) -> Resolver:
    """The channel's static resolver when available (it honours the
    channel's LB policy options), else :class:`StaticResolver`."""
    try:
        from pyxds.channel.static_resolver import build_builtin
    except ImportError:
        return StaticResolver(args)
    resolver = build_builtin(scheme_of(args.target), args.target, args)
    return resolver if resolver is not None else StaticResolver(args)


_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    with _lock:
        _factories.setdefault("xds", _xds_factory)
        for scheme in ("static", "ipv4", "ipv6"):
            _factories.setdefault(scheme, _static_factory)
