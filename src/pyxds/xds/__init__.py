"""pyxds.xds: the xDS client (A27, A57, A88): bootstrap, ADS transport,
validated resources, watches and cache."""

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
