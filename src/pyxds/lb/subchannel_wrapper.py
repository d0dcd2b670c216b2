"""The part of a policy's subchannel wrapper that only passes on to the
subchannel it wraps (outlier_detection's, xds_cluster_impl's and
xds_override_host's, as C-core's ``DelegatingSubchannel``): ``connect``,
``reset_backoff``, and any other attribute the channel's subchannel offers
(``core``, ``watch_orca_oob``, ``watch_connectivity``)."""

from __future__ import annotations

from typing import Any

from pyxds.lb.api import Subchannel

__all__ = ["SubchannelWrapper"]


class SubchannelWrapper(Subchannel):
    """A :class:`Subchannel` over ``real``.  No slots of its own (a subclass
    names ``real`` in its ``__slots__``, beside ``Watched``'s)."""

    __slots__ = ()
    real: Subchannel

    def connect(self) -> None:
        self.real.connect()

    def reset_backoff(self) -> None:
        self.real.reset_backoff()

    def __getattr__(self, name: str) -> Any:
        if name == "real":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.real, name)
