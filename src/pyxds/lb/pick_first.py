"""The ``pick_first`` LB policy: gRFC A62 (sticky TRANSIENT_FAILURE, address
shuffling), A61 (happy eyeballs, address interleaving) and A113 (weighted
shuffling, behind GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING as in grpcio 1.85),
with connection management as gRPC C-core does it.

Config: ``{"shuffleAddressList": bool}`` (default false; unknown fields are
ignored).

Theory of operation
===================

The policy is an explicit state machine.  Its *phase* says what it is doing;
every transition is made by one of the ``_on_*`` event handlers in the
"Transitions" section of :class:`PickFirst` (and the helpers right below
them); nothing else assigns ``self._phase``.  The public methods only
filter events that do not apply to the current phase.  What the parent
sees (the reported state) follows from the phase, with one rule on top:
**sticky TRANSIENT_FAILURE** -- once TRANSIENT_FAILURE was reported,
nothing but TRANSIENT_FAILURE is reported until a subchannel becomes READY
(A62 "Use sticky-TF by default"; C-core also keeps it across an empty list
or a resolver error).

Phases::

    NO_ADDRESSES  no usable address list yet (before the first update, or the
                  last update was empty).  Reported: nothing yet, or
                  TRANSIENT_FAILURE "empty address list".
    FIRST_PASS    the happy-eyeballs pass over the ordered address list
                  (A61).  Reported: CONNECTING (queue picker), unless sticky.
    RECONNECTING  the pass ended with every address failed once; every
                  subchannel is asked to connect as soon as it reports IDLE
                  (its own backoff ended), all in parallel.  Reported:
                  TRANSIENT_FAILURE "failed to connect to all addresses; last
                  error: ...", re-reported (with a fresh error and a new
                  re-resolution request) after every N further failures, N =
                  number of subchannels.
    READY         one subchannel is selected; every other one is shut down.
                  Reported: READY with a constant PickComplete picker.
    IDLE          the selected connection dropped (or an update removed its
                  address).  Reported: IDLE with a picker that queues and
                  schedules ``exit_idle`` (never inline on the pick thread).
    SHUTDOWN      terminal.

Transition table (event -> what happens)::

    phase          | event                      | next phase / action
    ---------------+----------------------------+-------------------------------------
    any            | update(empty)              | NO_ADDRESSES, report TF "empty address
                   |                            | list", re-resolve, return the status
    NO_ADDRESSES   | update(list)               | FIRST_PASS
    FIRST_PASS     | update(new list)           | FIRST_PASS restarted on the new order
    RECONNECTING   | update(new list)           | FIRST_PASS (still sticky TF)
    READY          | update(list with selected) | READY, connection kept, nothing reported
    READY          | update(list w/o selected)  | READY on a listed subchannel that is
                   |                            | already READY (pool), else IDLE (drop
                   |                            | connection, re-resolve)
    IDLE           | update(list)               | IDLE (list stored, nothing connects)
    any            | update(same ordered list)  | no-op
    IDLE           | exit_idle / first pick     | FIRST_PASS
    FIRST_PASS     | a subchannel READY         | READY (others shut down)
    RECONNECTING   | a subchannel READY         | READY (others shut down)
    READY          | selected leaves READY      | IDLE, re-resolve
    FIRST_PASS     | frontier fails             | try next address at once (timer cancelled)
    FIRST_PASS     | timer (250 ms) fires       | try next address too
    FIRST_PASS     | every address failed once  | RECONNECTING, report TF, re-resolve,
                   |                            | connect every IDLE subchannel
    RECONNECTING   | subchannel IDLE            | connect() it at once
    RECONNECTING   | N-th failure               | report TF again, re-resolve
    any            | shutdown                   | SHUTDOWN, subchannels shut down

The happy-eyeballs pass (A61 "Happy Eyeballs in the pick_first LB Policy"):
the *frontier* is the address being tried.  Trying an address means: if its
subchannel is IDLE call ``connect()``; if CONNECTING treat it as already
trying; if it is in TRANSIENT_FAILURE (backoff) count that as this pass's
failed attempt and move on at once.  A failure reported by an address the
pass has not reached yet does not count: the pass judges it by its state
when it gets there, so one whose backoff ended meanwhile is tried (C-core
grpc#38714, grpc#40162).  Unless it is the last address, a
CONNECTION_ATTEMPT_DELAY timer starts; when it fires, the next address is
tried while the earlier attempt continues.  A failure of the frontier
cancels the timer and moves on at once.  The pass is complete when the
frontier ran off the end *and* every subchannel has failed at least once in
this pass.  Any subchannel that reports READY at any time wins.  An
attempted subchannel that falls back to IDLE without failing (the attempt
ended) is asked to connect again, so the policy never stops trying
(TRAPS.md, grpc#38714).

Address order (A61 "Address List Handling in pick_first"): shuffle the
endpoints when configured (once per update; reconnection reuses that
order), flatten, drop duplicate addresses (first occurrence wins), then
interleave address families as RFC 8305 section 4: families in order of
first appearance, one address of each in turn.

Subchannel reuse: subchannels of addresses present in both the old and the
new list are kept (their state is known), as C-core gets from its
subchannel pool.  Subchannels never report SHUTDOWN to their owner; such a
report is ignored.

Under a petiole policy (round_robin, A61) the TRANSIENT_FAILURE status is
the last subchannel error alone (``omit_status_prefix``); the parent adds
its own words, as C-core's internal channel arg does.

Health (A61 "Generic Health Reporting Mechanism", A17): under a petiole
policy (``health_watch``) pick_first starts the health watch
(``Subchannel.watch_health``) on the subchannel it selected, and while
READY reports what that watch says instead of READY: CONNECTING (a queue
picker) until the backend's first health answer, READY (the constant
picker) while it is SERVING, TRANSIENT_FAILURE with the watch's status
otherwise; an IDLE from the watch is left to the connectivity watch,
which still manages the connection (a drop goes IDLE as above).  The watch
stops when the selection ends (IDLE, a new pass, an update without the
address, shutdown).  A subchannel without a health signal
(``watch_health`` returns None: the channel does not health check) is
reported READY as before.  A top-level pick_first never starts it (A17
"pick_first": health checking is for the petiole policies).

Deviations from C-core, documented:

* an update with exactly the same ordered address list as the current one
  is a no-op (C-core restarts the pass and re-reports), so that "the same
  config twice is a no-op" (TRAPS.md);
* a resolver error while in TRANSIENT_FAILURE replaces the failing picker's
  status with the resolver's (grpc-go); C-core keeps using the last list
  and its connection-failure text.
"""

from __future__ import annotations

import enum
import itertools
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeGuard

import grpc

from pyxds import metrics as _metrics
from pyxds._values import dataclass
from pyxds.clock import Timer
from pyxds.lb import registry
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    Endpoint,
    FailPicker,
    Helper,
    LoadBalancer,
    PickArgs,
    PickComplete,
    Picker,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
    Subchannel,
)
from pyxds.lb.errors import LBConfigError, describe, expect_bool
from pyxds.lb.subchannel_list import SubchannelEntry, unique_addresses

__all__ = [
    "CONNECTION_ATTEMPT_DELAY",
    "POLICY_NAME",
    "PickFirst",
    "PickFirstConfig",
    "PickFirstFactory",
    "Phase",
    "address_family",
    "constant_result",
    "interleave_families",
    "order_addresses",
    "shuffle_endpoints",
]

POLICY_NAME = "pick_first"
CONNECTION_ATTEMPT_DELAY = 0.25  # A61: RFC 8305 section 5 default, 250 ms
WEIGHT_KEY = "weight"

_IDLE = ConnectivityState.IDLE
_CONNECTING = ConnectivityState.CONNECTING
_READY = ConnectivityState.READY
_TF = ConnectivityState.TRANSIENT_FAILURE
_SHUTDOWN = ConnectivityState.SHUTDOWN
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
#: one shared, immutable Status (not one per endpoint)
_NO_ATTEMPT_YET = Status(_UNAVAILABLE, "no connection attempt yet")


# -- config ------------------------------------------------------------------


@dataclass(frozen=True)
class PickFirstConfig:
    """Parsed ``pick_first`` config (A62 "Enable random shuffling")."""

    shuffle_address_list: bool = False


class PickFirstFactory(PolicyFactory):
    name = POLICY_NAME

    def parse_config(self, json_config: Any) -> PickFirstConfig:
        if json_config is None:
            return PickFirstConfig()
        if not isinstance(json_config, dict):
            raise LBConfigError("", f"expected object, got {describe(json_config)}")
        return PickFirstConfig(expect_bool(json_config, "shuffleAddressList", "", default=False))

    def build(self, helper: Helper) -> PickFirst:
        return PickFirst(helper)


# -- address ordering (A61, A62, A113) -----------------------------------------


def address_family(address: str) -> str:
    """``"ipv6"`` for ``[v6]:port`` (or a bare v6 literal), ``"unix"`` and
    ``"unix-abstract"`` for those targets (two families, as C-core's URI
    schemes), else ``"ipv4"`` (names count as v4)."""
    if address.startswith("["):
        return "ipv6"
    if address.startswith("unix-abstract:"):
        return "unix-abstract"
    if address.startswith("unix:"):
        return "unix"
    if address.count(":") > 1:
        return "ipv6"
    return "ipv4"


def interleave_families(addresses: Sequence[str]) -> list[str]:
    """RFC 8305 section 4 interleaving over the whole flattened list: families
    in order of first appearance, taking one address of each in turn."""
    if len(addresses) < 2:
        return list(addresses)  # nothing to interleave (every round_robin child)
    by_family: dict[str, list[str]] = {}
    for address in addresses:
        by_family.setdefault(address_family(address), []).append(address)
    if len(by_family) < 2:
        return list(addresses)
    queues = list(by_family.values())
    out: list[str] = []
    position = 0
    while len(out) < len(addresses):
        for queue in queues:
            if position < len(queue):
                out.append(queue[position])
        position += 1
    return out


WEIGHTED_SHUFFLING_ENV = "GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING"


def weighted_shuffling_enabled() -> bool:
    """gRFC A113's switch, read as grpcio 1.85's C-core reads it
    (``IsExperimentEnvVarEnabled``, default off): on only when set to one of
    ``1 t true y yes`` (any case).  On, pick_first's shuffle is weighted by
    the endpoints' ``weight`` and the cds policy normalizes the weights it
    gives (A113 "Temporary environment variable protection"; grpc-go and
    grpc-java default it on).  Read when used."""
    from pyxds.security.experiments import env_enabled

    return env_enabled(WEIGHTED_SHUFFLING_ENV)


def _endpoint_weight(endpoint: Endpoint) -> float:
    weight = endpoint.attributes.get(WEIGHT_KEY, 1)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        return 1.0
    return float(weight)


def shuffle_endpoints(
    endpoints: Sequence[Endpoint], rng: random.Random, weighted: bool = True
) -> list[Endpoint]:
    """Shuffle endpoints (never the addresses inside one).

    Without weights (or ``weighted`` False): a uniform shuffle.  When any
    endpoint carries ``attributes["weight"]``: A113's weighted random
    sampling (Efraimidis and Spirakis) -- key ``u ** (1 / weight)`` with
    ``u`` uniform, sort by key descending; missing weight means 1.  The key
    is computed as ``log(u) / weight``, the same order without underflow.
    """
    shuffled = list(endpoints)
    if not weighted or not any(WEIGHT_KEY in endpoint.attributes for endpoint in shuffled):
        rng.shuffle(shuffled)
        return shuffled
    keyed = []
    for endpoint in shuffled:
        u = rng.random()
        key = math.log(u) / _endpoint_weight(endpoint) if u > 0.0 else -math.inf
        keyed.append((key, endpoint))
    keyed.sort(key=lambda pair: pair[0], reverse=True)
    return [endpoint for _, endpoint in keyed]


class _OneAddress(Mapping[str, Mapping[str, Any]]):
    """``{address: attributes}`` for one endpoint of one address: a slotted
    read-only mapping, not a dict (~50 bytes instead of ~180: every
    round_robin child of an EDS cluster keeps one, issue 18)."""

    __slots__ = ("_address", "_attributes")

    def __init__(self, address: str, attributes: Mapping[str, Any]) -> None:
        self._address = address
        self._attributes = attributes

    def __getitem__(self, address: str) -> Mapping[str, Any]:
        if address == self._address:
            return self._attributes
        raise KeyError(address)

    def __iter__(self) -> Iterator[str]:
        yield self._address

    def __len__(self) -> int:
        return 1


def order_addresses(
    endpoints: Sequence[Endpoint], shuffle: bool, rng: random.Random | None
) -> tuple[tuple[str, ...], Mapping[str, Mapping[str, Any]]]:
    """A61's steps: shuffle endpoints (optional), flatten, dedupe, interleave.
    Returns the ordered addresses and each address's endpoint attributes.
    ``rng`` is needed only to shuffle (pick_first reads its helper's only
    then: that read goes through every level of the LB tree above it)."""
    if not shuffle and len(endpoints) == 1:
        # One endpoint of one address (every round_robin child of an EDS
        # cluster, A61): what the general steps give, without their lists.
        endpoint = endpoints[0]
        addresses = endpoint.addresses
        if len(addresses) == 1:
            return addresses, _OneAddress(addresses[0], endpoint.attributes)
    if shuffle:
        if rng is None:
            raise ValueError("order_addresses: shuffling needs a random generator")
        endpoints = shuffle_endpoints(endpoints, rng, weighted_shuffling_enabled())
    pairs = unique_addresses(endpoints)
    attributes = dict(pairs)
    return tuple(interleave_families([address for address, _ in pairs])), attributes


# -- pickers -------------------------------------------------------------------


class _ReadyPicker(Picker):
    """Every pick goes to the selected subchannel: one constant result."""

    __slots__ = ("_result",)

    def __init__(self, subchannel: Subchannel) -> None:
        self._result = PickComplete(subchannel)

    @property
    def subchannel(self) -> Subchannel:
        return self._result.subchannel

    @property
    def result(self) -> PickComplete:
        """The one result every pick returns (round_robin rotates these)."""
        return self._result

    def result_stream(self) -> Iterator[PickResult]:
        return itertools.repeat(self._result)

    def pick(self, args: PickArgs) -> PickResult:
        return self._result

    def __repr__(self) -> str:
        return f"PickFirstPicker({self._result.subchannel.address})"


# -- the policy ----------------------------------------------------------------


def constant_result(picker: Picker) -> PickComplete | None:
    """The one result of a READY pick_first's picker (every pick returns
    it), else None."""
    return picker._result if type(picker) is _ReadyPicker else None


def all_ready_pickers(pickers: list[Picker]) -> TypeGuard[list[_ReadyPicker]]:
    """Whether every picker is a READY pick_first's constant picker
    (round_robin and weighted_round_robin then rotate their results)."""
    return all(type(p) is _ReadyPicker for p in pickers)


class Phase(enum.Enum):
    """What pick_first is doing (see the module docstring)."""

    NO_ADDRESSES = "NO_ADDRESSES"
    FIRST_PASS = "FIRST_PASS"
    RECONNECTING = "RECONNECTING"
    READY = "READY"
    IDLE = "IDLE"
    SHUTDOWN = "SHUTDOWN"


class _Entry(SubchannelEntry):
    """A subchannel plus its bookkeeping for the current pass."""

    __slots__ = ("attempted", "failed_in_pass")

    def __init__(self, *args: Any) -> None:
        self.attempted = False
        self.failed_in_pass = False
        super().__init__(*args)


class _HealthWatch:
    """The health watch of one selection: the watcher handed to
    ``watch_health`` (reports of an ended selection are dropped)."""

    __slots__ = ("policy", "entry", "unwatch", "live")

    def __init__(self, policy: PickFirst, entry: _Entry) -> None:
        self.policy = policy
        self.entry = entry
        self.unwatch: Callable[[], None] | None = None
        self.live = True

    def __call__(self, state: ConnectivityState, status: Status) -> None:
        self.policy._on_health(self, state, status)


class PickFirst(LoadBalancer):
    """The pick_first state machine (module docstring has the rules)."""

    def __init__(
        self, helper: Helper, *, omit_status_prefix: bool = False, health_watch: bool = False
    ) -> None:
        """``omit_status_prefix`` is for petiole parents (round_robin, A61
        "Use pick_first as the Universal Leaf Policy"): the TRANSIENT_FAILURE
        status is then the last subchannel error alone, which the parent
        words itself, as C-core's internal channel arg does.
        ``health_watch`` too (module docstring, "Health"): the selected
        subchannel's health is what is reported."""
        self._helper = helper
        self._omit_status_prefix = omit_status_prefix
        if health_watch:
            self._health_watch = True
        self._phase = Phase.NO_ADDRESSES
        self._order: tuple[str, ...] = ()
        self._attributes: Mapping[str, Mapping[str, Any]] = {}
        self._entries: dict[str, _Entry] = {}
        self._selected: _Entry | None = None
        self._frontier = 0  # index into _order of the address being tried
        self._timer: Timer | None = None
        self._timer_generation = 0
        self._failures = 0  # failures seen in RECONNECTING since the last TF report
        self._last_failure: Status = _NO_ATTEMPT_YET
        self._reported: ConnectivityState | None = None

    # -- introspection (tests, config dumps) ---------------------------------
    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def addresses(self) -> tuple[str, ...]:
        """The current address list in connection order."""
        return self._order

    @property
    def selected(self) -> Subchannel | None:
        return self._selected.subchannel if self._selected is not None else None

    @property
    def subchannels(self) -> list[Subchannel]:
        """Every subchannel the policy holds, in connection order."""
        return [self._entries[a].subchannel for a in self._order if a in self._entries]

    @property
    def timer_pending(self) -> bool:
        return self._timer is not None and not self._timer.cancelled

    # -- LoadBalancer API: each call is one event ------------------------------
    def update(self, update: ResolverUpdate) -> Status | None:
        if self._phase is Phase.SHUTDOWN:
            return None
        if isinstance(update.endpoints, Status):
            self.resolver_error(update.endpoints)
            return update.endpoints
        config = update.config if isinstance(update.config, PickFirstConfig) else PickFirstConfig()
        order, attributes = order_addresses(
            update.endpoints,
            config.shuffle_address_list,
            self._helper.random if config.shuffle_address_list else None,
        )
        if not order:
            return self._on_empty_list(update.resolution_note)
        self._attributes = attributes
        if order == self._order and self._phase is not Phase.NO_ADDRESSES:
            return None  # the same list again: nothing to do
        self._order = order
        self._on_new_list()
        return None

    def resolver_error(self, status: Status) -> None:
        """An error replaces nothing that works: reported only when there is
        no address list (as C-core), or while in TRANSIENT_FAILURE (as
        grpc-go; see the module docstring's deviations)."""
        if self._phase is Phase.SHUTDOWN:
            return
        if self._phase is Phase.NO_ADDRESSES or self._reported is _TF:
            self._report(_TF, status, FailPicker(status))

    def exit_idle(self) -> None:
        if self._phase is Phase.IDLE:
            self._on_exit_idle()

    def reset_backoff(self) -> None:
        for entry in self._entries.values():
            entry.subchannel.reset_backoff()

    def shutdown(self) -> None:
        if self._phase is not Phase.SHUTDOWN:
            self._on_shutdown()

    # -- Transitions: the only code that changes self._phase --------------------
    def _on_shutdown(self) -> None:
        self._phase = Phase.SHUTDOWN
        self._cancel_timer()
        self._deselect()
        self._drop_entries(keep=())

    def _on_empty_list(self, note: str) -> Status:
        status = Status(
            _UNAVAILABLE, f"empty address list: {note}" if note else "empty address list"
        )
        self._cancel_timer()
        self._deselect()
        self._drop_entries(keep=())
        self._order = ()
        self._phase = Phase.NO_ADDRESSES
        self._helper.request_reresolution()
        self._report(_TF, status, FailPicker(status))
        return status

    def _on_new_list(self) -> None:
        if self._phase is Phase.READY:
            assert self._selected is not None
            if self._selected.address in self._order:
                self._drop_entries(keep=(self._selected.address,))
                return  # the connection is kept; the picker is unchanged
            # C-core: a subchannel of the new list that is already READY
            # (shared through the subchannel pool) is taken at once;
            # otherwise the connection is dropped and the policy goes IDLE.
            self._drop_entries(keep=self._order)
            self._ensure_entries()
            for address in self._order:
                entry = self._entries[address]
                if entry.state is _READY:
                    self._select(entry)
                    return
            self._drop_entries(keep=())
            self._go_idle()
            return
        self._drop_entries(keep=self._order)
        if self._phase is Phase.IDLE:
            return  # the list is stored; connecting waits for exit_idle or a pick
        self._start_pass()

    def _on_exit_idle(self) -> None:
        self._start_pass()

    def _on_timer(self, generation: int) -> None:
        if generation != self._timer_generation or self._phase is not Phase.FIRST_PASS:
            return  # stale: cancelled, or a newer pass started
        self._timer = None
        self._frontier += 1
        self._try_from_frontier()

    def _on_subchannel_state(
        self, entry: SubchannelEntry, prev: ConnectivityState, status: Status
    ) -> None:
        assert isinstance(entry, _Entry)
        state = entry.state
        if state is _TF:
            self._last_failure = status
        phase = self._phase
        if state is _SHUTDOWN or phase in (Phase.SHUTDOWN, Phase.NO_ADDRESSES, Phase.IDLE):
            return
        if phase is Phase.READY:
            if entry is self._selected and state is not _READY:
                if _metrics.RECORDER is not None:
                    self._count("grpc.lb.pick_first.disconnections")
                self._go_idle()
            return
        if state is _READY:
            if _metrics.RECORDER is not None:
                self._count("grpc.lb.pick_first.connection_attempts_succeeded")
            self._select(entry)
            return
        if state is _TF and prev is _CONNECTING and _metrics.RECORDER is not None:
            self._count("grpc.lb.pick_first.connection_attempts_failed")
        if phase is Phase.FIRST_PASS:
            if state is _TF:
                if not entry.attempted:
                    return  # ahead of the pass: judged when the pass reaches it
                first_failure = not entry.failed_in_pass
                entry.failed_in_pass = True
                if self._is_frontier(entry):
                    self._cancel_timer()
                    self._frontier += 1
                    self._try_from_frontier()
                elif first_failure:
                    self._maybe_finish_pass()
            elif state is _IDLE and entry.attempted and not entry.failed_in_pass:
                entry.subchannel.connect()  # the attempt ended without a failure: retry
            return
        # RECONNECTING
        if state is _IDLE:
            entry.subchannel.connect()
        elif state is _TF:
            self._failures += 1
            if self._failures >= len(self._entries):
                self._failures = 0
                self._helper.request_reresolution()
                self._report_all_failed()

    # -- transition helpers (called only from the handlers above) --------------
    # Each reports to the parent as its last step: a parent may call back
    # (exit_idle, update) from inside update_state.
    def _start_pass(self) -> None:
        """Begin a happy-eyeballs pass over ``self._order`` (phase FIRST_PASS)."""
        self._cancel_timer()
        self._deselect()
        self._ensure_entries()
        for address in self._order:
            entry = self._entries[address]
            entry.attempted = False
            # A failure counts for this pass only once the pass has reached
            # the address (C-core grpc#38714, grpc#40162): one that is in
            # backoff now may be IDLE again by then, and is then tried.
            entry.failed_in_pass = False
            if entry.state is _TF:
                self._last_failure = entry.status
        for address in self._order:
            entry = self._entries[address]
            if entry.state is _READY:
                self._select(entry)
                return
        self._phase = Phase.FIRST_PASS
        self._frontier = 0
        self._failures = 0
        self._try_from_frontier()
        # Report last, so a parent reacting synchronously sees a settled policy.
        if self._phase is Phase.FIRST_PASS and self._reported not in (_TF, _CONNECTING):
            self._report(_CONNECTING, OK_STATUS, QueuePicker())

    def _try_from_frontier(self) -> None:
        """Try the frontier address, skipping those that failed in this pass."""
        order = self._order
        while self._frontier < len(order):
            entry = self._entries[order[self._frontier]]
            entry.attempted = True
            if entry.state is _TF:
                # In backoff: A61 treats it as an attempt that already failed.
                entry.failed_in_pass = True
                self._frontier += 1
                continue
            if entry.state is _IDLE:
                entry.subchannel.connect()
            if self._frontier < len(order) - 1:
                self._start_timer()
            return
        self._maybe_finish_pass()

    def _maybe_finish_pass(self) -> None:
        if self._frontier < len(self._order):
            return
        if not all(self._entries[a].failed_in_pass for a in self._order):
            return
        self._phase = Phase.RECONNECTING
        self._failures = 0
        for address in self._order:
            entry = self._entries[address]
            if entry.state is _IDLE:
                entry.subchannel.connect()
        self._helper.request_reresolution()
        self._report_all_failed()

    def _select(self, entry: _Entry) -> None:
        self._cancel_timer()
        self._deselect()
        self._selected = entry
        self._phase = Phase.READY
        self._drop_entries(keep=(entry.address,))
        if self._health_watch:
            watch = _HealthWatch(self, entry)
            # None: no health signal, connectivity alone (most channels);
            # else the watch has reported the health already (on the
            # serializer), and the parent may have ended the selection since
            unwatch = entry.subchannel.watch_health(watch)
            if unwatch is not None:
                if self._selected is entry and self._health is None:
                    watch.unwatch = unwatch
                    self._health = watch
                else:
                    watch.live = False
                    unwatch()
                return
        self._report(_READY, OK_STATUS, _ReadyPicker(entry.subchannel))

    def _on_health(self, watch: _HealthWatch, state: ConnectivityState, status: Status) -> None:
        """The selected subchannel's health (C-core's pick_first
        HealthWatcher): reported as is, but IDLE, which the connectivity
        watch handles."""
        if (
            not watch.live
            or self._selected is not watch.entry
            or self._health not in (watch, None)  # None: its first report
        ):
            return
        if state is _READY:
            self._report(_READY, OK_STATUS, _ReadyPicker(watch.entry.subchannel))
        elif state is _CONNECTING:
            if self._reported is not _CONNECTING:  # (still the first pass's)
                self._report(_CONNECTING, OK_STATUS, QueuePicker())
        elif state is _TF:
            self._report(_TF, status, FailPicker(status))

    def _deselect(self) -> None:
        """End the selection and its health watch."""
        self._selected = None
        watch = self._health
        if watch is not None:
            self._health = None
            watch.live = False
            if watch.unwatch is not None:
                watch.unwatch()

    def _go_idle(self) -> None:
        """A62/C-core GoIdle: drop the selection, re-resolve, report IDLE with
        a picker that schedules exit_idle."""
        self._cancel_timer()
        self._deselect()
        self._phase = Phase.IDLE
        self._helper.request_reresolution()
        self._report(_IDLE, OK_STATUS, QueuePicker(on_pick=self._schedule_exit_idle))

    #: class defaults, set on an instance only when used (no attribute per
    #: endpoint otherwise, issue 18): whether the selection's health is
    #: watched (``health_watch``), and that watch while one runs
    _health_watch = False
    _health: _HealthWatch | None = None

    #: the last TRANSIENT_FAILURE picker of _report_all_failed, reused while
    #: its text is the same, and the failure it was made for (set on first
    #: use: no cost per endpoint until then)
    _all_failed: FailPicker | None = None
    _all_failed_of: Status | None = None

    def _report_all_failed(self) -> None:
        # The same failure again (RECONNECTING re-reports after every N
        # failures, as C-core) gets the same immutable status and picker: a
        # new pair per failed attempt lived through the backoff, into the
        # oldest GC generation (issue 18: 9000 refusing endpoints).  The very
        # same failure (a subchannel reuses its status while the text is the
        # same) is not even put in words again (five Python calls an attempt).
        failure = self._last_failure
        picker = self._all_failed
        if picker is None or failure is not self._all_failed_of:
            details = str(failure)
            if not self._omit_status_prefix:
                details = f"failed to connect to all addresses; last error: {details}"
            if picker is None or picker.status.details != details:
                picker = self._all_failed = FailPicker(Status(_UNAVAILABLE, details))
            self._all_failed_of = failure
        self._report(_TF, picker.status, picker)

    # -- plumbing ---------------------------------------------------------------
    def _count(self, name: str) -> None:
        """A78 pick_first counter (callers check ``_metrics.RECORDER`` first)."""
        _metrics.add(name, 1, {"grpc.target": getattr(self._helper, "channel_target", "")})

    def _schedule_exit_idle(self) -> None:
        """Runs on the pick thread: hop to the clock (and so the serializer)."""
        self._helper.clock.call_later(0, self.exit_idle)

    def _start_timer(self) -> None:
        self._timer_generation += 1
        generation = self._timer_generation
        self._timer = self._helper.clock.call_later(
            CONNECTION_ATTEMPT_DELAY, lambda: self._on_timer(generation)
        )

    def _cancel_timer(self) -> None:
        self._timer_generation += 1  # a callback already on its way is stale
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _is_frontier(self, entry: _Entry) -> bool:
        return self._frontier < len(self._order) and self._order[self._frontier] == entry.address

    def _ensure_entries(self) -> None:
        created = []
        for address in self._order:
            if address not in self._entries:
                entry = _Entry(
                    self._helper,
                    address,
                    self._attributes.get(address, {}),
                    self._on_subchannel_state,
                )
                self._entries[address] = entry
                created.append(entry)
        for entry in created:
            entry.activate()

    def _drop_entries(self, keep: Sequence[str]) -> None:
        keep_set = set(keep)
        for address in [a for a in self._entries if a not in keep_set]:
            self._entries.pop(address).shutdown()

    def _report(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self._reported = state
        self._helper.update_state(state, status, picker)


registry.register(PickFirstFactory())
