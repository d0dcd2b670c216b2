"""Test support for pyxds and for users' custom policies: a fake clock, a fake
helper and fake subchannels (sans-IO; no sockets, no threads)."""

from pyxds.testing.fake_clock import FakeClock, FakeTimer
from pyxds.testing.fakes import FakeHelper, FakeSubchannel, StateReport

__all__ = ["FakeClock", "FakeTimer", "FakeHelper", "FakeSubchannel", "StateReport"]
