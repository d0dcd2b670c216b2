"""SubchannelCore / pool over a fake transport (no sockets): the Subchannel
contract of ARCHITECTURE.md mapped onto grpcio's connectivity."""

from __future__ import annotations

import random

import grpc
import pytest
from test_channel_support import TransportFactory

from pyxds.channel.subchannel import core_of, grpcio_target, subchannel_options
from pyxds.channel.subchannel_pool import SubchannelPool
from pyxds.lb.api import ConnectivityState as CS
from pyxds.serializer import WorkSerializer
from pyxds.testing import FakeClock

GC = grpc.ChannelConnectivity


def make_pool(options=None):
    clock = FakeClock()
    transports = TransportFactory()
    pool = SubchannelPool(transports, WorkSerializer(), clock, random.Random(1), options=options)
    return pool, transports, clock


def watch(subchannel):
    seen = []
    subchannel.watch_state(lambda state, status: seen.append((state, status)))
    return seen


def states(seen):
    return [s for s, _ in seen]


def test_new_subchannel_is_idle_and_connects_only_on_demand():
    pool, transports, _ = make_pool()
    sub = pool.create("10.0.0.1:80", {})
    seen = watch(sub)
    assert states(seen) == [CS.IDLE]
    assert transports.made == []
    sub.connect()
    assert len(transports.made) == 1
    assert transports.made[0].connects == 1
    assert states(seen) == [CS.IDLE, CS.CONNECTING]


def test_the_connection_is_asked_for_before_connecting_reaches_the_watchers():
    """C-core's connect starts before CONNECTING goes up the LB tree (the
    watchers' Python runs while the connection is being made)."""
    pool, transports, _ = make_pool()
    sub = pool.create("10.0.0.1:80", {})
    connects_seen = []
    sub.watch_state(
        lambda state, status: (
            connects_seen.append((state, transports.made[-1].connects))
            if state is CS.CONNECTING
            else None
        )
    )
    sub.connect()
    assert connects_seen == [(CS.CONNECTING, 1)]


def test_a_report_applied_during_the_connect_request_is_not_overwritten_by_connecting():
    """Off the serializer, a transport may report READY while connect() runs:
    the core stays READY (no CONNECTING after it)."""
    transports = TransportFactory()

    def make(address, credentials, on_state):
        transport = transports(address, credentials, on_state)
        ask = transport.connect

        def connect_and_report():
            ask()
            transport.report(GC.READY)

        transport.connect = connect_and_report
        return transport

    pool = SubchannelPool(make, WorkSerializer(), FakeClock(), random.Random(1))
    sub = pool.create("10.0.0.1:80", {})
    seen = watch(sub)
    sub.connect()
    assert states(seen) == [CS.IDLE, CS.READY]
    assert sub.state is CS.READY


def test_grpcio_initial_idle_report_after_connect_is_not_a_state_change():
    pool, transports, _ = make_pool()
    sub = pool.create("a:1", {})
    seen = watch(sub)
    sub.connect()
    transports.made[0].report(GC.IDLE)  # grpcio's first poll, before CONNECTING
    transports.made[0].report(GC.CONNECTING)
    transports.made[0].report(GC.READY)
    assert states(seen) == [CS.IDLE, CS.CONNECTING, CS.READY]


def test_transient_failure_backs_off_then_reports_idle_and_reconnects_on_fresh_transport():
    pool, transports, clock = make_pool()
    sub = pool.create("a:1", {})
    seen = watch(sub)
    sub.connect()
    first = transports.made[0]
    first.report(GC.TRANSIENT_FAILURE)
    assert states(seen)[-1] is CS.TRANSIENT_FAILURE
    status = seen[-1][1]
    assert status.code is grpc.StatusCode.UNAVAILABLE
    assert status.details == "failed to connect to a:1"
    assert first.closed_now  # grpcio must not retry on its own
    sub.connect()  # during backoff: nothing happens
    assert len(transports.made) == 1
    clock.advance(0.79)
    assert states(seen)[-1] is CS.TRANSIENT_FAILURE  # 1 s +-20 %: not before 0.8 s
    clock.advance(0.42)
    assert states(seen)[-1] is CS.IDLE
    sub.connect()
    assert len(transports.made) == 2
    assert states(seen)[-1] is CS.CONNECTING


def test_backoff_grows_by_1_6_and_resets_after_ready():
    pool, transports, clock = make_pool()
    sub = pool.create("a:1", {})
    seen = watch(sub)
    delays = []
    for _ in range(3):
        sub.connect()
        transports.made[-1].report(GC.CONNECTING)
        transports.made[-1].report(GC.TRANSIENT_FAILURE)
        start = clock.now()
        while states(seen)[-1] is not CS.IDLE:
            clock.advance(0.01)
        delays.append(clock.now() - start)
    assert 0.8 <= delays[0] <= 1.21
    assert 1.6 * 0.8 <= delays[1] <= 1.6 * 1.21
    assert 2.56 * 0.8 <= delays[2] <= 2.56 * 1.21
    sub.connect()
    transports.made[-1].report(GC.READY)
    transports.made[-1].report(GC.IDLE)  # connection lost
    sub.connect()
    transports.made[-1].report(GC.TRANSIENT_FAILURE)
    start = clock.now()
    while states(seen)[-1] is not CS.IDLE:
        clock.advance(0.01)
    assert clock.now() - start <= 1.21


def test_backoff_is_measured_from_the_start_of_the_failed_attempt():
    """C-core Subchannel (and doc/connection-backoff.md's ConnectWithBackoff):
    the next attempt is due one backoff delay after the previous attempt
    *started*, so time spent connecting counts against the backoff."""
    pool, transports, clock = make_pool()
    sub = pool.create("a:1", {})
    seen = watch(sub)
    sub.connect()
    transports.made[0].report(GC.CONNECTING)
    clock.advance(0.7)  # the attempt takes 0.7 s, then fails
    transports.made[0].report(GC.TRANSIENT_FAILURE)
    assert states(seen)[-1] is CS.TRANSIENT_FAILURE
    clock.advance(0.51)  # 1.21 s after the attempt started: the 1 s +-20 % delay is over
    assert states(seen)[-1] is CS.IDLE
    # An attempt that outlasts its backoff delay is followed at once (after
    # reporting TRANSIENT_FAILURE) by IDLE, ready to reconnect.
    sub.connect()
    transports.made[-1].report(GC.CONNECTING)
    clock.advance(5.0)
    transports.made[-1].report(GC.TRANSIENT_FAILURE)
    assert states(seen)[-1] is CS.TRANSIENT_FAILURE
    clock.advance(0)
    assert states(seen)[-2:] == [CS.TRANSIENT_FAILURE, CS.IDLE]


def test_backoff_honours_grpcio_reconnect_options():
    pool, transports, clock = make_pool([("grpc.initial_reconnect_backoff_ms", 100)])
    sub = pool.create("a:1", {})
    seen = watch(sub)
    sub.connect()
    transports.made[-1].report(GC.TRANSIENT_FAILURE)
    clock.advance(0.125)
    assert states(seen)[-1] is CS.IDLE


def test_ready_connection_lost_is_idle_not_failure_and_reconnects_same_transport():
    pool, transports, _ = make_pool()
    sub = pool.create("a:1", {})
    seen = watch(sub)
    sub.connect()
    t = transports.made[0]
    t.report(GC.CONNECTING)
    t.report(GC.READY)
    t.report(GC.IDLE)  # GOAWAY / max connection age
    assert states(seen)[-2:] == [CS.READY, CS.IDLE]
    assert seen[-1][1].ok
    sub.connect()
    assert len(transports.made) == 1 and t.connects == 2


def test_reset_backoff_ends_backoff_at_once():
    pool, transports, _ = make_pool()
    sub = pool.create("a:1", {})
    seen = watch(sub)
    sub.connect()
    transports.made[0].report(GC.TRANSIENT_FAILURE)
    sub.reset_backoff()
    assert states(seen)[-1] is CS.IDLE


def test_retired_transport_reports_are_ignored():
    pool, transports, clock = make_pool()
    sub = pool.create("a:1", {})
    seen = watch(sub)
    sub.connect()
    old = transports.made[0]
    old.report(GC.TRANSIENT_FAILURE)
    clock.advance(2)
    sub.connect()
    old.report(GC.READY)  # late report from the retired channel
    assert states(seen)[-1] is CS.CONNECTING


def test_same_address_is_shared_and_closed_with_the_last_handle():
    pool, transports, _ = make_pool()
    one = pool.create("a:1", {})
    two = pool.create("a:1", {})
    assert core_of(one) is core_of(two)
    one.connect()
    transports.made[0].report(GC.READY)
    seen_two = watch(two)
    assert states(seen_two) == [CS.READY]
    one.shutdown()
    assert not transports.made[0].closed_now
    two.shutdown()
    assert transports.made[0].closed_now
    three = pool.create("a:1", {})
    assert core_of(three) is not core_of(one)


def test_shutdown_handle_stops_its_watchers_only():
    pool, transports, _ = make_pool()
    one = pool.create("a:1", {})
    two = pool.create("a:1", {})
    seen_one, seen_two = watch(one), watch(two)
    one.shutdown()
    two.connect()
    transports.made[0].report(GC.READY)
    assert states(seen_one) == [CS.IDLE]
    assert states(seen_two)[-1] is CS.READY


def test_released_subchannel_closes_only_after_its_rpcs_finish():
    pool, transports, _ = make_pool()
    sub = pool.create("a:1", {})
    sub.connect()
    t = transports.made[0]
    t.report(GC.READY)
    assert t.call_started()
    sub.shutdown()
    assert not t.closed_now  # an RPC still runs on it
    t.call_finished()
    assert t.closed_now
    assert not t.call_started()


def test_pool_close_cancels_everything_at_once():
    pool, transports, _ = make_pool()
    sub = pool.create("a:1", {})
    sub.connect()
    t = transports.made[0]
    t.call_started()
    pool.close()
    assert t.closed_now


def test_subchannel_options_disable_grpcio_balancing_retries_and_idleness():
    opts = dict(
        subchannel_options(
            [
                ("grpc.lb_policy_name", "round_robin"),
                ("grpc.enable_retries", 1),
                ("grpc.keepalive_time_ms", 10000),
            ]
        )
    )
    assert opts["grpc.lb_policy_name"] == "pick_first"
    assert opts["grpc.enable_retries"] == 0
    assert opts["grpc.use_local_subchannel_pool"] == 1
    assert opts["grpc.client_idle_timeout_ms"] >= 2**31 - 1
    assert opts["grpc.keepalive_time_ms"] == 10000  # user's keepalive passes through
    assert opts["grpc.min_reconnect_backoff_ms"] == 20000
    assert opts["grpc.enable_channelz"] == 0  # not one of the application's channels


@pytest.mark.parametrize(
    ("target", "app", "expected"),
    [
        ("xds:///echo-service", [], "echo-service"),
        ("dns:///localhost:50051", [], "localhost:50051"),
        ("localhost:50051", [], "localhost:50051"),
        ("ipv4:127.0.0.1:1,127.0.0.1:2", [], "127.0.0.1:1,127.0.0.1:2"),
        ("xds:///echo-service", [("grpc.default_authority", "svc")], "svc"),
        # C-core: the TLS override is the authority when none is given
        ("xds:///echo-service", [("grpc.ssl_target_name_override", "o")], None),
        ("unix:/tmp/sock", [], None),
        # pyxds's own list scheme: each subchannel keeps its address
        ("static:///127.0.0.1:1,127.0.0.1:2", [], None),
    ],
)
def test_subchannels_carry_the_channels_authority_as_c_core(target, app, expected):
    """C-core's subchannels take the channel's default authority (the
    target's path, client_channel.cc), so RPCs never carry the endpoint's
    address as ``:authority`` (tests/e2e/test_differential_channel_options.py
    compares live)."""
    from pyxds.channel.core import subchannel_authority

    opts = dict(subchannel_options(app, subchannel_authority(target)))
    assert opts.get("grpc.default_authority") == dict(app).get("grpc.default_authority", expected)


def test_subchannel_options_keep_channelz_when_the_application_asks_for_it():
    opts = dict(subchannel_options([("grpc.enable_channelz", 1)]))
    assert opts["grpc.enable_channelz"] == 1


def test_core_of_unwraps_policy_wrappers():
    pool, _, _ = make_pool()
    sub = pool.create("a:1", {})

    class Wrapper:
        def __init__(self, inner):
            self.delegate = inner

    assert core_of(Wrapper(Wrapper(sub))) is core_of(sub)
    assert core_of(object()) is None


def test_each_failed_attempt_reports_the_same_failure_and_a_new_cause_anew():
    """Every failed attempt goes TRANSIENT_FAILURE then, after its backoff,
    IDLE; an attempt failing as the last one did reports an equal status (the
    same immutable object: issue 18, one Status per failed attempt lived
    through its backoff, into the oldest GC generation); a failure with
    another cause (the transport's failure detail) reports its own text."""
    pool, transports, clock = make_pool()
    sub = pool.create("a:1", {})
    seen = watch(sub)
    failures = []
    detail = [None]
    core_of(sub).failure_detail = lambda: detail[0]
    for attempt in range(4):
        if attempt == 3:
            detail[0] = "certificate expired"
        sub.connect()
        transports.made[-1].report(GC.TRANSIENT_FAILURE)
        failures.append(seen[-1])
        clock.advance(130)  # past any backoff: IDLE again
        assert states(seen)[-1] is CS.IDLE
    assert [s for s, _ in failures] == [CS.TRANSIENT_FAILURE] * 4
    statuses = [status for _, status in failures]
    assert [s.details for s in statuses] == ["failed to connect to a:1"] * 3 + [
        "failed to connect to a:1: certificate expired"
    ]
    assert statuses[0] is statuses[1] is statuses[2]
    assert all(s.code is grpc.StatusCode.UNAVAILABLE for s in statuses)
    assert states(seen) == [CS.IDLE] + [CS.CONNECTING, CS.TRANSIENT_FAILURE, CS.IDLE] * 4


def test_an_ip_literal_address_goes_to_grpcio_as_an_ipv4_or_ipv6_target():
    """C-core's ipv4:/ipv6: resolver, not its dns one, for what EDS gives
    (same one address and default authority, less C-core work per channel)."""
    options = subchannel_options(None)
    assert grpcio_target("127.0.0.1:50051", options) == "ipv4:127.0.0.1:50051"
    assert grpcio_target("10.1.2.3:1", options) == "ipv4:10.1.2.3:1"
    assert grpcio_target("[::1]:443", options) == "ipv6:[::1]:443"
    assert grpcio_target("[2001:db8::5]:65535", options) == "ipv6:[2001:db8::5]:65535"
    assert grpcio_target("[::ffff:10.0.0.1]:80", options) == "ipv6:[::ffff:10.0.0.1]:80"


def test_anything_but_an_ip_literal_with_a_port_keeps_its_plain_target():
    options = subchannel_options(None)
    for address in (
        "localhost:50051",  # a host name: C-core's dns resolver, as before
        "backend.example:80",
        "127.0.0.1",  # no port (dns's default port)
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:\uff18\uff10",  # not ASCII digits (fullwidth 80)
        "127.0.0.1:+80",
        "127.0.0.01:80",  # not a literal inet_pton takes
        "127.1:80",
        "::1:80",  # IPv6 without brackets
        "[fe80::1%eth0]:80",  # a zone
        "[127.0.0.1]:80",
        "[::1]",
        "unix:/tmp/socket",
        "ipv4:127.0.0.1:80",  # a target already
        "",
    ):
        assert grpcio_target(address, options) == address, address


def test_with_grpcio_channelz_on_subchannel_channels_keep_the_plain_target():
    """grpcio's channelz lists each channel's target: unchanged when the
    application turns channelz on (grpcio's default when no option says)."""
    on = subchannel_options([("grpc.enable_channelz", 1)])
    assert grpcio_target("127.0.0.1:50051", on) == "127.0.0.1:50051"
    assert grpcio_target("127.0.0.1:50051", ()) == "127.0.0.1:50051"
    off = subchannel_options([("grpc.enable_channelz", 0)])
    assert grpcio_target("127.0.0.1:50051", off) == "ipv4:127.0.0.1:50051"


def test_a_core_keeps_one_watcher_without_a_list_and_several_in_order():
    """lb/unwatch.py ``Watched`` on the shared core (issue 18: no list per
    endpoint): one watcher in its slot; with several, each report reaches
    them in the order they watched, a raising one included; a handle's
    shutdown removes only its own."""
    pool, transports, _ = make_pool()
    one = pool.create("a:1", {})
    seen_one = watch(one)
    core = core_of(one)
    assert core is not None and callable(core._watchers) and not isinstance(core._watchers, list)
    order = []

    def raising(state, status):
        order.append("raising")
        if state is not CS.IDLE:
            raise RuntimeError("a watcher's bug")

    two = pool.create("a:1", {})
    two.watch_state(raising)
    two.watch_state(lambda state, status: order.append("after"))
    one.connect()
    assert order == ["raising", "after", "raising", "after"]  # at watch, then CONNECTING
    two.shutdown()
    transports.made[0].report(GC.READY)
    assert order == ["raising", "after", "raising", "after"]
    assert states(seen_one) == [CS.IDLE, CS.CONNECTING, CS.READY]
    one.shutdown()
    assert core._watchers is None


def test_a_handle_shutdown_undoes_each_of_its_watches():
    """One watch (kept without a list) or several: shutdown() removes each."""
    pool, transports, _ = make_pool()
    single, several, other = (pool.create("a:1", {}) for _ in range(3))
    seen_single = watch(single)
    seen_several = [watch(several) for _ in range(3)]
    seen_other = watch(other)
    single.shutdown()
    several.connect()
    several.shutdown()
    transports.made[0].report(GC.READY)
    assert states(seen_single) == [CS.IDLE]
    assert all(states(seen) == [CS.IDLE, CS.CONNECTING] for seen in seen_several)
    assert states(seen_other)[-1] is CS.READY
