"""xDS HTTP filters on the client call path (gRFC A39).

Theory of operation
-------------------

A filter type is an :class:`HttpFilter` object registered by the config
type URL(s) it accepts (:func:`register`).  Registering also declares the
type to the LDS/RDS validators, so a listener naming it is accepted and its
``typed_per_filter_config`` overrides are validated; a type nobody
registered is still skipped when optional and NACKed when required.

The xds ConfigSelector builds, once per route (and per weighted cluster),
the chain of :class:`CallFilter` objects for the listener's filters in
listener order (:func:`build_chain`).  Each filter's config is the most
specific one present (A39 "Filter Config Overrides"): the weighted
cluster's ``typed_per_filter_config`` entry for the filter's name, else the
route's, else the virtual host's, else the listener's ``typed_config``.  An
override has one of the filter's ``override_type_urls`` (by default its own
types; A55's StatefulSessionPerRoute for the stateful session filter) and
is turned into a CallFilter by :meth:`HttpFilter.override_filter`.
The chain travels in the RPC's ``CallConfig.filters``.

Per RPC the channel calls every filter's :meth:`CallFilter.on_call` once,
before the first pick (as C-core runs them above its retry logic): each
may answer a :class:`FilterVerdict`, the filter's state for that one RPC:
wait ``delay``, then maybe fail the RPC with ``abort`` (A33), ``done``
once carried out.  :func:`run_chain` folds the chain's verdicts into one
per RPC, kept by the channel's :class:`pyxds.channel.rpc.Rpc`.  A filter
that has nothing to do on the call path (the router; a fault filter with
no fault) contributes no CallFilter at all, and a route whose filters
answer None costs nothing per RPC.

A filter that must act while the RPC is routed and see its response (A55
stateful session, :mod:`pyxds.resolver.stateful_session`) is not a
verdict: the ConfigSelector takes it out of the chain and applies it while
it routes the RPC (A60 lets the cookie choose the cluster, whose reference
the selector holds, A31).  It hands the LB picker a call attribute (the
override host) and the channel a per-RPC ``CallConfig.call_state``
(:class:`pyxds.resolver.api.CallState`) whose ``response_metadata()`` the
channel adds to the response the application reads
(:mod:`pyxds.channel.response_metadata`).  That is the one home of per-RPC
work that reaches past the pick.

Adding a filter (e.g. A83 gcp_authn) is one subclass of
:class:`HttpFilter` and one :func:`register` call.
"""

from __future__ import annotations

import importlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from pyxds._values import dataclass
from pyxds.status import Status
from pyxds.xds.resources._common import (
    FAULT_FILTER_TYPE,
    STATEFUL_SESSION_TYPE,
    effective_override,
)

__all__ = [
    "CallFilter",
    "FilterVerdict",
    "HttpFilter",
    "build_chain",
    "register",
    "register_built_in",
    "registered",
]


@dataclass(frozen=True, slots=True)
class FilterVerdict:
    """What a filter does to one RPC (see the module docstring): before its
    pick wait ``delay`` seconds, then fail it with ``abort`` (None: go on);
    ``done`` is called once when that has been carried out (or the RPC
    ended first)."""

    delay: float = 0.0
    abort: Status | None = None
    done: Callable[[], None] | None = None


class CallFilter(ABC):
    """One filter with its effective config, for the RPCs of one route."""

    @abstractmethod
    def on_call(
        self, metadata: Sequence[tuple[str, Any]], rng: random.Random
    ) -> FilterVerdict | None: ...


class HttpFilter(ABC):
    """A filter type (A39 "Filter registry"): turns a config (the
    serialized typed config of one of ``type_urls``) into a CallFilter, or
    None when the filter does nothing on the call path."""

    type_urls: tuple[str, ...] = ()
    #: config types of its ``typed_per_filter_config`` overrides (empty: the
    #: filter's own ``type_urls``)
    override_type_urls: tuple[str, ...] = ()
    terminal = False

    @abstractmethod
    def call_filter(self, config: bytes) -> CallFilter | None: ...

    def override_filter(self, config: bytes) -> CallFilter | None:
        """The CallFilter of an override's config (default: as a top-level one)."""
        return self.call_filter(config)

    def override_types(self) -> tuple[str, ...]:
        return self.override_type_urls or self.type_urls


_REGISTRY: dict[str, HttpFilter] = {}

#: built-in filters that load on first use, by config type: the module
#: registers its filter when it loads, which is at the first lookup of the
#: type (a route chain naming it), so a config that names none never loads
#: it (issue 18, start-up).  The LDS/RDS validators know these types without
#: it (``pyxds.xds.resources._common``).
_ON_FIRST_USE = {
    FAULT_FILTER_TYPE: "pyxds.resolver.fault_filter",
    STATEFUL_SESSION_TYPE: "pyxds.resolver.stateful_session",
}


def register(http_filter: HttpFilter) -> None:
    """Register a filter type for its config type URLs (and declare them
    to the LDS/RDS validators)."""
    from pyxds.xds.resources.listener import register_http_filter

    overrides = () if http_filter.terminal else http_filter.override_types()
    for type_url in http_filter.type_urls:
        _REGISTRY[type_url] = http_filter
        register_http_filter(type_url, http_filter.terminal, overrides)


def register_built_in(http_filter: HttpFilter) -> None:
    """:func:`register` for a built-in filter whose module loads on first
    use: a filter the application registered for the type first stays (the
    application's registration used to come after the built-in's, and
    replaced it)."""
    if not any(type_url in _REGISTRY for type_url in http_filter.type_urls):
        register(http_filter)


def registered(type_url: str) -> HttpFilter | None:
    impl = _REGISTRY.get(type_url)
    if impl is None and type_url in _ON_FIRST_USE:
        # the import lock runs the module once; a second thread waits for it
        importlib.import_module(_ON_FIRST_USE[type_url])
        impl = _REGISTRY.get(type_url)
    return impl


def build_chain(
    listener_filters: Sequence[Any],
    *override_levels: Sequence[tuple[str, str, bytes]],
) -> tuple[CallFilter, ...]:
    """The CallFilters of one route, in listener order.  ``listener_filters``
    are the listener's ``HttpFilter`` resources (name, type_url, config,
    disabled); ``override_levels`` the ``filter_overrides`` from least to
    most specific (virtual host, route, weighted cluster).  Which filters
    run and with which config: :func:`~pyxds.xds.resources._common.effective_override`
    (A39's most specific override; ``disabled`` and overrides of another
    filter's type as C-core 1.85 treats them)."""
    chain: list[CallFilter] = []
    for flt in listener_filters:
        impl = registered(flt.type_url)
        if impl is None or impl.terminal:
            continue
        runs, override = effective_override(
            flt.name, override_levels, impl.override_types(), flt.disabled
        )
        if not runs:
            continue
        if override is not None:
            call_filter = impl.override_filter(override[1])
        else:
            call_filter = impl.call_filter(flt.config)
        if call_filter is not None:
            chain.append(call_filter)
    return tuple(chain)


def run_chain(
    chain: Sequence[CallFilter], metadata: Sequence[tuple[str, Any]], rng: random.Random
) -> FilterVerdict | None:
    """Run a route's filters for one RPC: their delays add up; the first
    abort ends the chain (later filters do not see the RPC); the ``done``
    of every filter that saw it runs, in chain order."""
    verdicts: list[FilterVerdict] = []
    for call_filter in chain:
        verdict = call_filter.on_call(metadata, rng)
        if verdict is None:
            continue
        verdicts.append(verdict)
        if verdict.abort is not None:
            break
    if not verdicts:
        return None
    if len(verdicts) == 1:
        return verdicts[0]
    return FilterVerdict(
        sum(v.delay for v in verdicts),
        verdicts[-1].abort,
        _in_order([v.done for v in verdicts if v.done is not None]),
    )


def _in_order(fns: list[Callable[[], None]]) -> Callable[[], None] | None:
    if len(fns) <= 1:
        return fns[0] if fns else None

    def each() -> None:
        for fn in fns:
            fn()

    return each
