"""A custom LB policy in Python: ``least_recent``.

Each endpoint gets a subchannel; picks go round the READY ones, but an
endpoint that failed an RPC is skipped for ``cooldown_picks`` picks (a toy
"avoid the backend that just failed"). It shows every part a policy needs:
a frozen config parsed (and validated) by its factory, subchannels made
through the helper, state reported with an immutable picker, and the
``on_call_done`` hook of a pick.

Registered with ``pyxds.lb.registry.register(LeastRecentFactory())`` it can
be chosen by a service config::

    {"loadBalancingConfig": [{"least_recent": {"cooldown_picks": 20}}]}

and from xDS (gRFC A52) by a Cluster's ``load_balancing_policy`` holding a
``xds.type.v3.TypedStruct`` whose ``type_url`` ends in ``/least_recent`` and
whose ``value`` is the same JSON config.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from pyxds.lb.api import (
    ConnectivityState,
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
from pyxds.lb.errors import LBConfigError

READY = ConnectivityState.READY
IDLE = ConnectivityState.IDLE


@dataclass(frozen=True)
class LeastRecentConfig:
    cooldown_picks: int = 10


class LeastRecentFactory(PolicyFactory):
    name = "least_recent"

    def parse_config(self, json_config: Any) -> LeastRecentConfig:
        config = json_config or {}
        if not isinstance(config, dict):
            raise LBConfigError("", "least_recent config must be an object")
        cooldown = config.get("cooldown_picks", 10)
        # From xDS, a TypedStruct's numbers arrive as floats (protobuf Struct): 3.0.
        if isinstance(cooldown, float) and cooldown.is_integer():
            cooldown = int(cooldown)
        if not isinstance(cooldown, int) or isinstance(cooldown, bool) or cooldown < 0:
            raise LBConfigError("cooldown_picks", "must be an integer >= 0")
        return LeastRecentConfig(cooldown)

    def build(self, helper: Helper) -> LoadBalancer:
        return LeastRecent(helper)


class _Picker(Picker):
    """Round robin over READY subchannels, skipping recently failed ones."""

    def __init__(
        self,
        ready: list[Subchannel],
        cooldown: int,
        penalties: dict[str, int],
        lock: threading.Lock,
    ) -> None:
        self._ready = ready
        self._cooldown = cooldown
        self._penalties = penalties  # address -> picks left to skip, shared by pickers
        self._lock = lock  # pickers run on any thread: the policy's lock guards penalties
        self._next = itertools.count()

    def pick(self, args: PickArgs) -> PickResult:
        with self._lock:
            for _ in range(len(self._ready)):
                sub = self._ready[next(self._next) % len(self._ready)]
                left = self._penalties.get(sub.address, 0)
                if left:
                    self._penalties[sub.address] = left - 1
                    continue
                return PickComplete(sub, on_call_done=self._done(sub.address))
            sub = self._ready[next(self._next) % len(self._ready)]  # all cooling: any
        return PickComplete(sub, on_call_done=self._done(sub.address))

    def _done(self, address: str) -> Callable[[Status], None]:
        def on_call_done(status: Status) -> None:
            if status.code is not grpc.StatusCode.OK:
                with self._lock:
                    self._penalties[address] = self._cooldown

        return on_call_done


class LeastRecent(LoadBalancer):
    def __init__(self, helper: Helper) -> None:
        self._helper = helper
        self._subchannels: dict[str, Subchannel] = {}
        self._states: dict[str, ConnectivityState] = {}
        self._unwatch: dict[str, Callable[[], None]] = {}
        self._config = LeastRecentConfig()
        self._penalties: dict[str, int] = {}
        self._lock = threading.Lock()

    def update(self, update: ResolverUpdate) -> Status | None:
        if isinstance(update.endpoints, Status):
            self.resolver_error(update.endpoints)
            return None
        self._config = update.config or LeastRecentConfig()
        wanted = [e.addresses[0] for e in update.endpoints]
        for address in list(self._subchannels):
            if address not in wanted:
                self._unwatch.pop(address)()
                self._subchannels.pop(address).shutdown()
                self._states.pop(address, None)
        for address in wanted:
            if address not in self._subchannels:
                sub = self._helper.create_subchannel(address, {})
                self._subchannels[address] = sub
                self._unwatch[address] = sub.watch_state(self._watcher(address))
                sub.connect()
        self._publish()
        return None

    def _watcher(self, address: str) -> Callable[[ConnectivityState, Status], None]:
        return lambda state, status: self._on_state(address, state)

    def _on_state(self, address: str, state: ConnectivityState) -> None:
        if address not in self._subchannels:
            return
        self._states[address] = state
        if state is IDLE:
            self._subchannels[address].connect()
        elif state is ConnectivityState.TRANSIENT_FAILURE:
            self._helper.request_reresolution()
        self._publish()

    def _publish(self) -> None:
        ready = [self._subchannels[a] for a, s in self._states.items() if s is READY]
        if ready:
            picker = _Picker(ready, self._config.cooldown_picks, self._penalties, self._lock)
            self._helper.update_state(READY, Status(grpc.StatusCode.OK, ""), picker)
        elif (
            self._subchannels
            and all(s is ConnectivityState.TRANSIENT_FAILURE for s in self._states.values())
            and len(self._states) == len(self._subchannels)
        ):
            status = Status(grpc.StatusCode.UNAVAILABLE, "least_recent: no backend reachable")
            self._helper.update_state(
                ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status)
            )
        else:
            self._helper.update_state(
                ConnectivityState.CONNECTING, Status(grpc.StatusCode.OK, ""), QueuePicker()
            )

    def resolver_error(self, status: Status) -> None:
        if not self._subchannels:
            self._helper.update_state(
                ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status)
            )

    def exit_idle(self) -> None:
        for sub in self._subchannels.values():
            sub.connect()

    def reset_backoff(self) -> None:
        for sub in self._subchannels.values():
            sub.reset_backoff()

    def shutdown(self) -> None:
        for unwatch in self._unwatch.values():
            unwatch()
        for sub in self._subchannels.values():
            sub.shutdown()
        self._subchannels.clear()
        self._unwatch.clear()
