"""The LB policy API pinned by ARCHITECTURE.md ("The LB policy API").

Every policy in :mod:`pyxds.lb` and every user policy speaks these types.  The
shape follows gRPC's LB policy API as described in gRFC A56 ("Child policy
handling") and A61: a policy receives :class:`ResolverUpdate` s, owns
subchannels made through its :class:`Helper`, and publishes an immutable
:class:`Picker` with its aggregate :class:`ConnectivityState`.

Rules every implementation follows:

* All methods of :class:`LoadBalancer` and every ``Helper`` callback run on the
  channel's work serializer; no policy takes a lock.
* Pickers are immutable and may be called from any thread at any time; a
  pick never blocks and never raises.
"""

from __future__ import annotations

import enum
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Union

import grpc

from pyxds._values import dataclass
from pyxds.status import OK_STATUS, Status

if TYPE_CHECKING:
    from pyxds.clock import Clock

__all__ = [
    "ConnectivityState",
    "Status",
    "OK_STATUS",
    "ATTEMPT_NOT_STARTED",
    "REQUEST_HASH_KEY",
    "AUTO_HOST_REWRITE_KEY",
    "OVERRIDE_HOST_ATTRIBUTE",
    "AUTHORITY_HEADER",
    "Endpoint",
    "ResolverUpdate",
    "PickArgs",
    "PickComplete",
    "TrailingMetadata",
    "PickQueue",
    "PickFail",
    "PickDrop",
    "PickResult",
    "Picker",
    "QueuePicker",
    "FailPicker",
    "Subchannel",
    "Helper",
    "LoadBalancer",
    "PolicyFactory",
    "EMPTY_ATTRIBUTES",
]

EMPTY_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})


class ConnectivityState(enum.Enum):
    """gRPC connectivity states (gRFC A56 uses them for child states)."""

    IDLE = "IDLE"
    CONNECTING = "CONNECTING"
    READY = "READY"
    TRANSIENT_FAILURE = "TRANSIENT_FAILURE"
    SHUTDOWN = "SHUTDOWN"


def _freeze_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if value is None:
        return EMPTY_ATTRIBUTES
    if isinstance(value, MappingProxyType):
        return value
    return MappingProxyType(dict(value))


@dataclass(frozen=True, eq=True, slots=True)
class Endpoint:
    """One backend.  Several addresses only for a dual-stack backend (A61).

    ``attributes`` carries e.g. ``hierarchical_path`` (tuple of child names,
    A56 "Hierarchical Addresses"), ``weight`` and ``locality``.  Equality is
    structural so that an unchanged address list is a no-op.

    Slotted (no per-instance ``__dict__``): a 10,000-endpoint cluster holds
    a few of these per endpoint.  ``_below`` is not part of the value: it
    caches the endpoint as the next level of the tree sees it (its
    hierarchical path without the first element), made once by
    :func:`pyxds.lb.hierarchy.split`, so that an endpoint passed down
    unchanged by the next update is split into the very same object and the
    levels below recognise it as unchanged by identity.  ``_address_set``
    is not part of the value either: :func:`address_set`'s cache.
    """

    addresses: tuple[str, ...]
    attributes: Mapping[str, Any] = field(default_factory=lambda: EMPTY_ATTRIBUTES)
    _below: Endpoint | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    _address_set: frozenset[str] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        addresses: object = self.addresses  # untyped callers may pass a str or a list
        if isinstance(addresses, str):
            object.__setattr__(self, "addresses", (addresses,))
        elif not isinstance(addresses, tuple):
            object.__setattr__(self, "addresses", tuple(self.addresses))
        object.__setattr__(self, "attributes", _freeze_mapping(self.attributes))

    def __hash__(self) -> int:
        return hash(self.addresses)

    @classmethod
    def trusted(cls, addresses: tuple[str, ...], attributes: Mapping[str, Any]) -> Endpoint:
        """An Endpoint from values already in canonical form (a tuple of
        addresses, a read-only mapping), without the checks of ``__init__``:
        for code that rebuilds thousands of endpoints per update."""
        endpoint = object.__new__(cls)
        _set_addresses(endpoint, addresses)
        _set_attributes(endpoint, attributes)
        _set_below(endpoint, None)
        _set_address_set(endpoint, None)
        return endpoint

    def with_attributes(self, **changes: Any) -> Endpoint:
        merged = dict(self.attributes)
        merged.update(changes)
        # Build the frozen mapping once: __post_init__ keeps a MappingProxyType as is.
        return Endpoint(self.addresses, MappingProxyType(merged))


@dataclass(frozen=True)
class ResolverUpdate:
    """What a parent (or the resolver) hands a policy.

    ``endpoints`` is a :class:`Status` when resolution failed.  ``config`` is
    this policy's parsed config (the value its factory's ``parse_config``
    returned).
    """

    endpoints: Sequence[Endpoint] | Status
    config: Any = None
    attributes: Mapping[str, Any] = field(default_factory=lambda: EMPTY_ATTRIBUTES)
    resolution_note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.endpoints, Status) and not isinstance(self.endpoints, tuple):
            object.__setattr__(self, "endpoints", tuple(self.endpoints))
        object.__setattr__(self, "attributes", _freeze_mapping(self.attributes))

    def replace(self, **changes: Any) -> ResolverUpdate:
        values = {
            "endpoints": self.endpoints,
            "config": self.config,
            "attributes": self.attributes,
            "resolution_note": self.resolution_note,
        }
        values.update(changes)
        return ResolverUpdate(**values)


REQUEST_HASH_KEY = "request_hash"
"""``PickArgs.call_attributes[REQUEST_HASH_KEY]``: the RPC's 64-bit request
hash (an ``int`` in [0, 2**64)), computed by the xDS ConfigSelector from the
route's hash policies (gRFC A42 "Hash computation") and read by
``ring_hash_experimental``; absent when the route has no hash policy."""

OVERRIDE_HOST_ATTRIBUTE = "xds_override_host"
"""``PickArgs.call_attributes[OVERRIDE_HOST_ATTRIBUTE]``: the RPC's
``OverrideHostAttribute`` (pyxds.lb.xds_override_host), set by the stateful
session filter (gRFC A55, A75) and read by ``xds_override_host``'s picker.
Here, not in that policy's module, so that the xDS ConfigSelector names it
without loading the policy before the first config comes (issue 18,
start-up: the policy loads on the load-ahead thread)."""

AUTO_HOST_REWRITE_KEY = "auto_host_rewrite"
"""``PickArgs.call_attributes[AUTO_HOST_REWRITE_KEY]``: True when the RPC's
route has ``auto_host_rewrite`` (gRFC A81 "xDS ConfigSelector Changes", from
a ``trusted_xds_server``); absent otherwise."""

AUTHORITY_HEADER = ":authority"
"""A ``PickComplete.metadata`` entry ``(AUTHORITY_HEADER, name)`` sets the
attempt's ``:authority`` to ``name`` (gRFC A81 "xds_cluster_impl LB Policy
Changes": the API by which a picker sets the authority); the channel sends
no such metadata entry (it is no legal metadata key).  The connection, and
the name its TLS handshake checks, stay the channel's."""


# PickArgs and PickComplete are made on every pick: frozen slotted
# dataclasses whose __init__ stores each field through its slot descriptor
# (the generated frozen __init__ pays an object.__setattr__ per field).
@dataclass(frozen=True, slots=True, init=False)
class PickArgs:
    """Per-RPC pick input.  ``call_attributes["cluster"]`` names the
    xds_cluster_manager child chosen by the ConfigSelector (A31);
    ``call_attributes[REQUEST_HASH_KEY]`` carries the request hash (A42)."""

    path: str
    metadata: Sequence[tuple[str, str | bytes]]
    call_attributes: Mapping[str, Any]

    def __init__(
        self,
        path: str,
        metadata: Sequence[tuple[str, str | bytes]] = (),
        call_attributes: Mapping[str, Any] = EMPTY_ATTRIBUTES,
    ) -> None:
        _set_path(self, path)
        _set_metadata(self, metadata)
        _set_call_attributes(self, call_attributes)


TrailingMetadata = Sequence[tuple[str, Union[str, bytes]]]


@dataclass(frozen=True, slots=True, init=False)
class PickComplete:
    """Send the RPC on ``subchannel``; call ``on_call_done(status)`` when it ends.

    ``on_call_trailers`` (optional): called with the attempt's trailing
    metadata, as ``(key, value)`` pairs, just before ``on_call_done``, when
    the subchannel call ended with trailers (gRFC A51 "Per-Request Metrics
    Reporting": how a policy such as ``weighted_round_robin`` reads the
    ``endpoint-load-metrics-bin`` ORCA report of the call it picked).  Not
    called for an RPC that never reached the subchannel.  A policy that
    wraps a child's ``PickComplete`` passes it through.

    ``attempt_labels`` (optional): optional labels for the attempt's A66
    per-attempt metrics (gRFC A78 "Per-Call Metrics": the mechanism by which
    a picker adds a label to the call attempt), e.g. ``grpc.lb.locality``
    set by ``xds_cluster_impl``.  The metrics recorder emits a label only
    when the user enabled it (``pyxds.metrics.enable(optional_labels=...)``).
    A constant mapping shared by the picks of one endpoint, never mutated.

    ``metadata`` (optional): headers the attempt sends in addition to the
    RPC's own, each replacing the RPC's values of its key (C-core's
    ``metadata_mutations``; the ``rls_experimental`` policy's
    ``x-google-rls-data``); an entry ``(AUTHORITY_HEADER, name)`` sets the
    attempt's ``:authority`` instead (A81)."""

    subchannel: Subchannel
    on_call_done: Callable[[Status], None] | None
    on_call_trailers: Callable[[TrailingMetadata], None] | None
    attempt_labels: Mapping[str, str] | None
    metadata: tuple[tuple[str, str], ...] | None

    def __init__(
        self,
        subchannel: Subchannel,
        on_call_done: Callable[[Status], None] | None = None,
        on_call_trailers: Callable[[TrailingMetadata], None] | None = None,
        attempt_labels: Mapping[str, str] | None = None,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> None:
        _set_subchannel(self, subchannel)
        _set_on_call_done(self, on_call_done)
        _set_on_call_trailers(self, on_call_trailers)
        _set_attempt_labels(self, attempt_labels)
        _set_pick_metadata(self, metadata)


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    setter: Callable[[Any, Any], None] = getattr(cls, name).__set__
    return setter


_set_addresses = _slot_setter(Endpoint, "addresses")
_set_attributes = _slot_setter(Endpoint, "attributes")
_set_below = _slot_setter(Endpoint, "_below")
"""``Endpoint._below`` is set once, by :func:`pyxds.lb.hierarchy.split`, and
never changes the endpoint's value (equality, hash, repr)."""
_set_address_set = _slot_setter(Endpoint, "_address_set")


def address_set(endpoint: Endpoint) -> frozenset[str]:
    """``frozenset(endpoint.addresses)``, the key policies match endpoints
    by (outlier_detection, round_robin): made once per endpoint object and
    handed on by :func:`pyxds.lb.hierarchy.split` to the endpoint the level
    below sees, so the policies of one tree hold one set per endpoint, not
    one each (issue 18), and an unchanged endpoint passed down again is not
    keyed anew."""
    key = endpoint._address_set
    if key is None:
        key = frozenset(endpoint.addresses)
        _set_address_set(endpoint, key)
    return key


_set_path = _slot_setter(PickArgs, "path")
_set_metadata = _slot_setter(PickArgs, "metadata")
_set_call_attributes = _slot_setter(PickArgs, "call_attributes")
_set_subchannel = _slot_setter(PickComplete, "subchannel")
_set_on_call_done = _slot_setter(PickComplete, "on_call_done")
_set_on_call_trailers = _slot_setter(PickComplete, "on_call_trailers")
_set_attempt_labels = _slot_setter(PickComplete, "attempt_labels")
_set_pick_metadata = _slot_setter(PickComplete, "metadata")


ATTEMPT_NOT_STARTED = Status(grpc.StatusCode.UNAVAILABLE, "subchannel not ready")
"""What a channel passes to ``PickComplete.on_call_done`` (this very object)
when it could not start the attempt on the picked subchannel (its connection
went away since the picker was built): the attempt never reached a backend,
so load reporting does not count it (A27; C-core starts its call tracker only
when the call starts)."""


@dataclass(frozen=True, slots=True)
class PickQueue:
    """Wait for the next picker."""


@dataclass(frozen=True, slots=True)
class PickFail:
    """Fail the RPC with ``status`` (a wait_for_ready RPC waits instead)."""

    status: Status


@dataclass(frozen=True, slots=True)
class PickDrop:
    """Fail the RPC with ``status`` even when it is wait_for_ready."""

    status: Status


PickResult = Union[PickComplete, PickQueue, PickFail, PickDrop]

_QUEUE = PickQueue()


class Picker(ABC):
    """Immutable; called on the RPC path from any thread."""

    @abstractmethod
    def pick(self, args: PickArgs) -> PickResult: ...

    def result_stream(self) -> Iterator[PickResult] | None:
        """An endless iterator whose every ``next()`` is a pick, offered by a
        picker whose result never depends on the ``PickArgs`` (round_robin and
        pick_first over READY subchannels); ``None`` (the default) otherwise.
        A parent may compose such streams with C-level ``map``/``itertools``
        so that a pick through it runs no Python frame (weighted_target does).
        Advancing the stream is a pick: it shares the picker's own rotation."""
        return None


class QueuePicker(Picker):
    """Queues every pick; optionally asks the policy to exit idle on first pick
    (the IDLE picker of A62).  ``on_pick`` runs on the picking thread, so it
    must only schedule the work, e.g.
    ``lambda: helper.clock.call_later(0, policy.exit_idle)``."""

    __slots__ = ("_on_pick", "_triggered")

    def __init__(self, on_pick: Callable[[], None] | None = None) -> None:
        self._on_pick = on_pick
        self._triggered = False

    def pick(self, args: PickArgs) -> PickResult:
        if self._on_pick is not None and not self._triggered:
            self._triggered = True
            self._on_pick()
        return _QUEUE

    def __repr__(self) -> str:
        return "QueuePicker(exit_idle)" if self._on_pick else "QueuePicker()"


class FailPicker(Picker):
    """Fails every pick with one status (TRANSIENT_FAILURE picker)."""

    __slots__ = ("status", "_result")

    def __init__(self, status: Status) -> None:
        self.status = status
        self._result = PickFail(status)

    def pick(self, args: PickArgs) -> PickResult:
        return self._result

    def __repr__(self) -> str:
        return f"FailPicker({self.status})"


class Subchannel(ABC):
    """A connection to one address.  Owns its reconnect backoff: after
    TRANSIENT_FAILURE it reports IDLE once backoff ends; ``connect()`` on IDLE
    retries.  ``watch_state`` calls ``fn`` with the current state at once,
    then on every change (always on the serializer); it returns an unwatch."""

    address: str

    @abstractmethod
    def connect(self) -> None: ...

    @abstractmethod
    def watch_state(
        self, fn: Callable[[ConnectivityState, Status], None]
    ) -> Callable[[], None]: ...

    @abstractmethod
    def shutdown(self) -> None: ...

    def reset_backoff(self) -> None:  # noqa: B027 - optional hook
        """Optional: end the current backoff early."""

    def watch_health(
        self, fn: Callable[[ConnectivityState, Status], None]
    ) -> Callable[[], None] | None:
        """Optional: the health watch of A61 ("Generic Health Reporting
        Mechanism"), C-core's and grpc-go's health listener: ``fn(state,
        status)`` with the subchannel's health now, then on every change
        (on the serializer), until the returned unwatch is called.  The
        health is the connectivity state, except while the subchannel is
        READY: then what client-side health checking says (A17: CONNECTING
        until the first answer, READY when SERVING, TRANSIENT_FAILURE
        otherwise).  pick_first under a petiole policy starts it on the
        subchannel it selected and reports it, keeping connection
        management on ``watch_state``.

        None (the default): the subchannel has no health signal but its
        connectivity (the channel does not health check), and the caller
        uses ``watch_state`` alone."""
        return None


class Helper(ABC):
    """What a parent gives its child (A56 "Child policy handling")."""

    clock: Clock
    random: random.Random
    #: The channel's target (A66/A78 ``grpc.target`` label); "" outside a channel.
    channel_target: str = ""
    #: The channel's authority (``echo`` for ``xds:///echo``); "" outside a channel.
    channel_authority: str = ""

    # Optional capability (looked up with getattr, forwarded by
    # DelegatingHelper): ``create_route_lookup_channel(target, service_config)
    # -> pyxds.lb.rls.RouteLookupChannel``, a channel of the policy's own to a
    # Route Lookup Service (``rls_experimental``), built by the pyxds channel.

    @abstractmethod
    def create_subchannel(self, address: str, attributes: Mapping[str, Any]) -> Subchannel: ...

    @abstractmethod
    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None: ...

    @abstractmethod
    def request_reresolution(self) -> None: ...


class LoadBalancer(ABC):
    """A load-balancing policy instance.  Every method runs on the serializer."""

    @abstractmethod
    def update(self, update: ResolverUpdate) -> Status | None:
        """Apply an update; a non-None return means it was rejected."""

    @abstractmethod
    def resolver_error(self, status: Status) -> None: ...

    @abstractmethod
    def exit_idle(self) -> None: ...

    @abstractmethod
    def reset_backoff(self) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...


class PolicyFactory(ABC):
    """Registered by name in :mod:`pyxds.lb.registry`."""

    name: str

    @abstractmethod
    def parse_config(self, json_config: Any) -> Any:
        """Return a frozen, comparable config; raise LBConfigError naming the field."""

    @abstractmethod
    def build(self, helper: Helper) -> LoadBalancer: ...
