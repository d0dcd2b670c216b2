"""Test-only leaf policy ``test_leaf`` and helpers shared by the priority and
weighted_target tests (no tests here).

``test_leaf`` creates one FakeSubchannel per endpoint address and reports
only what the test tells it to (``leaf.report(state)``), or, when its config
says ``"on_update": STATE``, reports STATE synchronously inside ``update``
(to exercise reports that arrive while a parent is applying an update).
Leaves are found by the ``tag`` of their config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc

from pyxds.lb import (
    OK_STATUS,
    ConnectivityState,
    Endpoint,
    FailPicker,
    LoadBalancer,
    PickArgs,
    PickComplete,
    Picker,
    PickFail,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
    registry,
)
from pyxds.lb.errors import LBConfigError, expect_object
from pyxds.lb.hierarchy import PATH_KEY
from pyxds.testing import FakeHelper, FakeSubchannel

LEAF = "test_leaf"
CS = ConnectivityState
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

LEAVES: list[LeafPolicy] = []
ON_UPDATE_HOOKS: dict[str, Any] = {}
"""tag -> callable run inside that leaf's ``update`` (after its own work)."""


@dataclass(frozen=True)
class LeafConfig:
    tag: str = ""
    on_update: ConnectivityState | None = None
    reject: bool = False
    version: int = 0


class LeafFactory(PolicyFactory):
    name = LEAF

    def parse_config(self, json_config: Any) -> LeafConfig:
        obj = expect_object(json_config, "")
        tag = obj.get("tag", "")
        if not isinstance(tag, str):
            raise LBConfigError("tag", f"expected string, got {json.dumps(tag)}")
        on_update = obj.get("on_update")
        return LeafConfig(
            tag,
            CS[on_update] if on_update else None,
            bool(obj.get("reject", False)),
            int(obj.get("version", 0)),
        )

    def build(self, helper: Any) -> LeafPolicy:
        return LeafPolicy(helper)


class LeafPicker(Picker):
    """READY picker: completes every pick on the leaf's first subchannel."""

    def __init__(self, leaf: LeafPolicy, subchannels: tuple[FakeSubchannel, ...]) -> None:
        self.leaf = leaf
        self.subchannels = subchannels

    def pick(self, args: PickArgs) -> PickResult:
        if not self.subchannels:
            return PickFail(Status(UNAVAILABLE, f"{self.leaf.tag}: no subchannels"))
        return PickComplete(self.subchannels[0])


class LeafPolicy(LoadBalancer):
    def __init__(self, helper: Any) -> None:
        self.helper = helper
        self.config: LeafConfig | None = None
        self.subchannels: dict[str, FakeSubchannel] = {}
        self.updates: list[ResolverUpdate] = []
        self.resolver_errors: list[Status] = []
        self.exit_idle_calls = 0
        self.reset_backoff_calls = 0
        self.shut_down = False
        self.last_picker: Picker | None = None
        LEAVES.append(self)

    @property
    def tag(self) -> str:
        return self.config.tag if self.config else ""

    @property
    def addresses(self) -> list[str]:
        return list(self.subchannels)

    def update(self, update: ResolverUpdate) -> Status | None:
        self.updates.append(update)
        self.config = update.config
        if not isinstance(update.endpoints, Status):
            wanted = [e.addresses[0] for e in update.endpoints]
            for address in wanted:
                if address not in self.subchannels:
                    self.subchannels[address] = self.helper.create_subchannel(address, {})
            for address in list(self.subchannels):
                if address not in wanted:
                    self.subchannels.pop(address).shutdown()
        assert self.config is not None
        hook = ON_UPDATE_HOOKS.get(self.tag)
        if hook is not None:
            hook()
        if self.config.on_update is not None:
            self.report(self.config.on_update)
        if self.config.reject:
            return Status(UNAVAILABLE, f"{self.tag} rejected its update")
        return None

    def report(self, state: ConnectivityState, status: Status | str | None = None) -> Picker:
        if isinstance(status, str):
            status = Status(UNAVAILABLE, status)
        picker: Picker
        if state is CS.READY:
            picker = LeafPicker(self, tuple(self.subchannels.values()))
            status = status or OK_STATUS
        elif state is CS.TRANSIENT_FAILURE:
            status = status or Status(UNAVAILABLE, f"{self.tag} failed")
            picker = FailPicker(status)
        elif state is CS.IDLE:
            picker = QueuePicker(on_pick=self.exit_idle)
            status = status or OK_STATUS
        else:
            picker = QueuePicker()
            status = status or OK_STATUS
        self.last_picker = picker
        self.helper.update_state(state, status, picker)
        return picker

    def resolver_error(self, status: Status) -> None:
        self.resolver_errors.append(status)

    def exit_idle(self) -> None:
        self.exit_idle_calls += 1

    def reset_backoff(self) -> None:
        self.reset_backoff_calls += 1

    def shutdown(self) -> None:
        self.shut_down = True
        for subchannel in self.subchannels.values():
            subchannel.shutdown()


registry.register(LeafFactory())


def reset_leaves() -> None:
    LEAVES.clear()
    ON_UPDATE_HOOKS.clear()


def leaf(tag: str) -> LeafPolicy:
    """The newest live leaf built with ``tag``."""
    for candidate in reversed(LEAVES):
        if candidate.tag == tag and not candidate.shut_down:
            return candidate
    raise AssertionError(f"no live leaf {tag!r}")


def leaves(tag: str) -> list[LeafPolicy]:
    """Every leaf ever built with ``tag`` (live or not)."""
    return [candidate for candidate in LEAVES if candidate.tag == tag]


def has_leaf(tag: str) -> bool:
    return any(c.tag == tag and not c.shut_down for c in LEAVES)


def leaf_config(tag: str, **extra: Any) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"tag": tag}
    body.update(extra)
    return [{LEAF: body}]


def ep(address: str, *path: str) -> Endpoint:
    return Endpoint((address,), {PATH_KEY: tuple(path)})


def pick_subchannel(helper: FakeHelper) -> str | None:
    """Address the last published picker completes on (None if not complete)."""
    result = helper.pick()
    if isinstance(result, PickComplete):
        return result.subchannel.address
    return None
