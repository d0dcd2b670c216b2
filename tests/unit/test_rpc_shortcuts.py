"""The RPC's own shortcuts (issue 18 item 2) change the cost of an RPC,
never what its pick sees or what it reports:

* an RPC without metadata picks with a ``PickArgs`` shared by every such
  RPC of the channel on the same path with the same read-only call
  attributes (a frozen value nothing can change); an RPC with metadata,
  another path, other attributes or attributes made for it alone (a request
  hash, a session: a plain dict) gets its own, equal to what it always got;
* an RPC stores only what differs from its class's defaults, and reads the
  same values either way;
* the last attempt is reported inside ``Rpc.finish``: trailers hook, then
  ``on_call_done``, once, as for any other attempt.
"""

from __future__ import annotations

import dataclasses
import random
from types import MappingProxyType

import pytest
from test_channel_picks import Selector, ready_subchannel
from test_channel_support import Harness, new_rpc

from pyxds.channel import rpc as rpc_module
from pyxds.lb.api import OK_STATUS, Endpoint, PickArgs, PickComplete, Picker
from pyxds.resolver.api import CallConfig


class Recording(Picker):
    """Completes every pick on one subchannel; keeps each pick's args and
    the order of each attempt's hooks."""

    def __init__(self, sub):
        self.sub = sub
        self.args: list[PickArgs] = []
        self.hooks: list[str] = []

    def pick(self, args):
        self.args.append(args)
        return PickComplete(
            self.sub,
            lambda status: self.hooks.append(f"done {status.code.name}"),
            lambda trailers: self.hooks.append(f"trailers {list(trailers)}"),
        )


ATTRIBUTES = MappingProxyType({"cluster": "c1"})


@pytest.fixture
def h():
    harness = Harness()
    harness.core.random = random.Random(7)
    harness.start()
    harness.selector = Selector(CallConfig(call_attributes=ATTRIBUTES))
    harness.resolve([Endpoint(("10.0.0.1:80",))], harness.selector)
    harness.picker = Recording(ready_subchannel(harness))
    harness.publish(harness.picker)
    yield harness
    harness.core.close()


def one_rpc(h, path="/svc/M", metadata=None):
    rpc = new_rpc(h.core, path, metadata, 30.0)
    transport = rpc.pick()
    assert transport is not None and not isinstance(transport, (float, rpc_module.Status))
    transport.call_finished()
    rpc.finish(OK_STATUS)
    return h.picker.args[-1]


def test_rpcs_without_metadata_share_one_pick_args_per_path_and_attributes(h):
    first, second = one_rpc(h), one_rpc(h)
    assert first is second
    assert first == PickArgs("/svc/M", (), ATTRIBUTES)
    assert first.call_attributes is ATTRIBUTES


def test_rpcs_with_metadata_get_their_own_pick_args(h):
    shared = one_rpc(h)
    first = one_rpc(h, metadata=[("k", "v")])
    second = one_rpc(h, metadata=[("k", "v")])
    assert first == second == PickArgs("/svc/M", (("k", "v"),), ATTRIBUTES)
    assert first is not second
    assert first is not shared and shared.metadata == ()


def test_another_path_or_other_attributes_get_other_pick_args(h):
    m = one_rpc(h)
    n = one_rpc(h, path="/svc/N")
    assert n is not m and n.path == "/svc/N" and m.path == "/svc/M"
    other = MappingProxyType({"cluster": "c2"})
    h.selector.config = CallConfig(call_attributes=other)
    m2 = one_rpc(h)
    assert m2 is not m and m2.call_attributes is other
    assert one_rpc(h) is m2


def test_attributes_made_per_rpc_are_never_shared_nor_kept(h):
    """The xDS selector makes a plain dict of attributes for an RPC with a
    request hash (A42) or a session (A55): such an RPC gets its own
    PickArgs, and the channel keeps nothing of it."""
    for n in range(3):
        attributes = {"cluster": "c1", "request_hash": n}
        h.selector.config = CallConfig(call_attributes=attributes)
        args = one_rpc(h)
        assert args.call_attributes is attributes
        assert args == PickArgs("/svc/M", (), attributes)
    assert h.core.shared_pick_args == {}


def test_a_new_read_only_view_per_rpc_gets_its_own_pick_args(h):
    """Read-only attributes made anew per RPC (a custom selector's) are
    shared only with RPCs that have those very attributes."""
    seen = []
    for n in range(3):
        attributes = MappingProxyType({"cluster": "c1", "n": n})
        h.selector.config = CallConfig(call_attributes=attributes)
        args = one_rpc(h)
        assert args.call_attributes is attributes
        seen.append(args)
    assert len({id(args) for args in seen}) == 3


def test_shared_pick_args_are_kept_bounded(h):
    for n in range(rpc_module._MAX_SHARED_ARGS + 5):
        one_rpc(h, path=f"/svc/M{n}")
    assert len(h.core.shared_pick_args) <= rpc_module._MAX_SHARED_ARGS
    assert one_rpc(h, path="/svc/again").path == "/svc/again"


def test_a_shared_pick_args_cannot_be_changed_by_a_picker(h):
    args = one_rpc(h)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.path = "/other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.metadata = (("k", "v"),)  # type: ignore[misc]
    # no new attribute either (slots; pyxds._values's frozen __setattr__
    # answers TypeError for a name that is no field)
    with pytest.raises((AttributeError, TypeError)):
        args.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        args.call_attributes["cluster"] = "c2"  # type: ignore[index]  # the selector's read-only view
    assert isinstance(args.metadata, tuple)
    assert one_rpc(h) == PickArgs("/svc/M", (), ATTRIBUTES)


def test_an_rpc_without_options_reads_its_class_defaults(h):
    rpc = new_rpc(h.core, "/svc/M")
    assert (rpc.metadata, rpc.send_metadata, rpc.deadline, rpc.wait_for_ready) == (
        (),
        None,
        None,
        False,
    )
    assert rpc.metrics is None and rpc.remaining() is None
    told = new_rpc(h.core, "/svc/M", [("k", "v")], 5.0, False)
    assert told.metadata == told.send_metadata == (("k", "v"),)
    assert told.deadline is not None and 0 < told.remaining() <= 5.0
    assert told.wait_for_ready is False and told._wfr_explicit
    empty = new_rpc(h.core, "/svc/M", (), None, True)
    assert empty.metadata == () and empty.send_metadata == () and empty.wait_for_ready is True
    for each in (rpc, told, empty):
        each.finish(OK_STATUS)


def test_the_last_attempt_reaches_the_policy_once_trailers_first(h):
    rpc = new_rpc(h.core, "/svc/M", None, 30.0)
    transport = rpc.pick()
    transport.call_finished()

    class Call:
        _cython_call = None
        _state = None

        def trailing_metadata(self):
            return (("orca", "x"),)

        def initial_metadata(self):
            return ()

    rpc.finish(OK_STATUS, Call())
    rpc.finish(OK_STATUS, Call())  # a second end changes nothing
    assert h.picker.hooks == ["trailers [('orca', 'x')]", "done OK"]
