"""Test support for pyxds and for users' custom policies: a fake clock, a fake
helper and fake subchannels (sans-IO; no sockets, no threads), and a fake
XdsClient that a test feeds resources through."""

from typing import TYPE_CHECKING

from pyxds.testing.fake_clock import FakeClock, FakeTimer
from pyxds.testing.fakes import FakeHelper, FakeSubchannel, StateReport

if TYPE_CHECKING:
    from pyxds.testing.fake_xds_client import FakeXdsClient

__all__ = [
    "FakeClock",
    "FakeHelper",
    "FakeLookup",
    "FakeRouteLookupChannel",
    "FakeSubchannel",
    "FakeTimer",
    "FakeXdsClient",
    "StateReport",
]


def __getattr__(name: str) -> object:
    # Imported lazily: it pulls in the xDS resource types.
    if name in ("FakeRouteLookupChannel", "FakeLookup"):
        from pyxds.testing import fake_rls

        return getattr(fake_rls, name)
    if name == "FakeXdsClient":
        from pyxds.testing.fake_xds_client import FakeXdsClient

        return FakeXdsClient
    raise AttributeError(name)
