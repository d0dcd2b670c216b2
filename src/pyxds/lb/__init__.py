"""pyxds.lb: the LB policy API (ARCHITECTURE.md) and the built-in policies."""

from pyxds.lb import registry
from pyxds.lb.api import (
    EMPTY_ATTRIBUTES,
    OK_STATUS,
    ConnectivityState,
    Endpoint,
    FailPicker,
    Helper,
    LoadBalancer,
    PickArgs,
    PickComplete,
    PickDrop,
    Picker,
    PickFail,
    PickQueue,
    PickResult,
    PolicyFactory,
    QueuePicker,
    ResolverUpdate,
    Status,
    Subchannel,
)
from pyxds.lb.errors import LBConfigError
from pyxds.lb.registry import PolicySelection

__all__ = [
    "EMPTY_ATTRIBUTES",
    "OK_STATUS",
    "ConnectivityState",
    "Endpoint",
    "FailPicker",
    "Helper",
    "LBConfigError",
    "LoadBalancer",
    "PickArgs",
    "PickComplete",
    "PickDrop",
    "PickFail",
    "PickQueue",
    "PickResult",
    "Picker",
    "PolicyFactory",
    "PolicySelection",
    "QueuePicker",
    "ResolverUpdate",
    "Status",
    "Subchannel",
    "registry",
]
