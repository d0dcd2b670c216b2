"""The per-RPC filter state (A39 ``FilterVerdict``) and its hooks, where a
stateful-session filter (A55/A60) plugs in: before every pick the call
attributes the picker reads, after every completed pick the address, and
the response's initial metadata.  The channel's Rpc calls each hook at its
step; a route without such filters gets no filter state at all."""

from __future__ import annotations

import random

import grpc
import pytest
from test_channel_picks import Selector, ready_subchannel
from test_channel_support import Harness, new_rpc

from pyxds.lb.api import Endpoint, PickComplete, Picker, Status
from pyxds.resolver.api import CallConfig
from pyxds.resolver.http_filters import CallFilter, FilterVerdict, run_chain

OVERRIDE = "override_host"


class Recording(Picker):
    def __init__(self, sub):
        self.sub = sub
        self.attributes = []

    def pick(self, args):
        self.attributes.append(dict(args.call_attributes))
        return PickComplete(self.sub)


class Sticky(CallFilter):
    """A55's shape: reads a cookie before the pick, learns the address
    after it, adds set-cookie to the response headers."""

    def __init__(self, events):
        self.events = events

    def on_call(self, metadata, rng):
        cookie = dict(metadata).get("cookie")
        events = self.events

        def pick_attributes(attributes):
            return {**attributes, OVERRIDE: cookie} if cookie else attributes

        def picked(address):
            events.append(("picked", address))

        def response_headers(md):
            return (*md, ("set-cookie", "host=abc"))

        return FilterVerdict(
            pick_attributes=pick_attributes, picked=picked, response_headers=response_headers
        )


@pytest.fixture
def h():
    harness = Harness()
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    harness.picker = Recording(ready_subchannel(harness))
    harness.publish(harness.picker)
    yield harness
    harness.core.close()


def route_with(h, *filters):
    h.core.selector = Selector(CallConfig(call_attributes={"cluster": "c1"}, filters=filters))


def test_a_filter_sets_the_call_attributes_the_picker_reads_and_hears_the_address(h):
    events: list = []
    route_with(h, Sticky(events))
    rpc = new_rpc(h.core, "/svc/M", [("cookie", "10.0.0.1:80")], 5.0, False)
    assert rpc.pick() is not None
    assert h.picker.attributes == [{"cluster": "c1", OVERRIDE: "10.0.0.1:80"}]
    assert events == [("picked", "10.0.0.1:80")]
    assert rpc.response_headers((("a", "1"),)) == (("a", "1"), ("set-cookie", "host=abc"))


def test_the_hooks_run_at_every_attempt_but_the_filters_once_per_rpc(h):
    calls = []
    events: list = []

    class Counting(Sticky):
        def on_call(self, metadata, rng):
            calls.append(1)
            return super().on_call(metadata, rng)

    route_with(h, Counting(events))
    rpc = new_rpc(h.core, "/svc/M", [("cookie", "x")], 5.0, False)
    transport = rpc.pick()
    transport.retire(force=True)
    assert rpc.start_failed(transport)  # nothing sent: the next attempt picks again
    h.publish(h.picker)
    assert rpc.pick() is None  # its transport is closed now: wait for the next picker
    assert calls == [1]
    assert len(h.picker.attributes) == 2 and events == [("picked", "10.0.0.1:80")]


def test_a_route_without_filters_has_no_filter_state(h):
    route_with(h)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    rpc.pick()
    assert rpc.filters is None
    assert rpc.response_headers((("a", "1"),)) == (("a", "1"),)


def test_filters_that_answer_nothing_cost_no_filter_state(h):
    class Quiet(CallFilter):
        def on_call(self, metadata, rng):
            return None

    route_with(h, Quiet(), Quiet())
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    rpc.pick()
    assert rpc.filters is None


def test_chain_folds_hooks_in_order_and_headers_in_reverse():
    seen = []

    class Tag(CallFilter):
        def __init__(self, name):
            self.name = name

        def on_call(self, metadata, rng):
            name = self.name
            return FilterVerdict(
                delay=0.1,
                pick_attributes=lambda a: {**a, "order": (*a.get("order", ()), name)},
                picked=lambda address: seen.append((name, address)),
                response_headers=lambda md: (*md, ("via", name)),
            )

    verdict = run_chain((Tag("a"), Tag("b")), (), random.Random(1))
    assert verdict.delay == pytest.approx(0.2)
    assert verdict.pick_attributes({})["order"] == ("a", "b")
    verdict.picked("10.0.0.1:80")
    assert seen == [("a", "10.0.0.1:80"), ("b", "10.0.0.1:80")]
    # the response travels back up the chain: the last filter sees it first
    assert verdict.response_headers(()) == (("via", "b"), ("via", "a"))


def test_an_abort_ends_the_chain_and_later_filters_do_not_see_the_rpc():
    seen = []

    class Abort(CallFilter):
        def on_call(self, metadata, rng):
            return FilterVerdict(abort=Status(grpc.StatusCode.PERMISSION_DENIED, "no"))

    class Later(CallFilter):
        def on_call(self, metadata, rng):
            seen.append(1)
            return None

    verdict = run_chain((Abort(), Later()), (), random.Random(1))
    assert verdict.abort.code is grpc.StatusCode.PERMISSION_DENIED and seen == []
