"""A fake Route Lookup Service channel for sans-IO tests of ``rls_experimental``.

``FakeHelper.create_route_lookup_channel`` makes a :class:`FakeRouteLookupChannel`
(kept in ``helper.lookup_channels``); the test reads the lookups it was asked
for (``channel.lookups``) and answers them (``respond``/``fail``), and drives
its connectivity (``set_state``).  Nothing answers by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import field

import grpc

from pyxds._values import dataclass
from pyxds.lb.api import ConnectivityState, Status
from pyxds.lb.rls import LookupReason, LookupResult, RouteLookupChannel

__all__ = ["FakeLookup", "FakeRouteLookupChannel"]


@dataclass
class FakeLookup:
    """One RouteLookup RPC the policy sent."""

    key_map: dict[str, str]
    reason: LookupReason
    stale_header_data: str
    timeout: float
    on_done: Callable[[LookupResult], None] = field(repr=False)
    cancelled: bool = False
    answered: bool = False

    @property
    def open(self) -> bool:
        return not self.cancelled and not self.answered

    def respond(self, targets: list[str] | tuple[str, ...], header_data: str = "") -> None:
        self._answer(LookupResult(targets=tuple(targets), header_data=header_data))

    def fail(self, status: Status | str = "RLS server down") -> None:
        if isinstance(status, str):
            status = Status(grpc.StatusCode.UNAVAILABLE, status)
        self._answer(LookupResult(status))

    def _answer(self, result: LookupResult) -> None:
        if not self.open:
            raise AssertionError(f"lookup {self.key_map} is not open")
        self.answered = True
        self.on_done(result)


class FakeRouteLookupChannel(RouteLookupChannel):
    """Records lookups; the test answers them."""

    def __init__(self, target: str, service_config: str | None = None) -> None:
        self.target = target
        self.service_config = service_config
        self.lookups: list[FakeLookup] = []
        self.closed = False
        self.reset_backoff_calls = 0
        self.state = ConnectivityState.IDLE
        self._watchers: list[Callable[[ConnectivityState], None]] = []

    def lookup(
        self,
        key_map: Mapping[str, str],
        reason: LookupReason,
        stale_header_data: str,
        timeout: float,
        on_done: Callable[[LookupResult], None],
    ) -> Callable[[], None]:
        if self.closed:
            raise AssertionError("lookup on a closed RLS channel")
        lookup = FakeLookup(dict(key_map), reason, stale_header_data, timeout, on_done)
        self.lookups.append(lookup)

        def cancel() -> None:
            lookup.cancelled = True

        return cancel

    @property
    def open_lookups(self) -> list[FakeLookup]:
        return [lookup for lookup in self.lookups if lookup.open]

    def last(self) -> FakeLookup:
        if not self.lookups:
            raise AssertionError("no lookup was sent")
        return self.lookups[-1]

    def watch_state(self, fn: Callable[[ConnectivityState], None]) -> Callable[[], None]:
        self._watchers.append(fn)

        def unwatch() -> None:
            if fn in self._watchers:
                self._watchers.remove(fn)

        return unwatch

    def set_state(self, state: ConnectivityState) -> None:
        self.state = state
        for fn in list(self._watchers):
            fn(state)

    def reset_backoff(self) -> None:
        self.reset_backoff_calls += 1

    def close(self) -> None:
        self.closed = True
