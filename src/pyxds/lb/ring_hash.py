"""The ``ring_hash_experimental`` LB policy: gRFC A42 "xDS Ring Hash LB
Policy", with A61's change that every endpoint is a pick_first child, and
C-core's ring construction, picker, aggregation and error text (so the same
request hash reaches the same backend as grpcio does).

Config: ``{"minRingSize": uint64, "maxRingSize": uint64}``, defaults 1024
and 4096, both in [1, 8388608] and ``minRingSize <= maxRingSize`` (A42
"LB Policy Config"; the 4096 default for ``maxRingSize`` is C-core's and
grpc-go's, A42's text says 8M; the xDS path always sets both fields).  A
bad value raises :class:`LBConfigError` naming the field.

A76 ``requestHashHeader`` (a string): honoured, as by C-core and grpc-go,
only when ``GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY`` is ``true``
(read when the config is parsed); otherwise ignored.  When honoured it must
be a valid lower-case header name (upper case is folded) and not a ``-bin``
header, else :class:`LBConfigError` naming ``requestHashHeader``.

A76 endpoint hash keys: an endpoint whose ``hash_key`` attribute is a
non-empty string is placed on the ring by that key instead of its first
address (a custom resolver may set it; the cds policy sets it from EDS
``envoy.lb`` / ``hash_key`` metadata when
GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT is ``false``).

Rules
=====

Endpoints (C-core ``RingHash::UpdateLocked``)
    Endpoints are identified by their *set* of addresses.  Duplicates are
    merged into the first occurrence, weights added (a missing weight counts
    as 1).  An endpoint's weight is ``attributes["weight"]`` (the cds policy
    puts locality weight x endpoint weight there); a missing or non-positive
    weight is 1.  Addresses are not de-duplicated *across* endpoints (unlike
    round_robin), as C-core.

Ring (A42 "Ring Construction"; C-core ``RingHash::Ring``)
    The effective sizes are capped: ``min_ring = min(minRingSize, cap)``,
    ``max_ring = min(maxRingSize, cap)``, ``cap`` = :data:`RING_SIZE_CAP`
    (4096, C-core's ``grpc.lb.ring_hash.ring_size_cap`` default; a factory
    can be built with another cap).  With ``norm_i = w_i / sum(w)`` and
    ``scale = min(ceil(min(norm) * min_ring) / min(norm), max_ring)``, the
    endpoints are walked in order keeping two float running sums: ``target
    += scale * norm_i``, and while ``current < target`` the entry
    ``(XXH64(f"{address}_{n}", seed=0), i)`` is appended (``n`` counts from
    0 per endpoint) and ``current += 1``.  ``address`` is the endpoint's
    first address as pyxds writes it (``ip:port``, ``[ipv6]:port``; EDS
    canonicalises IPv6 with inet_ntop, as C-core's sockaddr_to_string).
    The entries are then sorted by hash.  Python floats are IEEE doubles, so
    every intermediate value is the one C-core computes.  A ring is rebuilt
    only when the endpoint keys, weights or sizes change.

Children (A61 "ring_hash"; C-core ``RingHashEndpoint``)
    One :class:`~pyxds.lb.pick_first.PickFirst` per endpoint, created
    lazily: an endpoint starts IDLE with no child and no subchannel; its
    child is created (and so starts connecting) only when a pick lands on it
    or by the recovery rule below.  Later connection requests call the
    child's ``exit_idle``.  An endpoint whose address set is unchanged keeps
    its child (and connection) across updates; a removed endpoint's child is
    shut down at once.  Children are pick_first, so an endpoint in
    TRANSIENT_FAILURE keeps retrying with backoff by itself (sticky TF), and
    re-resolution requests come from the children (all addresses failed,
    connection dropped).  A child that goes IDLE (its connection dropped)
    stays IDLE until a pick needs it: ring_hash is lazy.

Picker (A42 "Picker Behavior" as amended by A61 and A76; C-core ``Picker::Pick``)
    Without ``requestHashHeader``: ``h = call_attributes[REQUEST_HASH_KEY]``;
    when absent on an xDS call (``call_attributes["cluster"]`` set: no route
    hash policy produced a hash), a random 64-bit value from
    ``helper.random``, which is what C-core's ConfigSelector puts there in
    that case; when absent on a non-xDS call the pick fails INTERNAL "hash
    attribute not present" (A76 pseudo code, C-core's words).  With
    ``requestHashHeader``: ``h`` is XXH64 (seed 0) of the header's values
    joined with ``","``; when the request lacks the header, ``h`` is random
    and the ring is walked from it for the first READY endpoint, asking at
    most one IDLE endpoint on the way to connect (none if some endpoint is
    CONNECTING), queueing if a connection was asked for, else failing as
    below (A76 "Explicitly setting the request hash key").  The
    start is the first ring entry with ``hash >= h``, wrapping to 0 (the
    ketama binary search C-core uses finds exactly that entry; here it is
    ``bisect_left``).  From there the ring is walked: READY -> the child's
    picker decides; IDLE -> schedule that endpoint's connection request on
    the serializer (``helper.clock.call_later(0, ...)``, never on the pick's
    stack; an asyncio channel runs it on its loop after the pick) and
    queue; CONNECTING -> queue; TRANSIENT_FAILURE -> next entry.
    If every endpoint is in TRANSIENT_FAILURE the pick fails UNAVAILABLE
    "ring hash cannot find a connected endpoint; first failure: <message
    of the start entry's endpoint>" (plus `` (<resolution note>)`` when
    there is one), C-core's words.  The picker is immutable; for each ring
    position it precomputes the first position whose endpoint is not in
    TRANSIENT_FAILURE, so a pick is one ``bisect`` plus O(1).  ring_hash
    reports this picker in every state (IDLE, CONNECTING and
    TRANSIENT_FAILURE included), as C-core does.  What the picker reads per
    endpoint the policy keeps by endpoint index, changed one endpoint at a
    time as each reports, with how many endpoints are in each state: an
    endpoint's report costs O(1) Python plus the picker's snapshot (tuple
    copies, done in C), and the skip table is recomputed only when an
    endpoint enters or leaves TRANSIENT_FAILURE.

Aggregate state (C-core ``UpdateAggregatedConnectivityStateLocked``)
    First rule that matches: READY if any endpoint is READY; TRANSIENT_FAILURE
    if two or more are; CONNECTING if any is; CONNECTING if exactly one is in
    TRANSIENT_FAILURE and there is more than one endpoint; IDLE if any is;
    else TRANSIENT_FAILURE.  The TRANSIENT_FAILURE status is UNAVAILABLE "no
    reachable endpoints; last error: <the last endpoint failure>".

Recovery (A42 "Aggregated Connectivity State" and C-core's comment there)
    A parent such as priority stops sending picks to a child that reports
    TRANSIENT_FAILURE (and, behind its failover timer, CONNECTING).  So
    whenever the aggregate is CONNECTING or TRANSIENT_FAILURE, no endpoint
    is CONNECTING and one is IDLE, ring_hash asks one IDLE endpoint to
    connect: the first IDLE endpoint in C-core's endpoint-map order (address
    sets ordered as C-core orders socket addresses: IPv4 before IPv6, then
    port, then address bytes).  Each failure thus moves the attempt to
    another endpoint until one connects.

Updates and errors
    An empty endpoint list: children shut down, TRANSIENT_FAILURE "empty
    address list", re-resolution requested, and ``update`` returns the
    status.  A resolver error (or an update carrying one) is ignored while
    there are endpoints (C-core keeps using them); otherwise it is reported
    as TRANSIENT_FAILURE.  ``exit_idle`` does nothing (C-core's ring_hash
    has no ExitIdle: connections follow picks).  ``reset_backoff`` reaches
    every child.  A state is reported only when it, its status, the ring or
    some endpoint's state/picker changed, so the same update twice reports
    nothing (C-core re-reports; TRAPS.md "the same config twice is a no-op").
"""

from __future__ import annotations

import math
import os
import re
import socket
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import xxhash

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    REQUEST_HASH_KEY,
    ConnectivityState,
    Endpoint,
    FailPicker,
    Helper,
    LoadBalancer,
    PickArgs,
    Picker,
    PickFail,
    PickQueue,
    PickResult,
    PolicyFactory,
    ResolverUpdate,
    Status,
    Subchannel,
)
from pyxds.lb.child_handler import DelegatingHelper
from pyxds.lb.errors import LBConfigError, decimal_string, describe
from pyxds.lb.pick_first import PickFirst, PickFirstConfig

__all__ = [
    "DEFAULT_MAX_RING_SIZE",
    "DEFAULT_MIN_RING_SIZE",
    "MAX_RING_SIZE",
    "POLICY_NAME",
    "RING_SIZE_CAP",
    "Ring",
    "RingHash",
    "RingHashConfig",
    "RingHashFactory",
    "RingHashPicker",
    "aggregate_state",
    "build_ring",
]

POLICY_NAME = "ring_hash_experimental"
MAX_RING_SIZE = 8_388_608  # A42: upper bound of both config fields
DEFAULT_MIN_RING_SIZE = 1024
DEFAULT_MAX_RING_SIZE = 4096  # C-core's (and grpc-go's) default
RING_SIZE_CAP = 4096  # C-core GRPC_ARG_RING_HASH_LB_RING_SIZE_CAP default
WEIGHT_KEY = "weight"

_IDLE = ConnectivityState.IDLE
_CONNECTING = ConnectivityState.CONNECTING
_READY = ConnectivityState.READY
_TF = ConnectivityState.TRANSIENT_FAILURE
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_CHILD_CONFIG = PickFirstConfig()
_QUEUE = PickQueue()
_CODE_PREFIXES = tuple(f"{code.name}: " for code in grpc.StatusCode)
_NO_CONNECTED_ENDPOINT = "ring hash cannot find a connected endpoint; first failure: "
_NO_HASH = PickFail(Status(grpc.StatusCode.INTERNAL, "hash attribute not present"))
HASH_KEY_ATTRIBUTE = "hash_key"  # A76 endpoint hash key (cds sets it from EDS metadata)
CLUSTER_ATTRIBUTE = "cluster"  # set on every call routed by the xDS ConfigSelector
REQUEST_HASH_HEADER_ENV = "GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY"
_HEADER_NAME = re.compile(r"^[0-9a-z_.-]+$")


def request_hash_header_enabled() -> bool:
    """A76's temporary gate, as C-core and grpc-go read it."""
    return os.environ.get(REQUEST_HASH_HEADER_ENV, "").strip().lower() == "true"


# -- config --------------------------------------------------------------------


@dataclass(frozen=True)
class RingHashConfig:
    """Parsed ``ring_hash_experimental`` config (A42)."""

    min_ring_size: int = DEFAULT_MIN_RING_SIZE
    max_ring_size: int = DEFAULT_MAX_RING_SIZE
    request_hash_header: str = ""  # A76; "" = the hash comes from the xDS ConfigSelector


def _ring_size(obj: dict[str, Any], name: str, default: int) -> int:
    if name not in obj:
        return default
    value = obj[name]
    # A JSON number, or a decimal string (proto3 JSON writes uint64 so; read
    # as grpcio 1.85 reads it: blanks around and a leading "+" allowed).
    if isinstance(value, str):
        value = decimal_string(value)
    if isinstance(value, bool) or not isinstance(value, int):  # 10.0 too, as grpcio 1.85
        raise LBConfigError(name, f"expected integer, got {describe(obj[name])}")
    number = int(value)
    if not 1 <= number <= MAX_RING_SIZE:
        raise LBConfigError(name, f"must be in the range [1, {MAX_RING_SIZE}], got {number}")
    return number


def _request_hash_header(value: Any) -> str:
    if not isinstance(value, str):
        raise LBConfigError("requestHashHeader", f"expected string, got {describe(value)}")
    name = value.lower()
    if not name:
        return ""
    if not _HEADER_NAME.match(name):
        raise LBConfigError("requestHashHeader", f"invalid header name {value!r}")
    if name.endswith("-bin"):
        raise LBConfigError("requestHashHeader", f"binary header {value!r} not allowed")
    return name


def _header_value(metadata: Sequence[tuple[str, Any]], name: str) -> str | None:
    """The request's values of header ``name`` joined with "," (A76), or None."""
    values = []
    for key, value in metadata:
        if key.lower() == name:
            if isinstance(value, bytes):
                value = value.decode("ascii", "replace")
            values.append(value)
    if not values:
        return None
    return values[0] if len(values) == 1 else ",".join(values)


class RingHashFactory(PolicyFactory):
    """``ring_size_cap`` plays C-core's ``grpc.lb.ring_hash.ring_size_cap``."""

    name = POLICY_NAME

    def __init__(self, ring_size_cap: int = RING_SIZE_CAP) -> None:
        self.ring_size_cap = ring_size_cap

    def parse_config(self, json_config: Any) -> RingHashConfig:
        if json_config is None:
            return RingHashConfig()
        if not isinstance(json_config, dict):
            raise LBConfigError("", f"expected object, got {describe(json_config)}")
        low = _ring_size(json_config, "minRingSize", DEFAULT_MIN_RING_SIZE)
        high = _ring_size(json_config, "maxRingSize", DEFAULT_MAX_RING_SIZE)
        if low > high:
            raise LBConfigError("maxRingSize", "cannot be smaller than minRingSize")
        header = ""
        if request_hash_header_enabled() and "requestHashHeader" in json_config:
            header = _request_hash_header(json_config["requestHashHeader"])
        return RingHashConfig(low, high, header)

    def build(self, helper: Helper) -> RingHash:
        return RingHash(helper, ring_size_cap=self.ring_size_cap)


# -- the ring ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Ring:
    """Sorted ring: ``hashes[k]`` belongs to endpoint ``endpoints[k]``."""

    hashes: tuple[int, ...]
    endpoints: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.hashes)

    def start(self, request_hash: int) -> int:
        """Index of the first entry with ``hash >= request_hash``, else 0."""
        index = bisect_left(self.hashes, request_hash)
        return 0 if index == len(self.hashes) else index


def build_ring(
    hash_keys: Sequence[str], weights: Sequence[int], min_ring_size: int, max_ring_size: int
) -> Ring:
    """A42's ring over endpoints given by their hash key (first address) and
    weight, with already capped sizes (module docstring, "Ring")."""
    total = sum(weights)
    normalized = [weight / total for weight in weights]
    min_normalized = min([1.0, *normalized])
    scale = min(math.ceil(min_normalized * min_ring_size) / min_normalized, float(max_ring_size))
    entries: list[tuple[int, int]] = []
    digest = xxhash.xxh64_intdigest
    current = 0.0
    target = 0.0
    for index, (key, share) in enumerate(zip(hash_keys, normalized, strict=True)):
        prefix = f"{key}_"
        target += scale * share
        count = 0
        while current < target:
            entries.append((digest(f"{prefix}{count}".encode(), 0), index))
            count += 1
            current += 1.0
    entries.sort(key=lambda entry: entry[0])
    return Ring(tuple(h for h, _ in entries), tuple(i for _, i in entries))


# -- helpers -------------------------------------------------------------------


def _message(status: Status) -> str:
    """The status message alone (C-core's ``status.message()``).  A
    pick_first child under a petiole reports ``str(last failure)``, i.e.
    ``"UNAVAILABLE: <message>"``; the code is dropped here."""
    details = status.details
    for prefix in _CODE_PREFIXES:
        if details.startswith(prefix):
            return details[len(prefix) :]
    return details


def _ring_key(endpoint: Endpoint) -> str:
    """A76: the ``hash_key`` attribute when it is a non-empty string, else
    the first address."""
    key = endpoint.attributes.get(HASH_KEY_ATTRIBUTE)
    if isinstance(key, str) and key:
        return key
    return endpoint.addresses[0]


def _raw_weight(endpoint: Endpoint) -> int:
    weight = endpoint.attributes.get(WEIGHT_KEY)
    if isinstance(weight, bool) or not isinstance(weight, int):
        return 1
    return weight


def _address_order_key(address: str) -> tuple[Any, ...]:
    """Where C-core's socket-address comparison (length, then memcmp of the
    sockaddr: family, port in network order, address bytes) puts ``address``:
    IPv4 before IPv6, then port, then address.  Other targets come last."""
    host, _, port = address.rpartition(":")
    if not (port.isascii() and port.isdigit()):
        return (2, address)
    if host.startswith("[") and host.endswith("]"):
        family, host = socket.AF_INET6, host[1:-1]
    else:
        family = socket.AF_INET
    try:
        packed = socket.inet_pton(family, host.split("%", 1)[0])
    except OSError:
        return (2, address)
    return (0 if family == socket.AF_INET else 1, int(port), packed)


def aggregate_state(states: Sequence[ConnectivityState]) -> ConnectivityState:
    """C-core's six aggregation rules, first match wins (module docstring,
    "Aggregate state")."""
    return _aggregate_counts(
        states.count(_READY),
        states.count(_CONNECTING),
        states.count(_IDLE),
        states.count(_TF),
        len(states),
    )


def _aggregate_counts(
    ready: int, connecting: int, idle: int, failing: int, total: int
) -> ConnectivityState:
    """:func:`aggregate_state` from how many endpoints are in each state."""
    if ready:
        return _READY
    if failing >= 2:
        return _TF
    if connecting or (failing == 1 and total > 1):
        return _CONNECTING
    if idle:
        return _IDLE
    return _TF


# -- children ------------------------------------------------------------------


class _Endpoint(DelegatingHelper):
    """One endpoint: its (lazily created) pick_first child and what that child
    last reported.  It is also the helper the child sees."""

    def __init__(self, owner: RingHash, key: frozenset[str], endpoint: Endpoint) -> None:
        super().__init__(owner.helper)
        self.owner = owner
        self.key = key
        self.endpoint = endpoint
        self.order_key = tuple(sorted(_address_order_key(a) for a in key))
        self.state = _IDLE
        self.status = OK_STATUS
        self.picker: Picker | None = None
        self.policy: PickFirst | None = None
        self.closed = False
        self.last_update: ResolverUpdate | None = None
        #: this endpoint's pieces of the pickers (RingHashPicker.parts_of)
        self.pick_parts: tuple[Any, ...] = ()
        self.pick_parts_key: tuple[Any, ...] | None = None
        #: its position in the policy's endpoint list (the ring's indices)
        self.index = 0

    # -- Helper (what the child calls) -----------------------------------------
    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        if self.closed or self.policy is None:
            return
        self.state, self.status, self.picker = state, status, picker
        self.owner._on_child_state(self)

    def request_reresolution(self) -> None:
        if not self.closed:
            self.parent.request_reresolution()

    # -- what ring_hash calls ------------------------------------------------------
    def request_connection(self) -> None:
        """C-core ``RequestConnectionLocked``: create the child (which starts
        connecting) or ask it to exit IDLE."""
        if self.closed:
            return
        if self.policy is None:
            self.policy = PickFirst(self, omit_status_prefix=True, health_watch=True)
            if self.update_child() is not None:
                self.parent.request_reresolution()
        else:
            self.policy.exit_idle()

    def update_child(self) -> Status | None:
        """Give the child the current endpoint (if the child exists and the
        endpoint or the resolution note changed: pick_first reads no update
        attributes, so a new xds_config attribute alone reaches no child)."""
        if self.policy is None:
            return None
        update = ResolverUpdate(
            (self.endpoint,), _CHILD_CONFIG, self.owner._attributes, self.owner._note
        )
        last = self.last_update
        if last is not None and (last.endpoints, last.resolution_note) == (
            update.endpoints,
            update.resolution_note,
        ):
            return None
        self.last_update = update
        return self.policy.update(update)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.policy is not None:
                self.policy.shutdown()

    def __repr__(self) -> str:
        return f"_Endpoint({sorted(self.key)}, {self.state.name})"


# -- the picker ------------------------------------------------------------------


class _Columns:
    """What a ring_hash picker reads per endpoint (its state, and its
    connect, pick action and failed pick, :meth:`RingHashPicker._parts_of`),
    by endpoint index, with how many endpoints are in each state.  The policy
    keeps one, rebuilt on an update and changed one endpoint at a time on
    each report, so a report costs O(1) Python and its picker O(N) tuple
    copies made in C (issue 18 item 4: over 1000 lazily connecting
    endpoints, rebuilding every column in Python on each of a connection's
    two reports cost ~1 ms per report)."""

    __slots__ = ("states", "connects", "actions", "fails", "counts", "_usable", "_usable_ring")

    def __init__(
        self, endpoints: Sequence[_Endpoint], schedule: Callable[[_Endpoint], None], note: str
    ) -> None:
        parts = [RingHashPicker._parts_of(endpoint, schedule, note) for endpoint in endpoints]
        self.states = [endpoint.state for endpoint in endpoints]
        self.connects = [p[0] for p in parts]
        self.actions = [p[1] for p in parts]
        self.fails = [p[2] for p in parts]
        self.counts = dict.fromkeys(ConnectivityState, 0)
        for state in self.states:
            self.counts[state] += 1
        self._usable: tuple[int, ...] | None = None
        self._usable_ring: Ring | None = None  # the ring _usable is for; None: stale

    def set(
        self, index: int, endpoint: _Endpoint, schedule: Callable[[_Endpoint], None], note: str
    ) -> None:
        """Endpoint ``index`` (``endpoint``) reported a new state or picker."""
        old, new = self.states[index], endpoint.state
        if old is not new:
            self.counts[old] -= 1
            self.counts[new] += 1
            self.states[index] = new
            if (old is _TF) is not (new is _TF):
                self._usable_ring = None
        self.connects[index], self.actions[index], self.fails[index] = RingHashPicker._parts_of(
            endpoint, schedule, note
        )

    def usable_positions(self, ring: Ring) -> tuple[int, ...] | None:
        """For each position of ``ring``, the first position from it (cyclic)
        whose endpoint is not in TRANSIENT_FAILURE; -1 everywhere when there
        is none; None when every position is usable (the common case).  Kept
        until an endpoint enters or leaves TRANSIENT_FAILURE."""
        if self._usable_ring is not ring:
            self._usable = _usable_positions(ring, self.states, self.counts[_TF])
            self._usable_ring = ring
        return self._usable


def _usable_positions(
    ring: Ring, states: Sequence[ConnectivityState], failing_count: int
) -> tuple[int, ...] | None:
    """:meth:`_Columns.usable_positions`, computed."""
    if not failing_count:
        return None
    size = len(ring)
    if failing_count == len(states):
        return (-1,) * size
    bad = [states[e] is _TF for e in ring.endpoints]
    nxt = [0] * size
    # Two backward passes make the search wrap around.
    following = -1
    for _ in range(2):
        for position in range(size - 1, -1, -1):
            if not bad[position]:
                following = position
            nxt[position] = following
    return tuple(nxt)


#: An endpoint's (connect, pick action, failed pick), as a picker uses them.
_PickParts = tuple[Callable[[], None], Callable[[PickArgs], PickResult], PickFail]


class RingHashPicker(Picker):
    """The immutable ring_hash picker (module docstring, "Picker")."""

    __slots__ = (
        "_actions",
        "_connects",
        "_fails",
        "_has_connecting",
        "_header",
        "_next_usable",
        "_random_bits",
        "_ring",
        "states",
    )

    def __init__(
        self,
        ring: Ring,
        columns: _Columns,
        random_bits: Callable[[int], int],
        request_hash_header: str = "",
    ) -> None:
        self._ring = ring
        self._random_bits = random_bits
        self._header = request_hash_header
        # Snapshots of the policy's columns (tuples: a picker never changes).
        self.states = tuple(columns.states)
        self._has_connecting = columns.counts[_CONNECTING] > 0
        self._connects = tuple(columns.connects)
        self._actions = tuple(columns.actions)
        self._fails = tuple(columns.fails)
        self._next_usable = columns.usable_positions(ring)

    @classmethod
    def over(
        cls,
        ring: Ring,
        endpoints: Sequence[Any],
        schedule: Callable[[Any], None],
        random_bits: Callable[[int], int],
        note: str,
        request_hash_header: str = "",
    ) -> RingHashPicker:
        """A picker over ``endpoints`` as they are now (each with ``state``,
        ``status`` and ``picker``), its columns built from them."""
        return cls(ring, _Columns(endpoints, schedule, note), random_bits, request_hash_header)

    @classmethod
    def _parts_of(
        cls, endpoint: Any, schedule: Callable[[_Endpoint], None], note: str
    ) -> _PickParts:
        """``endpoint``'s (connect, pick action, failed pick), made anew only
        when its state, status, picker or the note changed (kept on it)."""
        key = (endpoint.state, endpoint.status, endpoint.picker, note, schedule)
        if key == getattr(endpoint, "pick_parts_key", None):
            kept: _PickParts = endpoint.pick_parts
            return kept
        text = _NO_CONNECTED_ENDPOINT + _message(endpoint.status)
        if note:
            text = f"{text} ({note})"
        parts: _PickParts = (
            lambda: schedule(endpoint),
            cls._action(endpoint, schedule),
            PickFail(Status(_UNAVAILABLE, text)),
        )
        endpoint.pick_parts, endpoint.pick_parts_key = parts, key
        return parts

    @staticmethod
    def _action(
        endpoint: _Endpoint, schedule: Callable[[_Endpoint], None]
    ) -> Callable[[PickArgs], PickResult]:
        state = endpoint.state
        if state is _READY and endpoint.picker is not None:
            return endpoint.picker.pick
        if state is _IDLE:

            def connect_and_queue(args: PickArgs) -> PickResult:
                schedule(endpoint)
                return _QUEUE

            return connect_and_queue
        return lambda args: _QUEUE  # CONNECTING (TRANSIENT_FAILURE is skipped)

    def pick(self, args: PickArgs) -> PickResult:
        if self._header:
            value = _header_value(args.metadata, self._header)
            if value is None:
                return self._pick_random(args)
            request_hash = xxhash.xxh64_intdigest(value.encode(), seed=0)
        else:
            hash_or_none: int | None = args.call_attributes.get(REQUEST_HASH_KEY)
            if hash_or_none is None:
                if CLUSTER_ATTRIBUTE not in args.call_attributes:
                    return _NO_HASH  # not an xDS call: nothing set the hash
                hash_or_none = self._random_bits(64)
            request_hash = hash_or_none
        ring = self._ring
        position = ring.start(request_hash)
        if self._next_usable is not None:
            usable = self._next_usable[position]
            if usable < 0:
                return self._fails[ring.endpoints[position]]
            position = usable
        return self._actions[ring.endpoints[position]](args)

    def _pick_random(self, args: PickArgs) -> PickResult:
        """A76: a request without the hash header: the first READY endpoint
        from a random position, asking at most one IDLE endpoint to connect
        on the way (none while one is CONNECTING)."""
        ring = self._ring
        start = ring.start(self._random_bits(64))
        requested = self._has_connecting
        states, owners, size = self.states, ring.endpoints, len(ring)
        for offset in range(size):
            index = owners[(start + offset) % size]
            state = states[index]
            if state is _READY:
                return self._actions[index](args)
            if not requested and state is _IDLE:
                self._connects[index]()
                requested = True
        if requested:
            return _QUEUE
        return self._fails[owners[start]]

    def __repr__(self) -> str:
        return f"RingHashPicker({len(self._ring)} entries, {[s.name for s in self.states]})"


# -- the policy ------------------------------------------------------------------


class RingHash(LoadBalancer):
    """ring_hash over lazily created pick_first children (module docstring)."""

    def __init__(self, helper: Helper, *, ring_size_cap: int = RING_SIZE_CAP) -> None:
        self.helper = helper
        self._cap = ring_size_cap
        self._endpoints: list[_Endpoint] = []  # ring order of endpoint indices
        self._by_key: dict[frozenset[str], _Endpoint] = {}
        self._ring: Ring | None = None
        self._ring_key: tuple[Any, ...] | None = None
        self._attributes: Any = {}
        self._note = ""
        self._header = ""
        self._last_failure = Status(
            _UNAVAILABLE, "no reachable endpoints; last error: no connection attempt yet"
        )
        self._reported_key: tuple[Any, ...] | None = None
        #: the picker's columns (:class:`_Columns`), for ``_endpoints``
        self._columns = _Columns((), self._schedule_connection, "")
        #: endpoints by C-core's endpoint-map order (the recovery rule's)
        self._by_order: list[_Endpoint] = []
        #: each endpoint's (state, status, picker) when a picker was last
        #: reported, for ``_reported_endpoints``; ``_changed``: the indices
        #: whose triple differs from it now
        self._reported_children: list[tuple[Any, ...] | None] = []
        self._reported_endpoints: list[_Endpoint] = []
        self._changed: set[int] = set()
        self._updating = False
        self._shutdown = False

    # -- introspection (tests, config dumps) ---------------------------------------
    @property
    def ring(self) -> Ring | None:
        return self._ring

    @property
    def endpoints(self) -> list[_Endpoint]:
        """The endpoints, in the order that indexes the ring."""
        return list(self._endpoints)

    @property
    def subchannels(self) -> list[Subchannel]:
        return [sc for e in self._endpoints if e.policy is not None for sc in e.policy.subchannels]

    # -- LoadBalancer ------------------------------------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._shutdown:
            return None
        if isinstance(update.endpoints, Status):
            self.resolver_error(update.endpoints)
            return update.endpoints
        config = update.config if isinstance(update.config, RingHashConfig) else RingHashConfig()
        merged = self._merge(update.endpoints)
        self._attributes = update.attributes
        self._note = update.resolution_note
        self._header = config.request_hash_header
        if not merged:
            return self._on_empty_list()
        old = self._by_key
        endpoints: list[_Endpoint] = []
        by_key: dict[frozenset[str], _Endpoint] = {}
        for key, endpoint in merged.items():
            child = old.get(key)
            if child is None:
                child = _Endpoint(self, key, endpoint)
            else:
                child.endpoint = endpoint
            endpoints.append(child)
            by_key[key] = child
        for key, child in old.items():
            if key not in by_key:
                child.close()
        self._endpoints, self._by_key = endpoints, by_key
        self._ring_for(config)
        self._updating = True
        try:
            for child in endpoints:
                child.update_child()
        finally:
            self._updating = False
        self._rebuild_columns()
        self._aggregate(None)
        return None

    def resolver_error(self, status: Status) -> None:
        if self._shutdown or self._endpoints:
            return  # keep using the endpoints we have (C-core)
        self._report(_TF, status, FailPicker(status), key=(_TF, status))

    def exit_idle(self) -> None:
        """Nothing: connections follow picks (C-core's ring_hash has no ExitIdle)."""

    def reset_backoff(self) -> None:
        for child in self._endpoints:
            if child.policy is not None:
                child.policy.reset_backoff()

    def shutdown(self) -> None:
        self._shutdown = True
        for child in self._endpoints:
            child.close()
        self._endpoints, self._by_key = [], {}

    # -- updates -----------------------------------------------------------------
    @staticmethod
    def _merge(endpoints: Sequence[Endpoint]) -> dict[frozenset[str], Endpoint]:
        """Endpoints by address set, duplicates merged into the first with
        their weights added (C-core)."""
        merged: dict[frozenset[str], Endpoint] = {}
        for endpoint in endpoints:
            if not endpoint.addresses:
                continue
            key = frozenset(endpoint.addresses)
            first = merged.get(key)
            if first is None:
                merged[key] = endpoint
                continue
            attributes = dict(first.attributes)
            attributes[WEIGHT_KEY] = _raw_weight(first) + _raw_weight(endpoint)
            merged[key] = Endpoint(first.addresses, attributes)
        return merged

    def _ring_for(self, config: RingHashConfig) -> None:
        keys = tuple(_ring_key(child.endpoint) for child in self._endpoints)
        weights = []
        for child in self._endpoints:
            weight = _raw_weight(child.endpoint)
            weights.append(weight if weight > 0 else 1)
        low = min(config.min_ring_size, self._cap)
        high = min(config.max_ring_size, self._cap)
        ring_key = (keys, tuple(weights), low, high)
        if ring_key != self._ring_key or self._ring is None:
            self._ring = build_ring(keys, weights, low, high)
            self._ring_key = ring_key

    def _on_empty_list(self) -> Status:
        for child in self._endpoints:
            child.close()
        self._endpoints, self._by_key = [], {}
        self._ring, self._ring_key = None, None
        self._rebuild_columns()
        note = self._note
        status = Status(
            _UNAVAILABLE, f"empty address list: {note}" if note else "empty address list"
        )
        self.helper.request_reresolution()
        self._report(_TF, status, FailPicker(status), key=(_TF, status))
        return status

    # -- events --------------------------------------------------------------------
    def _rebuild_columns(self) -> None:
        """The columns, the recovery order and the changed set, from every
        endpoint (after an update: O(N))."""
        endpoints = self._endpoints
        for index, child in enumerate(endpoints):
            child.index = index
        self._columns = _Columns(endpoints, self._schedule_connection, self._note)
        self._by_order = sorted(endpoints, key=lambda child: child.order_key)
        if endpoints != self._reported_endpoints:
            self._reported_endpoints = list(endpoints)
            self._reported_children = [None] * len(endpoints)
        reported = self._reported_children
        self._changed = {
            index
            for index, child in enumerate(endpoints)
            if (child.state, child.status, child.picker) != reported[index]
        }

    def _on_child_state(self, child: _Endpoint) -> None:
        if self._shutdown or self._updating:
            return
        index = child.index
        endpoints = self._endpoints
        if index >= len(endpoints) or endpoints[index] is not child:
            return  # not one of ours (closed children never report)
        self._columns.set(index, child, self._schedule_connection, self._note)
        if (child.state, child.status, child.picker) == self._reported_children[index]:
            self._changed.discard(index)
        else:
            self._changed.add(index)
        self._aggregate(child.status if child.state is _TF else None)

    def _schedule_connection(self, child: _Endpoint) -> None:
        """Runs on the pick thread: hop to the clock (and so the serializer)."""
        self.helper.clock.call_later(0, lambda: self._connect_from_pick(child))

    def _connect_from_pick(self, child: _Endpoint) -> None:
        if not self._shutdown:
            child.request_connection()

    def _aggregate(self, failure: Status | None) -> None:
        counts = self._columns.counts
        state = _aggregate_counts(
            counts[_READY], counts[_CONNECTING], counts[_IDLE], counts[_TF], len(self._endpoints)
        )
        idle: _Endpoint | None = None
        if state in (_CONNECTING, _TF) and not counts[_CONNECTING] and counts[_IDLE]:
            # Recovery (module docstring): the first IDLE endpoint in order.
            idle = next(child for child in self._by_order if child.state is _IDLE)
        status = OK_STATUS
        if state is _TF:
            if failure is not None:
                self._last_failure = Status(
                    _UNAVAILABLE, f"no reachable endpoints; last error: {_message(failure)}"
                )
            status = self._last_failure
        assert self._ring is not None
        key = (state, status, self._ring, self._note, self._header)
        if key != self._reported_key or self._changed:
            endpoints, reported = self._endpoints, self._reported_children
            for index in self._changed:
                child = endpoints[index]
                reported[index] = (child.state, child.status, child.picker)
            self._changed.clear()
            picker = RingHashPicker(
                self._ring, self._columns, self.helper.random.getrandbits, self._header
            )
            self._reported_key = key
            self.helper.update_state(state, status, picker)
        if idle is not None:
            idle.request_connection()

    # -- plumbing ------------------------------------------------------------------
    def _report(
        self, state: ConnectivityState, status: Status, picker: Picker, key: tuple[Any, ...]
    ) -> None:
        if key == self._reported_key:
            return
        self._reported_key = key
        self.helper.update_state(state, status, picker)


registry.register(RingHashFactory())
