"""The resolver API between the channel and its resolver (ARCHITECTURE.md layers).

A resolver watches its source of truth (xDS, or a static address list) and,
on the channel's work serializer, hands the channel a :class:`ResolverResult`:
the endpoints, the top-level LB policy (a ``PolicySelection``), attributes
for the policies (``xds_config``, ``dependency_manager``) and a
:class:`ConfigSelector`.  The channel applies the LB config and swaps the
config selector together (A31: config selector and LB config are published
atomically; the resolver makes sure every cluster a new selector can return
is present in the LB config it delivers with it).

Per RPC the channel calls ``config_selector.select(path, metadata)`` off the
serializer (it must be thread-safe and non-blocking), then the current
picker with ``call_attributes`` from the returned :class:`CallConfig`, and
calls ``CallConfig.on_committed`` exactly once when the RPC ends (A31:
releases the RPC's reference to its cluster).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

from pyxds._values import dataclass
from pyxds.clock import Clock
from pyxds.lb.api import EMPTY_ATTRIBUTES, Endpoint
from pyxds.lb.registry import PolicySelection
from pyxds.resolver.retry_policy import RetryPolicy

if TYPE_CHECKING:
    from pyxds.xds.bootstrap import BootstrapSource
from pyxds.serializer import WorkSerializer
from pyxds.status import Status


class CallState(Protocol):
    """The per-RPC state of an A39 filter that also sees the response (the
    A55 stateful session filter's session), carried by
    ``CallConfig.call_state``.  The channel's one duty to it:

    ``response_metadata()`` is called once, when the response headers of
    the RPC's committed attempt arrive (after that attempt's pick), and
    returns the ``(key, value)`` pairs to add to the response metadata the
    application sees: to the initial metadata, or to the trailing metadata
    of a response that had no headers before its trailers (trailers-only).
    Never raises; () when there is nothing to add.
    """

    def response_metadata(self) -> tuple[tuple[str, str], ...]: ...


@dataclass(frozen=True, slots=True)
class CallConfig:
    """What the ConfigSelector decided for one RPC.

    ``status`` set: fail the RPC with it (e.g. UNAVAILABLE "No matching route
    found in xDS route config").  ``timeout``: seconds, the RPC's deadline is
    capped at now + timeout (A31 max_stream_duration).  ``on_committed``: call
    once when the RPC ends, whatever the outcome.  ``no_config``: the status
    says the channel has no usable config at all (the listener or route
    configuration is gone), not that this RPC's route fails it: a
    wait_for_ready RPC then waits for the next config instead of failing, as
    in C-core, where the channel is left with no addresses.
    ``retry_policy``: the RPC's retry policy (A44 route/virtual host, A6
    methodConfig); it stays the RPC's for all its attempts (A31).
    ``filters``: the route's A39 HTTP filter chain
    (:class:`pyxds.resolver.http_filters.CallFilter`), run once per RPC
    before its first pick.  ``wait_for_ready``: the methodConfig's, used
    when the application did not say.  ``call_state``: this RPC's
    :class:`CallState` (A55 stateful session), None for most RPCs.
    """

    call_attributes: Mapping[str, Any] = field(default_factory=lambda: EMPTY_ATTRIBUTES)
    timeout: float | None = None
    on_committed: Callable[[], None] | None = None
    status: Status | None = None
    no_config: bool = False
    retry_policy: RetryPolicy | None = None
    filters: tuple[Any, ...] = ()
    wait_for_ready: bool | None = None
    call_state: CallState | None = None


class ConfigSelector(ABC):
    """Per-RPC routing decision (A31).  Thread-safe, never blocks."""

    @abstractmethod
    def select(self, path: str, metadata: Sequence[tuple[str, str | bytes]]) -> CallConfig: ...


class DefaultConfigSelector(ConfigSelector):
    """No routing: every RPC gets the same (empty) call config."""

    _CONFIG = CallConfig()

    def select(self, path: str, metadata: Sequence[tuple[str, str | bytes]]) -> CallConfig:
        return self._CONFIG


@dataclass(frozen=True)
class ResolverResult:
    """One resolver update.  ``endpoints`` is a Status when resolution failed;
    ``lb_policy`` None keeps the previous policy (or the channel default,
    pick_first); ``service_config_error`` set means the resolver could not
    produce a usable config (the channel keeps the last good one, or fails
    RPCs with it if it never had one)."""

    endpoints: Sequence[Endpoint] | Status
    lb_policy: PolicySelection | None = None
    attributes: Mapping[str, Any] = field(default_factory=lambda: EMPTY_ATTRIBUTES)
    config_selector: ConfigSelector | None = None
    resolution_note: str = ""
    service_config_error: Status | None = None


class Closing(Protocol):
    """Something a resolver's shutdown started that ends later (an
    XdsClient's close); a ``threading.Event`` is one."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def _ignore_closing(closing: Closing) -> None:
    """The default :attr:`ResolverArgs.on_closing`: nobody waits."""


@dataclass
class ResolverArgs:
    """What the channel gives a resolver."""

    target: str  # the full target, e.g. "xds:///greeter"
    authority: str  # the data-plane authority, e.g. "greeter"
    serializer: WorkSerializer
    clock: Clock
    random: random.Random
    on_result: Callable[[ResolverResult], None]  # call on the serializer
    bootstrap: BootstrapSource = None  # path, dict, JSON text, or None (env vars)
    options: Mapping[str, Any] = field(default_factory=dict)
    #: ``shutdown()`` never blocks (it may run on the process's timer
    #: thread, draining the serializer); what it starts that ends later
    #: (an XdsClient's close: its ADS connection) it hands here, and the
    #: channel's ``close()`` waits for it before it returns.
    on_closing: Callable[[Closing], None] = _ignore_closing


class Resolver(ABC):
    """Produces ResolverResults for one channel."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def request_reresolution(self) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...

    def config_dump(self) -> dict[str, Any]:
        """Resolver-side state for ``channel.config_dump()``."""
        return {}
