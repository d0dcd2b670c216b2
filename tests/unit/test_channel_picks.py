"""The channel's per-RPC logic over fakes (no sockets): ConfigSelector, then
the picker; queue / fail / drop / wait_for_ready; wake-ups on every new
picker and config (TRAPS.md); deadlines; A31 ordering; completion hooks."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc
import pytest
from test_channel_support import (
    FakeGrpcError,
    FnMethod,
    Harness,
    new_rpc,
    pick_blocking,
    run_blocking,
)

from pyxds.channel import rpc as rpc_module
from pyxds.channel.calls import ChannelRpcError, FutureCall
from pyxds.channel.dump import config_dump
from pyxds.channel.rpc import DEADLINE_EXCEEDED
from pyxds.channel.subchannel import Transport, core_of
from pyxds.lb.api import (
    ConnectivityState,
    Endpoint,
    FailPicker,
    PickComplete,
    PickDrop,
    Picker,
    PickFail,
    PickQueue,
    QueuePicker,
    Status,
)
from pyxds.resolver.api import CallConfig, ConfigSelector

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
GC = grpc.ChannelConnectivity
WAIT = 10.0  # bound of every wait for the RPC's thread (seconds; ends at once when it happens)
SPIN = 0.2  # a window in which a busy-looping RPC would pick again


class CountingPicker(Picker):
    def __init__(self, result):
        self.result = result
        self.calls = 0
        self.args = []
        self._picked = threading.Condition()

    def pick(self, args):
        with self._picked:
            self.calls += 1
            self.args.append(args)
            self._picked.notify_all()
        return self.result

    def wait_for_calls(self, n: int = 1, timeout: float = WAIT) -> bool:
        """Until this picker was asked ``n`` times (the RPC's thread got
        there, however late it runs under load); False after ``timeout``."""
        with self._picked:
            return self._picked.wait_for(lambda: self.calls >= n, timeout)


def wait_for(predicate, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


class Selector(ConfigSelector):
    def __init__(self, config: CallConfig | None = None):
        self.config = config or CallConfig(call_attributes={"cluster": "c1"})
        self.calls = 0

    def select(self, path, metadata):
        self.calls += 1
        return self.config


def ready_subchannel(h: Harness, address: str = "10.0.0.1:80"):
    """A READY subchannel created the way a policy would."""
    sub = h.policy.helper.create_subchannel(address, {})
    h.core.serializer.run(sub.connect)
    h.transports.last(address).report(GC.READY)
    assert core_of(sub).state is ConnectivityState.READY
    return sub


@pytest.fixture
def h():
    harness = Harness()
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    yield harness
    harness.core.close()


def run_in_thread(fn):
    box = {}

    def go():
        try:
            box["result"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, box


def test_channel_starts_idle_and_first_rpc_starts_the_resolver():
    harness = Harness()
    assert harness.core.idle
    assert harness.core.state is ConnectivityState.IDLE
    harness.start()
    assert harness.resolver.started
    assert not harness.core.idle


def test_complete_pick_returns_the_subchannel_and_passes_call_attributes(h):
    sub = ready_subchannel(h)
    picker = CountingPicker(PickComplete(sub))
    h.publish(picker)
    rpc = new_rpc(h.core, "/svc/M", [("k", "v")], 5.0, False)
    outcome = rpc.pick()
    assert isinstance(outcome, Transport)
    assert picker.args[0].path == "/svc/M"
    assert picker.args[0].metadata == (("k", "v"),)
    assert picker.args[0].call_attributes["cluster"] == "c1"


def test_a_picks_headers_go_with_its_attempt_replacing_the_rpcs_own(h):
    # PickComplete.metadata (rls_experimental's x-google-rls-data)
    sub = ready_subchannel(h)
    h.publish(CountingPicker(PickComplete(sub, metadata=(("x-rls", "new"),))))
    rpc = new_rpc(h.core, "/svc/M", [("k", "v"), ("x-rls", "old")], 5.0, False)
    assert isinstance(rpc.pick(), Transport)
    assert rpc.attempt_metadata() == (("k", "v"), ("x-rls", "new"))
    assert rpc.metadata == (("k", "v"), ("x-rls", "old"))  # the RPC's own stay
    # the next attempt's pick decides again: none from this picker
    h.publish(CountingPicker(PickComplete(sub)))
    assert isinstance(rpc.pick(), Transport)
    assert rpc.attempt_metadata() == (("k", "v"), ("x-rls", "old"))


def test_queued_rpc_waits_without_busy_looping_and_completes_on_next_picker(h):
    queue = CountingPicker(PickQueue())
    h.publish(queue)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    thread, box = run_in_thread(lambda: pick_blocking(rpc))
    assert queue.wait_for_calls(1)  # queued
    thread.join(SPIN)
    assert thread.is_alive()
    assert queue.calls == 1  # waiting, not spinning
    sub = ready_subchannel(h)
    h.publish(CountingPicker(PickComplete(sub)))
    thread.join(WAIT)
    assert isinstance(box["result"], Transport)


def test_queued_rpc_repicks_on_every_new_picker(h):
    # Each picker is published once the RPC has asked the one before: two
    # published back to back may rightly be seen as one (only the newest is
    # worth a pick), so the test must not race the RPC's thread.
    first = CountingPicker(PickQueue())
    h.publish(first)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    thread, box = run_in_thread(lambda: pick_blocking(rpc))
    assert first.wait_for_calls(1)  # queued
    pickers = [CountingPicker(PickQueue()) for _ in range(3)]
    for picker in pickers:
        h.publish(picker)
        assert picker.wait_for_calls(1), [p.calls for p in pickers]
    thread.join(SPIN)
    assert [p.calls for p in [first, *pickers]] == [1, 1, 1, 1]  # once each, no spinning
    h.publish(FailPicker(Status(UNAVAILABLE, "all down")))
    thread.join(WAIT)
    assert box["result"] == Status(UNAVAILABLE, "all down")


def test_pick_fail_fails_rpc_with_the_pickers_status(h):
    h.publish(FailPicker(Status(UNAVAILABLE, "no healthy upstream")))
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    assert pick_blocking(rpc) == Status(UNAVAILABLE, "no healthy upstream")


def test_pick_fail_with_wait_for_ready_waits_for_a_usable_picker(h):
    failing = CountingPicker(PickFail(Status(UNAVAILABLE, "down")))
    h.publish(failing, ConnectivityState.TRANSIENT_FAILURE)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, True)
    thread, box = run_in_thread(lambda: pick_blocking(rpc))
    assert failing.wait_for_calls(1)  # the failure was seen
    thread.join(SPIN)
    assert thread.is_alive()  # and waited on, not returned
    sub = ready_subchannel(h)
    h.publish(PickCompletePicker(sub))
    thread.join(WAIT)
    assert isinstance(box["result"], Transport)


class PickCompletePicker(Picker):
    def __init__(self, sub):
        self.sub = sub

    def pick(self, args):
        return PickComplete(self.sub)


def test_pick_drop_fails_even_wait_for_ready_rpcs(h):
    h.publish(CountingPicker(PickDrop(Status(UNAVAILABLE, "EDS-configured drop: lb"))))
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, True)
    assert pick_blocking(rpc) == Status(UNAVAILABLE, "EDS-configured drop: lb")


def test_queued_pick_is_bounded_by_the_deadline(h):
    h.publish(QueuePicker())
    rpc = new_rpc(h.core, "/svc/M", None, 0.05, False)
    assert pick_blocking(rpc) == DEADLINE_EXCEEDED


def test_wait_for_ready_rpc_queued_before_any_config_completes_when_config_arrives():
    # TRAPS: C-core's wait_for_ready RPC queued while nothing was cached
    # waited out its whole deadline after a good config arrived.
    harness = Harness()
    harness.start()
    error = Status(UNAVAILABLE, "xDS listener svc: NACKed: bad")
    harness.resolver.push(
        __import__("pyxds.resolver.api", fromlist=["ResolverResult"]).ResolverResult(
            endpoints=error, service_config_error=error
        )
    )
    rpc_fast = new_rpc(harness.core, "/svc/M", None, 5.0, False)
    assert pick_blocking(rpc_fast) == error  # non-wfr fails with the reason
    rpc = new_rpc(harness.core, "/svc/M", None, 5.0, True)
    thread, box = run_in_thread(lambda: pick_blocking(rpc))
    thread.join(0.1)
    assert thread.is_alive()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    sub = ready_subchannel(harness)
    harness.publish(PickCompletePicker(sub))
    thread.join(WAIT)
    assert isinstance(box["result"], Transport)
    harness.core.close()


def test_new_config_selector_alone_wakes_queued_rpcs():
    harness = Harness()
    harness.start()
    rpc = new_rpc(harness.core, "/svc/M", None, 5.0, True)
    thread, box = run_in_thread(lambda: pick_blocking(rpc))
    thread.join(0.05)
    selector = Selector(CallConfig(status=Status(UNAVAILABLE, "No matching route")))
    harness.resolve([Endpoint(("10.0.0.1:80",))], selector)
    thread.join(WAIT)
    assert box["result"] == Status(UNAVAILABLE, "No matching route")
    harness.core.close()


def test_config_selector_status_fails_rpc_and_commits_once(h):
    committed = []
    selector = Selector(
        CallConfig(
            status=Status(UNAVAILABLE, "No matching route found in xDS route config"),
            on_committed=lambda: committed.append(1),
        )
    )
    h.resolve([Endpoint(("10.0.0.1:80",))], selector)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, True)
    outcome = pick_blocking(rpc)
    assert outcome.details == "No matching route found in xDS route config"
    rpc.finish(outcome)
    rpc.finish(outcome)
    assert committed == [1]


def test_no_config_selector_fails_plain_rpcs_but_wait_for_ready_ones_wait_for_a_config(h):
    # A74: the listener was deleted after a good config.  C-core is left with
    # no addresses: plain RPCs fail at once, wait_for_ready ones wait.
    gone = Status(UNAVAILABLE, "LDS resource L does not exist (deleted by the xDS server)")
    h.resolve([Endpoint(("10.0.0.1:80",))], Selector(CallConfig(status=gone, no_config=True)))
    plain = new_rpc(h.core, "/svc/M", None, 5.0, False)
    assert pick_blocking(plain) == gone
    waiting = new_rpc(h.core, "/svc/M", None, 5.0, True)
    thread, box = run_in_thread(lambda: pick_blocking(waiting))
    thread.join(0.1)
    assert thread.is_alive()  # queued, not failed
    h.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    h.publish(PickCompletePicker(ready_subchannel(h)))
    thread.join(WAIT)
    assert isinstance(box["result"], Transport)


def test_route_level_selector_status_fails_even_wait_for_ready_rpcs(h):
    # "No matching route" is this RPC's answer, not a missing config.
    no_route = Status(UNAVAILABLE, "No matching route found in xDS route config")
    h.resolve([Endpoint(("10.0.0.1:80",))], Selector(CallConfig(status=no_route)))
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, True)
    assert pick_blocking(rpc) == no_route


def test_config_selector_is_called_once_per_rpc_even_when_queued(h):
    selector = Selector()
    h.resolve([Endpoint(("10.0.0.1:80",))], selector)
    first, second = CountingPicker(PickQueue()), CountingPicker(PickQueue())
    h.publish(first)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    thread, box = run_in_thread(lambda: pick_blocking(rpc))
    assert first.wait_for_calls(1)  # queued
    h.publish(second)
    assert second.wait_for_calls(1)  # picked again
    h.publish(PickCompletePicker(ready_subchannel(h)))
    thread.join(WAIT)
    assert isinstance(box["result"], Transport)
    assert selector.calls == 1


def test_route_timeout_caps_the_deadline(h):
    h.resolve([Endpoint(("10.0.0.1:80",))], Selector(CallConfig(timeout=0.05)))
    h.publish(QueuePicker())
    rpc = new_rpc(h.core, "/svc/M", None, 30.0, False)
    assert pick_blocking(rpc) == DEADLINE_EXCEEDED
    assert rpc.remaining() < 0.1


def test_lb_policy_is_updated_before_the_config_selector_is_swapped(h):
    # A31: the picker must know every new cluster before the selector that
    # can return it is used.
    old = h.core.selector
    seen = []
    h.policy.on_update = lambda update: seen.append(h.core.selector)
    new = Selector()
    h.resolve([Endpoint(("10.0.0.2:80",))], new)
    assert seen == [old]
    assert h.core.selector is new


def failing_twice(h, first: str, second: str) -> tuple[Any, Any]:
    """The transport of 10.0.0.1:80, whose next two attempts fail
    UNAVAILABLE with ``first`` then ``second`` (one error object each, as
    grpcio raises), and a new RPC."""
    transport = h.transports.last("10.0.0.1:80")
    transport.fail_with = [FakeGrpcError(UNAVAILABLE, first), FakeGrpcError(UNAVAILABLE, second)]
    return transport, new_rpc(h.core, "/svc/M", None, 5.0, False)


def with_call(t, remaining):
    return t.channel.unary_unary("/svc/M").with_call(b"req")


def test_an_attempt_the_server_refused_unseen_is_retried_once_and_each_attempt_reported(h):
    # A6 "Transparent Retries", case 3: reached the server, refused before
    # its application saw it: sent again once, then the failure stands.
    sub = ready_subchannel(h)
    done = []

    class Tracking(Picker):
        def pick(self, args):
            return PickComplete(sub, lambda status: done.append(status.code))

    h.publish(Tracking())
    refused = "Received RST_STREAM with error code 7)"
    transport, rpc = failing_twice(h, refused, refused)
    with pytest.raises(grpc.RpcError) as info:
        run_blocking(rpc, with_call)
    assert info.value.code() is UNAVAILABLE
    assert len(transport.calls) == 2  # one transparent retry, not more
    assert done == [UNAVAILABLE, UNAVAILABLE]


def test_a_second_goaway_from_the_same_connection_waits_for_a_newer_picker_and_succeeds(
    h, monkeypatch
):
    # The order of events behind the max-connection-age flake
    # (tests/e2e/test_channel_static.py): the server's GOAWAY refuses an
    # attempt (A6 case 3: sent again at once); the retry reaches the same
    # grpcio channel before it has moved off the connection going away, which
    # refuses it with the same GOAWAY, before it goes on the wire (A6 case 2:
    # C-core retries it until the deadline).  Not the end of the RPC: it
    # waits for a newer picker, as an attempt that never left the client.
    monkeypatch.setattr(rpc_module, "STALE_PICKER_GRACE", WAIT)  # longer than the test
    sub = ready_subchannel(h, "10.0.0.1:80")
    stale = CountingPicker(PickComplete(sub))
    h.publish(stale)
    goaway = "GOAWAY received; Error code: 0; Debug Text: max_age"
    transport, rpc = failing_twice(h, goaway, goaway)
    thread, box = run_in_thread(lambda: run_blocking(rpc, with_call))
    assert wait_for(lambda: len(transport.calls) == 2)  # the one transparent retry, at once
    thread.join(SPIN)
    assert thread.is_alive(), box  # neither failed nor spinning on the stale picker
    assert stale.calls == 2
    h.publish(CountingPicker(PickComplete(sub)))  # the connection's end is known
    thread.join(WAIT)
    assert not thread.is_alive()
    assert box.get("result") == (("10.0.0.1:80", b"req"), None), box
    assert len(transport.calls) == 3


def test_a_goaway_after_another_refusal_is_a_refusal_retried_once(h):
    # Only a GOAWAY that follows a GOAWAY from the same connection is taken
    # for an attempt that never left the client; a REFUSED_STREAM then a
    # GOAWAY is two refusals (A6 case 3: one transparent retry, then the
    # failure stands).
    sub = ready_subchannel(h)
    h.publish(PickCompletePicker(sub))
    transport, rpc = failing_twice(
        h,
        "Received RST_STREAM with error code 7)",
        "GOAWAY received; Error code: 0; Debug Text: max_age",
    )
    with pytest.raises(grpc.RpcError) as info:
        run_blocking(rpc, with_call)
    assert info.value.code() is UNAVAILABLE
    assert len(transport.calls) == 2


def test_an_attempt_that_never_left_the_client_waits_for_a_newer_picker_and_succeeds(
    h, monkeypatch
):
    # A6 case 2, and the order of events behind the ring_hash failover flake:
    # the backend's connection dies; before the subchannel's state change
    # reaches the LB policy, an RPC is picked by the READY picker onto that
    # subchannel and its grpcio channel fails it at once ("failed to connect
    # to all addresses").  The RPC must neither fail nor be re-picked by the
    # same (stale) picker: it waits for the next picker and goes where that
    # one says, however many stale attempts it takes (bounded by its deadline).
    monkeypatch.setattr(rpc_module, "STALE_PICKER_GRACE", WAIT)  # longer than the test
    dead = ready_subchannel(h, "10.0.0.1:80")
    live = ready_subchannel(h, "10.0.0.2:80")
    stale = CountingPicker(PickComplete(dead))
    h.publish(stale)
    lost = FakeGrpcError(UNAVAILABLE, "failed to connect to all addresses; last error: x")
    h.transports.last("10.0.0.1:80").fail_with = [lost]
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, True)

    def invoke(t, remaining):
        return t.channel.unary_unary("/svc/M").with_call(b"req")

    thread, box = run_in_thread(lambda: run_blocking(rpc, invoke))
    assert stale.wait_for_calls(1)
    assert wait_for(lambda: len(h.transports.last("10.0.0.1:80").calls) == 1)  # attempt lost
    thread.join(SPIN)
    assert thread.is_alive(), box  # waiting: neither failed nor spinning on the stale picker
    assert stale.calls == 1
    h.publish(CountingPicker(PickComplete(live)))  # the loss is known: the next picker
    thread.join(WAIT)
    assert not thread.is_alive()
    assert box.get("result") == (("10.0.0.2:80", b"req"), None), box
    assert len(h.transports.last("10.0.0.1:80").calls) == 1


def test_a_deadline_spent_waiting_for_a_picker_after_a_lost_connection_is_logged(
    h, caplog, monkeypatch
):
    # The RPC waits for a newer picker (test above); if none comes before its
    # deadline, within STALE_PICKER_GRACE, DEADLINE_EXCEEDED alone would not
    # say why it never had a second attempt: a warning does.
    monkeypatch.setattr(rpc_module, "STALE_PICKER_GRACE", WAIT)  # past the deadline
    dead = ready_subchannel(h, "10.0.0.1:80")
    h.publish(PickCompletePicker(dead))
    lost = FakeGrpcError(UNAVAILABLE, "failed to connect to all addresses; last error: x")
    h.transports.last("10.0.0.1:80").fail_with = [lost]
    rpc = new_rpc(h.core, "/svc/M", None, 0.3, False)
    warnings = caplog.at_level(logging.WARNING, logger="pyxds.channel.rpc")
    with warnings, pytest.raises(grpc.RpcError) as info:
        run_blocking(rpc, lambda t, r: t.channel.unary_unary("/svc/M").with_call(b"req"))
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(h.transports.last("10.0.0.1:80").calls) == 1
    warned = [m for m in caplog.messages if "waiting for a new picker" in m]
    assert len(warned) == 1 and "/svc/M" in warned[0], caplog.records


def test_with_no_newer_picker_within_the_grace_the_same_picker_is_asked_again(h, monkeypatch):
    # The connection was lost and re-made between two connectivity checks
    # (pyxds.connectivity rule 1): no state changed, so no new picker comes.
    # After STALE_PICKER_GRACE the RPC is picked by the current picker again
    # (as C-core re-picks a transparent retry) instead of waiting out its
    # deadline; the re-made connection serves it.
    monkeypatch.setattr(rpc_module, "STALE_PICKER_GRACE", 0.05)
    sub = ready_subchannel(h, "10.0.0.1:80")
    picker = CountingPicker(PickComplete(sub))
    h.publish(picker)
    lost = FakeGrpcError(UNAVAILABLE, "failed to connect to all addresses; last error: x")
    h.transports.last("10.0.0.1:80").fail_with = [lost]
    rpc = new_rpc(h.core, "/svc/M", None, WAIT, False)
    started = time.monotonic()
    result = run_blocking(rpc, lambda t, r: t.channel.unary_unary("/svc/M").with_call(b"req"))
    assert result == (("10.0.0.1:80", b"req"), None)
    assert time.monotonic() - started >= 0.05  # not before the grace
    assert picker.calls == 2
    assert len(h.transports.last("10.0.0.1:80").calls) == 2


def test_a_wait_for_ready_rpc_without_deadline_is_not_stranded_by_a_stale_picker(h, monkeypatch):
    # Without a deadline the wait for a newer picker had no end at all.
    monkeypatch.setattr(rpc_module, "STALE_PICKER_GRACE", 0.05)
    sub = ready_subchannel(h, "10.0.0.1:80")
    h.publish(CountingPicker(PickComplete(sub)))
    lost = FakeGrpcError(UNAVAILABLE, "failed to connect to all addresses; last error: x")
    h.transports.last("10.0.0.1:80").fail_with = [lost]
    rpc = new_rpc(h.core, "/svc/M", None, None, True)
    thread, box = run_in_thread(
        lambda: run_blocking(rpc, lambda t, r: t.channel.unary_unary("/svc/M").with_call(b"req"))
    )
    thread.join(WAIT)
    assert not thread.is_alive()
    assert box.get("result") == (("10.0.0.1:80", b"req"), None), box


def test_a_plain_deadline_while_queued_logs_nothing(h, caplog):
    h.publish(QueuePicker())
    rpc = new_rpc(h.core, "/svc/M", None, 0.1, False)
    warnings = caplog.at_level(logging.WARNING, logger="pyxds.channel.rpc")
    with warnings, pytest.raises(grpc.RpcError) as info:
        run_blocking(rpc, lambda t, r: t.channel.unary_unary("/svc/M").with_call(b"req"))
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert not [m for m in caplog.messages if "new picker" in m]


def test_an_attempt_that_never_left_the_client_is_retried_until_the_deadline_not_once(h):
    sub = ready_subchannel(h)
    transport = h.transports.last("10.0.0.1:80")
    lost = "failed to connect to all addresses; last error: x"
    transport.fail_with = [FakeGrpcError(UNAVAILABLE, lost) for _ in range(3)]
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)

    def invoke(t, remaining):
        try:
            return t.channel.unary_unary("/svc/M").with_call(b"req")
        except grpc.RpcError:
            # the subchannel's state change arrives: a new picker (to the
            # same subchannel, which recovers on the fourth attempt)
            h.publish(PickCompletePicker(sub))
            raise

    h.publish(PickCompletePicker(sub))
    result = run_blocking(rpc, invoke)
    assert result == (("10.0.0.1:80", b"req"), None)
    assert len(transport.calls) == 4


def test_rpc_failure_after_send_is_not_retried(h):
    sub = ready_subchannel(h)
    h.publish(PickCompletePicker(sub))
    transport = h.transports.last("10.0.0.1:80")
    transport.fail_with = [FakeGrpcError(UNAVAILABLE, "Socket closed")]
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    with pytest.raises(grpc.RpcError):
        run_blocking(rpc, lambda t, r: t.channel.unary_unary("/m").with_call(b""))
    assert len(transport.calls) == 1


def test_channel_error_is_a_grpc_rpc_error_and_call(h):
    h.publish(FailPicker(Status(UNAVAILABLE, "no healthy upstream")))
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    with pytest.raises(grpc.RpcError) as info:
        run_blocking(rpc, lambda t, r: None)
    err = info.value
    assert isinstance(err, grpc.Call) and isinstance(err, ChannelRpcError)
    assert err.code() is UNAVAILABLE and err.details() == "no healthy upstream"
    assert "no healthy upstream" in str(err)


class _Running:
    """A grpcio call that never ends (the test only watches it start)."""

    def add_callback(self, callback):
        return True

    def cancel(self):
        return True


def test_a_queued_future_starts_once_on_a_later_picker_and_honours_deadline(h):
    h.publish(QueuePicker())
    started = []
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False, blocking=False)
    call = FutureCall(rpc, FnMethod(lambda t, r: started.append(t) or _Running()), 1, 0, 0)
    assert started == [] and not call.done()
    sub = ready_subchannel(h)
    h.publish(PickCompletePicker(sub))
    h.publish(PickCompletePicker(sub))
    assert len(started) == 1 and isinstance(started[0], Transport)
    late = []
    rpc2 = new_rpc(h.core, "/svc/M", None, 1.0, False, blocking=False)
    h.publish(QueuePicker())
    call2 = FutureCall(rpc2, FnMethod(lambda t, r: late.append(t)), 1, 0, 0)
    h.clock.advance(1.01)
    assert late == [] and call2.done()
    assert call2.exception().code() is DEADLINE_EXCEEDED.code


def test_a_cancelled_queued_future_never_starts(h):
    h.publish(QueuePicker())
    started = []
    rpc = new_rpc(h.core, "/svc/M", None, None, False, blocking=False)
    call = FutureCall(rpc, FnMethod(lambda t, r: started.append(t)), 1, 0, 0)
    assert call.cancel()
    h.publish(PickCompletePicker(ready_subchannel(h)))
    assert started == [] and call.cancelled()


def test_close_fails_queued_and_new_rpcs_with_cancelled(h):
    queue = CountingPicker(PickQueue())
    h.publish(queue)
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, True)
    thread, box = run_in_thread(lambda: pick_blocking(rpc))
    assert queue.wait_for_calls(1)  # queued
    h.core.close()
    thread.join(WAIT)
    assert box["result"].code is grpc.StatusCode.CANCELLED
    assert h.core.state is ConnectivityState.SHUTDOWN


def test_idle_timeout_releases_lb_and_resolver_and_next_rpc_restarts_them():
    harness = Harness(options=[("grpc.client_idle_timeout_ms", 1000)])
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    first_policy, first_resolver = harness.policy, harness.resolver
    harness.advance(0.5)
    assert not harness.core.idle
    harness.advance(0.8)  # 1-1.25 timeouts after the last RPC ended
    assert harness.core.idle
    assert first_policy.shut_down and first_resolver.shut_down
    assert harness.core.state is ConnectivityState.IDLE
    harness.start()
    assert harness.resolver is not first_resolver and harness.resolver.started
    harness.core.close()


def test_idle_timer_does_not_fire_while_rpcs_are_active_or_recent():
    harness = Harness(options=[("grpc.client_idle_timeout_ms", 1000)])
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    rpc = new_rpc(harness.core, "/svc/M", None, None, False)
    harness.advance(3.0)
    assert not harness.core.idle  # an RPC in flight
    rpc.finish(Status(grpc.StatusCode.OK))
    harness.advance(0.9)
    new_rpc(harness.core, "/svc/M", None, None, False).finish(Status(grpc.StatusCode.OK))
    harness.advance(1.0)
    assert not harness.core.idle  # a recent RPC
    harness.advance(2.1)
    assert harness.core.idle
    harness.core.close()


def test_idle_comes_a_full_timeout_after_the_last_rpc_ended_never_before():
    """C-core's idle filter, grpc-go's idleness manager ("the time the most
    recent RPC completed") and grpc-java (ManagedChannelImplIdlenessTest: the
    timer restarts when the in-use count drops to zero) go idle one full
    timeout after the last RPC ended.  pyxds looked once per timeout from
    when it left idle, so an RPC running across a look made it idle soon
    after the RPC ended (0.1 s after, here; live with C-core in
    tests/e2e/test_differential_keepalive_idle.py)."""
    harness = Harness(options=[("grpc.client_idle_timeout_ms", 1000)])
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    rpc = new_rpc(harness.core, "/svc/M", None, None, False)
    harness.advance(1.9)
    rpc.finish(Status(grpc.StatusCode.OK))  # ends at 1.9
    harness.advance(0.95)
    assert not harness.core.idle  # 0.95 s after the last RPC ended
    harness.advance(0.3)
    assert harness.core.idle  # by 1.25 timeouts after it
    harness.core.close()


def test_a_channel_left_idle_without_rpcs_goes_idle_after_one_timeout():
    """subscribe(try_to_connect=True) leaves idle with no RPC: one full
    timeout later the channel is idle again (C-core's idle filter starts its
    timer when the channel leaves idle)."""
    harness = Harness(options=[("grpc.client_idle_timeout_ms", 1000)])
    harness.core.exit_idle()
    assert not harness.core.idle
    harness.advance(0.9)
    assert not harness.core.idle
    harness.advance(0.15)
    assert harness.core.idle
    harness.core.close()


def idle_with_its_old_policy() -> tuple[Harness, Any]:
    """A channel gone idle (1 s timeout) and the policy it shut down."""
    harness = Harness(options=[("grpc.client_idle_timeout_ms", 1000)])
    harness.start()
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector())
    old = harness.policy
    harness.advance(2.1)
    assert harness.core.idle
    return harness, old


def test_stale_policy_cannot_publish_after_idle():
    harness, old = idle_with_its_old_policy()
    harness.core.serializer.run(
        lambda: old.helper.update_state(
            ConnectivityState.READY, Status(grpc.StatusCode.OK), QueuePicker()
        )
    )
    assert harness.core.state is ConnectivityState.IDLE
    harness.core.close()


def test_a_policy_shut_down_by_idleness_cannot_open_connections():
    """grpc-java ManagedChannelImplIdlenessTest
    loadBalancerShouldNotCreateConnectionsWhenIdle; C-core's control helper
    gives no subchannel once the channel dropped its resolver (idle or
    shutting down): a policy the channel shut down that still asks for a
    subchannel gets one already shut down, which never connects and holds
    no connection of the channel."""
    harness, old = idle_with_its_old_policy()
    box = {}
    harness.core.serializer.run(
        lambda: box.setdefault("sub", old.helper.create_subchannel("10.0.0.9:80", {}))
    )
    sub = box["sub"]
    harness.core.serializer.run(sub.connect)
    assert sub.state is ConnectivityState.SHUTDOWN
    assert [t.address for t in harness.transports.made if t.address == "10.0.0.9:80"] == []
    assert harness.core.pool.cores() == []
    harness.core.close()


def test_resolver_error_without_policy_fails_fast_rpcs_with_its_reason():
    harness = Harness()
    harness.start()
    error = Status(UNAVAILABLE, "xDS: listener svc does not exist")
    from pyxds.resolver.api import ResolverResult

    harness.resolver.push(ResolverResult(endpoints=error))
    rpc = new_rpc(harness.core, "/svc/M", None, 5.0, False)
    assert pick_blocking(rpc) == error
    assert harness.core.state is ConnectivityState.TRANSIENT_FAILURE
    harness.core.close()


def test_channel_default_policy_comes_from_channel_options():
    harness = Harness(options=[("grpc.lb_policy_name", "channel_test_driven")])
    harness.start()
    from pyxds.resolver.api import ResolverResult

    harness.resolver.push(ResolverResult(endpoints=[Endpoint(("10.0.0.1:80",))]))
    assert harness.core.lb.policy_name == "channel_test_driven"
    harness.core.close()


def test_config_dump_walks_lb_tree_and_lists_subchannels(h):
    ready_subchannel(h)
    dump = config_dump(h.core)
    assert dump["lb_policy"]["policy"] == "channel_test_driven"
    assert dump["subchannels"]["10.0.0.1:80"]["state"] == "READY"
    assert dump["state"] in ("CONNECTING", "READY")


class ByCluster(Picker):
    """Completes for cluster "new", fails for any other (a deleted cluster)."""

    def __init__(self, sub):
        self.sub = sub

    def pick(self, args):
        if args.call_attributes.get("cluster") == "new":
            return PickComplete(self.sub)
        return PickFail(Status(UNAVAILABLE, "CDS resource old does not exist"))


def routed_to_old(h, committed):
    h.resolve(
        [Endpoint(("10.0.0.1:80",))],
        Selector(
            CallConfig(call_attributes={"cluster": "old"}, on_committed=lambda: committed.append(1))
        ),
    )
    h.publish(QueuePicker())
    rpc = new_rpc(h.core, "/svc/M", None, 5.0, False)
    assert rpc.pick() is None
    assert rpc.call_config.call_attributes["cluster"] == "old"
    return rpc


def test_rpc_whose_cluster_fails_while_a_route_switch_is_applied_is_rerouted_not_failed(h):
    committed = []
    rpc = routed_to_old(h, committed)
    sub = ready_subchannel(h)
    mid_update = []

    def on_update(update):
        # the LB tree already fails the old cluster; the new selector is not
        # published yet (A31 order): an RPC picking now must not fail
        h.policy.helper.update_state(
            ConnectivityState.READY, Status(grpc.StatusCode.OK), ByCluster(sub)
        )
        mid_update.append(rpc.pick())

    h.policy.on_update = on_update
    h.resolve(
        [Endpoint(("10.0.0.1:80",))], Selector(CallConfig(call_attributes={"cluster": "new"}))
    )
    assert mid_update == [None]
    assert isinstance(rpc.pick(), Transport)
    assert rpc.call_config.call_attributes["cluster"] == "new"
    assert committed == [1]  # the old route's cluster reference is released once
    rpc.finish(Status(grpc.StatusCode.OK))
    assert committed == [1]


def test_rpc_routed_by_a_replaced_selector_is_rerouted_when_its_pick_fails(h):
    committed = []
    rpc = routed_to_old(h, committed)
    sub = ready_subchannel(h)
    h.resolve(
        [Endpoint(("10.0.0.1:80",))], Selector(CallConfig(call_attributes={"cluster": "new"}))
    )
    h.publish(ByCluster(sub))
    assert isinstance(rpc.pick(), Transport)
    assert committed == [1]


def test_failing_pick_under_the_current_selector_fails_without_rerouting(h):
    committed = []
    rpc = routed_to_old(h, committed)
    h.publish(ByCluster(ready_subchannel(h)))
    outcome = rpc.pick()
    assert outcome == Status(UNAVAILABLE, "CDS resource old does not exist")
    # not released for a reroute: committed once, as the RPC ends with it
    assert rpc._reselects == 0 and rpc.done and committed == [1]


def _aio_repick_after_lost_attempt(h, publish_newer=None):
    """An aio RPC's attempt never left the client; returns (the transport
    its next pick chose, seconds that took)."""
    import asyncio

    from pyxds.channel.aio import pick as aio_pick
    from pyxds.status import Status as ChannelStatus

    rpc = new_rpc(h.core, "/svc/M", None, WAIT, False, blocking=False)
    first = rpc.pick()
    assert isinstance(first, Transport)
    first.call_finished()
    lost = ChannelStatus(UNAVAILABLE, "failed to connect to all addresses; last error: x")
    # Timed from the loss: the grace runs from there, and a loaded machine
    # may take a while to start the event loop below.
    started = time.monotonic()
    assert rpc.ended(object(), lost, lambda call: ((), ())) == 0.0

    async def go():
        if publish_newer is not None:
            asyncio.get_running_loop().call_later(0.01, publish_newer)
        transport = await asyncio.wait_for(aio_pick(rpc), WAIT)
        return transport, time.monotonic() - started

    return asyncio.run(go())


def test_aio_pick_after_a_lost_attempt_asks_the_same_picker_again_after_the_grace(h, monkeypatch):
    monkeypatch.setattr(rpc_module, "STALE_PICKER_GRACE", 0.05)
    sub = ready_subchannel(h, "10.0.0.1:80")
    picker = CountingPicker(PickComplete(sub))
    h.publish(picker)
    transport, took = _aio_repick_after_lost_attempt(h)
    assert transport is h.transports.last("10.0.0.1:80")
    assert picker.calls == 2 and took >= 0.04


def test_aio_pick_after_a_lost_attempt_takes_a_newer_picker_at_once(h, monkeypatch):
    monkeypatch.setattr(rpc_module, "STALE_PICKER_GRACE", WAIT)
    dead = ready_subchannel(h, "10.0.0.1:80")
    live = ready_subchannel(h, "10.0.0.2:80")
    stale = CountingPicker(PickComplete(dead))
    h.publish(stale)
    transport, took = _aio_repick_after_lost_attempt(
        h, lambda: h.publish(CountingPicker(PickComplete(live)))
    )
    assert transport is h.transports.last("10.0.0.2:80")
    assert stale.calls == 1 and took < WAIT / 2


def _aio_queued_then_published(h, publish_from_thread: bool) -> tuple[Any, list[Any], int]:
    """A queued aio pick, then a ready picker published on the pick's own
    loop or from another thread: (what the pick returned, the loop's
    ``call_soon_threadsafe`` callbacks meanwhile, tasks alive while queued)."""
    import asyncio

    from pyxds.channel.aio import pick as aio_pick

    queue = CountingPicker(PickQueue())
    h.publish(queue)
    sub = ready_subchannel(h)

    async def go() -> tuple[Any, list[Any], int]:
        loop = asyncio.get_running_loop()
        wakes: list[Any] = []
        plain = loop.call_soon_threadsafe

        def counted(*args: Any) -> Any:
            wakes.append(args[0])
            return plain(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        rpc = new_rpc(h.core, "/svc/M", None, WAIT, False, blocking=False)
        picking = asyncio.ensure_future(aio_pick(rpc))
        for _ in range(1000):
            if queue.calls:
                break
            await asyncio.sleep(0)
        assert queue.calls == 1, "queued"
        tasks = len(asyncio.all_tasks())
        ready = CountingPicker(PickComplete(sub))
        if publish_from_thread:
            thread, _ = run_in_thread(lambda: h.publish(ready))
        else:
            h.publish(ready)  # the serializer runs here, on the loop
        picked = await asyncio.wait_for(picking, WAIT)
        if publish_from_thread:
            thread.join(WAIT)
        return picked, wakes, tasks

    return asyncio.run(go())


def test_a_queued_aio_pick_resumes_on_a_publication_from_its_loop_without_a_wakeup_write(h):
    """A queued ``pyxds.aio`` pick waits on a plain future, no task or
    ``asyncio.Event`` of its own: a picker published on its own loop (a
    subchannel's report runs the serializer there) answers it at once,
    without the self-pipe write of ``call_soon_threadsafe``; one published
    from another thread wakes the loop once."""
    transport, wakes, tasks = _aio_queued_then_published(h, publish_from_thread=False)
    assert isinstance(transport, Transport)
    assert wakes == []
    assert tasks == 2, "the test's and the pick's"
    transport, wakes, tasks = _aio_queued_then_published(h, publish_from_thread=True)
    assert isinstance(transport, Transport)
    assert [getattr(w, "__name__", w) for w in wakes] == ["_answer"]
    assert tasks == 2
