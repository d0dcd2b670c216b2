"""Fake helper and subchannels for sans-IO LB policy tests (ours and users').

:class:`FakeSubchannel` is driven by the test (``set_state``) and records
``connect()`` calls and shutdown.  :class:`FakeHelper` records every
``update_state`` and ``request_reresolution`` and every subchannel created,
and carries a :class:`FakeClock` and a seeded ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.lb.api import (
    OK_STATUS,
    ConnectivityState,
    Helper,
    PickArgs,
    Picker,
    PickResult,
    Status,
    Subchannel,
)
from pyxds.testing.fake_clock import FakeClock

CONNECTING = ConnectivityState.CONNECTING
READY = ConnectivityState.READY

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class FakeSubchannel(Subchannel):
    """A subchannel whose connectivity the test drives.  With
    ``health_checked`` it also has a health signal (``watch_health``, A61),
    which the test drives with :meth:`set_health`; without, ``watch_health``
    returns None, as a channel's subchannel that is not health checked."""

    health_checked = False
    #: the health the watch reports (CONNECTING until connected, A17)
    health: tuple[ConnectivityState, Status] = (ConnectivityState.CONNECTING, OK_STATUS)
    _health_watchers: list[Callable[[ConnectivityState, Status], None]] = []

    def __init__(
        self,
        address: str,
        attributes: Mapping[str, Any] | None = None,
        health_checked: bool = False,
    ) -> None:
        if health_checked:  # (class defaults otherwise: no objects per fake)
            self.health_checked = True
            self._health_watchers = []
        self.address = address
        self.attributes = dict(attributes or {})
        self.state = ConnectivityState.IDLE
        self.status = OK_STATUS
        self.connect_calls = 0
        self.reset_backoff_calls = 0
        self.shut_down = False
        self._watchers: list[Callable[[ConnectivityState, Status], None]] = []

    def connect(self) -> None:
        self.connect_calls += 1

    def watch_state(self, fn: Callable[[ConnectivityState, Status], None]) -> Callable[[], None]:
        self._watchers.append(fn)
        fn(self.state, self.status)

        def unwatch() -> None:
            if fn in self._watchers:
                self._watchers.remove(fn)

        return unwatch

    def watch_health(
        self, fn: Callable[[ConnectivityState, Status], None]
    ) -> Callable[[], None] | None:
        if not self.health_checked:
            return None
        self._health_watchers.append(fn)
        fn(*self.health)

        def unwatch() -> None:
            if fn in self._health_watchers:
                self._health_watchers.remove(fn)

        return unwatch

    def set_health(self, state: ConnectivityState, status: Status | str | None = None) -> None:
        """Report a new health to every health watcher (a string status:
        UNAVAILABLE with that text)."""
        if isinstance(status, str):
            status = Status(UNAVAILABLE, status)
        if (state, status or OK_STATUS) == self.health:
            return  # not a change
        self.health = (state, status or OK_STATUS)
        for fn in list(self._health_watchers):
            fn(*self.health)

    @property
    def health_watched(self) -> bool:
        return bool(self._health_watchers)

    def shutdown(self) -> None:
        self.shut_down = True
        self._watchers.clear()
        if self.health_checked:
            self._health_watchers.clear()

    def reset_backoff(self) -> None:
        self.reset_backoff_calls += 1

    def set_state(self, state: ConnectivityState, status: Status | str | None = None) -> None:
        """Report a new state to every watcher (as the channel would, on the serializer).
        A string status means UNAVAILABLE with that text."""
        if isinstance(status, str):
            status = Status(UNAVAILABLE, status)
        if status is None:
            status = (
                Status(UNAVAILABLE, f"{self.address}: connection failed")
                if state is ConnectivityState.TRANSIENT_FAILURE
                else OK_STATUS
            )
        self.state = state
        self.status = status
        for fn in list(self._watchers):
            fn(state, status)
        # the health follows: the connectivity, CONNECTING once READY (A17)
        if not self.health_checked:
            return
        if state is READY:
            self.set_health(CONNECTING, OK_STATUS)
        else:
            self.set_health(state, status)

    @property
    def watched(self) -> bool:
        return bool(self._watchers)

    def __repr__(self) -> str:
        return f"FakeSubchannel({self.address!r}, {self.state.name})"


@dataclass(frozen=True)
class StateReport:
    state: ConnectivityState
    status: Status
    picker: Picker

    def pick(self, path: str = "/svc/Method", **call_attributes: Any) -> PickResult:
        return self.picker.pick(PickArgs(path, (), call_attributes))


class FakeHelper(Helper):
    """Records what a policy tells its parent."""

    def __init__(
        self, clock: FakeClock | None = None, seed: int = 0, health_checked: bool = False
    ) -> None:
        #: whether the subchannels made have a health signal (FakeSubchannel)
        self.health_checked = health_checked
        self.clock = clock or FakeClock()
        self.random = random.Random(seed)
        self.subchannels: list[FakeSubchannel] = []
        self.states: list[StateReport] = []
        self.reresolution_requests = 0
        #: RLS channels made for rls_experimental (FakeRouteLookupChannel)
        self.lookup_channels: list[Any] = []

    def create_subchannel(self, address: str, attributes: Mapping[str, Any]) -> FakeSubchannel:
        subchannel = FakeSubchannel(address, attributes, self.health_checked)
        self.subchannels.append(subchannel)
        return subchannel

    def update_state(self, state: ConnectivityState, status: Status, picker: Picker) -> None:
        self.states.append(StateReport(state, status, picker))

    def create_route_lookup_channel(self, target: str, service_config: str | None) -> Any:
        """A :class:`pyxds.testing.fake_rls.FakeRouteLookupChannel` (rls_experimental)."""
        from pyxds.testing.fake_rls import FakeRouteLookupChannel

        channel = FakeRouteLookupChannel(target, service_config)
        self.lookup_channels.append(channel)
        return channel

    def request_reresolution(self) -> None:
        self.reresolution_requests += 1

    # -- conveniences for assertions -----------------------------------
    @property
    def last(self) -> StateReport:
        if not self.states:
            raise AssertionError("the policy has not reported a state")
        return self.states[-1]

    @property
    def state(self) -> ConnectivityState:
        return self.last.state

    def pick(self, path: str = "/svc/Method", **call_attributes: Any) -> PickResult:
        return self.last.pick(path, **call_attributes)

    def subchannel(self, address: str, live: bool = True) -> FakeSubchannel:
        """The newest subchannel for ``address`` (not shut down when ``live``)."""
        for subchannel in reversed(self.subchannels):
            if subchannel.address == address and (not live or not subchannel.shut_down):
                return subchannel
        raise AssertionError(f"no subchannel for {address}")

    def live_subchannels(self) -> list[FakeSubchannel]:
        return [s for s in self.subchannels if not s.shut_down]

    def state_sequence(self) -> list[ConnectivityState]:
        return [report.state for report in self.states]
