"""Resolver registry: URI scheme -> resolver factory.

Built in:

* ``xds`` -> :class:`pyxds.resolver.xds_resolver.XdsResolver`.
* ``static``, ``ipv4`` / ``ipv6`` and ``dns`` ->
  :mod:`pyxds.resolver.static_resolver` (which honours the channel's LB
  policy options), e.g. ``static:///127.0.0.1:50051,127.0.0.1:50052`` or
  ``ipv4:127.0.0.1:1,127.0.0.1:2`` (gRPC's own target syntax).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pyxds import gc_hold
from pyxds.resolver.api import Resolver, ResolverArgs
from pyxds.resolver.static_resolver import (
    StaticResolver,
    build_builtin,
    parse_static_addresses,
    scheme_of,
)

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
    """Register (or replace) the factory for ``scheme``.

    ``factory(args: ResolverArgs) -> Resolver`` is called for each channel
    whose target has that scheme; the resolver publishes
    ``ResolverResult`` s with ``args.on_result`` on ``args.serializer``.
    Worked example (an address list that changes at runtime):
    docs/custom-resolver.md and docs/examples/address_book_resolver.py.
    """
    with _lock:
        _factories[scheme.lower()] = factory


def get(scheme: str) -> ResolverFactory | None:
    _load_builtins()
    return _factories.get(scheme.lower())


def create(args: ResolverArgs) -> Resolver:
    """Build the resolver for ``args.target``; ValueError for an unknown scheme."""
    scheme = scheme_of(args.target)
    factory = get(scheme)
    if factory is None:
        raise ValueError(f"no resolver for scheme {scheme!r} in target {args.target!r}")
    return factory(args)


def _xds_factory(args: ResolverArgs) -> Resolver:
    # the first xds: channel loads the resolver, the resource decoders and
    # the descriptor bundle: a bulk job the collector need not walk
    gc_hold.import_held("pyxds.resolver.xds_resolver")
    from pyxds.resolver.xds_resolver import XdsResolver

    return XdsResolver(args)


def _builtin_factory(args: ResolverArgs) -> Resolver:
    """static / ipv4 / ipv6 / dns / unix / unix-abstract targets
    (:mod:`pyxds.resolver.static_resolver`)."""
    target = args.target
    resolver = build_builtin(scheme_of(target), target, args)
    if resolver is None:
        raise ValueError(f"no resolver for scheme {scheme_of(target)!r} in target {target!r}")
    return resolver


_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    with _lock:
        _factories.setdefault("xds", _xds_factory)
        for scheme in ("static", "ipv4", "ipv6", "dns", "unix", "unix-abstract"):
            _factories.setdefault(scheme, _builtin_factory)
