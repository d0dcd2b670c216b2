"""pyxds.xds: the xDS client (A27, A57, A88): bootstrap, ADS transport,
validated resources, watches and cache.

The names below load on first use (PEP 562): importing a submodule such as
``pyxds.xds.backoff`` does not load the xDS protos, the resource validators
or the client; a channel whose target is not ``xds:`` never loads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyxds.xds.ads_state import RESOURCE_TIMEOUT, CacheState
    from pyxds.xds.bootstrap import Bootstrap, BootstrapError, load_bootstrap
    from pyxds.xds.client import XdsClient

__all__ = [
    "RESOURCE_TIMEOUT",
    "Bootstrap",
    "BootstrapError",
    "CacheState",
    "XdsClient",
    "load_bootstrap",
]

_HOMES = {
    "RESOURCE_TIMEOUT": "pyxds.xds.ads_state",
    "CacheState": "pyxds.xds.ads_state",
    "Bootstrap": "pyxds.xds.bootstrap",
    "BootstrapError": "pyxds.xds.bootstrap",
    "load_bootstrap": "pyxds.xds.bootstrap",
    "XdsClient": "pyxds.xds.client",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pyxds.xds' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
