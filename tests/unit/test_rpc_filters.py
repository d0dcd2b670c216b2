"""The per-RPC filter state (A39 ``FilterVerdict``: A33's delay, abort and
``done``): a route's filters run once per RPC, however many attempts it
makes; a route without such filters gets no filter state at all; the
chain folds several filters' verdicts into one.  (A55/A60, which act past
the pick, are applied by the ConfigSelector instead:
test_stateful_session_filter.py.)"""

from __future__ import annotations

import random

import grpc
import pytest
from test_channel_picks import Selector, ready_subchannel
from test_channel_support import Harness, new_rpc

from pyxds.lb.api import Endpoint, PickComplete, Picker, Status
from pyxds.resolver.api import CallConfig
from pyxds.resolver.http_filters import CallFilter, FilterVerdict, run_chain


class Always(Picker):
    def __init__(self, sub):
        self.sub = sub
        self.picks = 0

    def pick(self, args):
        self.picks += 1
        return PickComplete(self.sub)


@pytest.fixture
def h():
    harness = Harness()
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    harness.picker = Always(ready_subchannel(harness))
    harness.publish(harness.picker)
    yield harness
    harness.core.close()


def route_with(h, *filters):
    h.core.selector = Selector(CallConfig(call_attributes={"cluster": "c1"}, filters=filters))


def test_the_filters_run_once_per_rpc_not_once_per_attempt(h):
    calls = []
    done = []

    class Counting(CallFilter):
        def on_call(self, metadata, rng):
            calls.append(1)
            return FilterVerdict(done=lambda: done.append(1))

    route_with(h, Counting())
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    transport = rpc.pick()
    assert done == [1]  # carried out before the first pick
    transport.retire(force=True)
    assert rpc.start_failed(transport)  # nothing sent: the next attempt picks again
    h.publish(h.picker)
    assert rpc.pick() is None  # its transport is closed now: wait for the next picker
    assert calls == [1] and done == [1]
    assert h.picker.picks == 2


def test_a_route_without_filters_has_no_filter_state(h):
    route_with(h)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    rpc.pick()
    assert rpc.filters is None


def test_filters_that_answer_nothing_cost_no_filter_state(h):
    class Quiet(CallFilter):
        def on_call(self, metadata, rng):
            return None

    route_with(h, Quiet(), Quiet())
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    rpc.pick()
    assert rpc.filters is None


def test_chain_adds_delays_and_runs_each_done_in_order():
    seen = []

    class Tag(CallFilter):
        def __init__(self, name):
            self.name = name

        def on_call(self, metadata, rng):
            return FilterVerdict(delay=0.1, done=lambda: seen.append(self.name))

    verdict = run_chain((Tag("a"), Tag("b")), (), random.Random(1))
    assert verdict.delay == pytest.approx(0.2)
    verdict.done()
    assert seen == ["a", "b"]


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
