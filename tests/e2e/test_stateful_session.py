"""Stateful session affinity (gRFC A55, A60, A75's override-host rules)
through pyxds and, side by side, grpcio's C-core ``xds:///`` channel: the
same pyxds.server config (a listener with the
``envoy.extensions.filters.http.stateful_session.v3.StatefulSession``
filter, as Istio and Traffic Director send it), the same grpcio backends on
127.0.0.1.

What both clients must do alike: the first response of a session carries
``set-cookie`` in C-core's exact format; every RPC carrying that cookie
lands on the same endpoint (and, with a weighted split, the same cluster);
a cookie set by one client works in the other; a DRAINING endpoint keeps
its sessions only when the cluster's override_host_status lets it, and gets
no new ones; a gone endpoint or a bad cookie is a normal pick with a new
cookie; a per-route override disables or renames the cookie.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Collection

import grpc
import pytest
from channel_fixtures import (
    SERVICE,
    TARGET,
    Backend,
    CoreXdsClient,
    running_backends,
    until_answered,
    wait_until,
)

import pyxds._api as pyxds
import pyxds.aio
from pyxds.server import ManagementServer
from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

COOKIE = "global-session-cookie"
PATH = f"/{SERVICE}"
WHO = f"/{SERVICE}/Who"
FAIL = f"/{SERVICE}/Fail"
SET_COOKIE = re.compile(rf"^{COOKIE}=([A-Za-z0-9+/]+=*); HttpOnly; Path={PATH}; Max-Age=120$")


@pytest.fixture(scope="module")
def backends():
    yield from running_backends("b0", "b1", "b2", "d0", "d1")


@pytest.fixture
def server():
    srv = ManagementServer().start()
    yield srv
    srv.stop()


def snapshot(
    backends,
    version: str,
    *,
    routes=None,
    health: dict[str, str] | None = None,
    statuses=None,
    c1=("b0", "b1", "b2"),
    filter_kwargs=None,
) -> Snapshot:
    health = health or {}
    kwargs = {"cookie_name": COOKIE, "path": PATH, "ttl": 120, **(filter_kwargs or {})}
    routes = routes or [b.route(prefix="", cluster="c1")]
    return Snapshot(
        listeners=[b.listener("echo-service", http_filters=[b.stateful_session_filter(**kwargs)])],
        routes=[b.route_config("echo-service-route", [b.virtual_host("vh", routes=routes)])],
        clusters=[
            b.cluster("c1", override_host_status=statuses),
            b.cluster("c2", override_host_status=statuses),
        ],
        endpoints=[
            b.endpoints(
                "c1",
                [
                    b.locality(
                        zone="z1",
                        endpoints=[
                            b.endpoint(backends[n].address, health_status=health.get(n, "UNKNOWN"))
                            for n in c1
                        ],
                    )
                ],
            ),
            b.endpoints(
                "c2",
                [b.locality(zone="z2", endpoints=[backends["d0"].address, backends["d1"].address])],
            ),
        ],
        version=version,
    )


def pyxds_call(channel, metadata=None, method=WHO, request=""):
    """(reply or error:CODE, initial metadata, trailing metadata) of one
    pyxds call, as the application sees them."""
    mc = channel.unary_unary(method)
    try:
        reply, call = mc.with_call(
            request.encode(), timeout=5, metadata=metadata, wait_for_ready=True
        )
        return reply.decode(), list(call.initial_metadata()), list(call.trailing_metadata())
    except grpc.RpcError as err:
        return (
            "error:" + err.code().name,
            list(err.initial_metadata() or ()),
            list(err.trailing_metadata() or ()),
        )


def set_cookie(metadata) -> str | None:
    values = [v for k, v in metadata if k == "set-cookie"]
    assert len(values) <= 1, metadata
    return values[0] if values else None


def decoded(set_cookie_value: str) -> str:
    match = SET_COOKIE.match(set_cookie_value)
    assert match, f"not C-core's set-cookie format: {set_cookie_value!r}"
    return base64.b64decode(match.group(1)).decode()


def cookie_of(set_cookie_value: str) -> list[tuple[str, str]]:
    """The ``cookie`` metadata a client sends back for a set-cookie."""
    return [("cookie", set_cookie_value.split(";", 1)[0])]


def cookie_for(address: str, cluster: str = "c1") -> list[tuple[str, str]]:
    value = base64.b64encode(f"{address};{cluster}".encode()).decode()
    return [("cookie", f"{COOKIE}={value}")]


def address_of(backends, reply: str) -> str:
    return backends[reply].address


@pytest.fixture
def clients(server):
    """(pyxds channel, C-core client) on the server's current snapshot."""
    made = []

    def make(node: str, ready: Collection[str] = ()):
        """``ready``: backends each client calls (without a cookie) until
        they all answered, before the test's calls: round robin reaches an
        endpoint once it is READY, and they connect while the first RPCs go."""
        bootstrap = server.bootstrap(node_id=node)
        channel = pyxds.insecure_channel(TARGET, bootstrap=bootstrap)
        core = CoreXdsClient(bootstrap)
        made.append((channel, core))
        warm = (lambda: [pyxds_call(channel)[0]], lambda: [core.call_md(WHO)[0]])
        for call in warm if ready else ():
            seen = set(until_answered(call, ready))
            assert seen >= set(ready), (node, seen)
        return channel, core

    yield make
    for channel, core in made:
        channel.close()
        core.close()


def both(channel, core, metadata=None, method=WHO):
    return pyxds_call(channel, metadata, method), core.call_md(method, metadata)


# -- the cookie and the pin ---------------------------------------------------------------


def test_the_first_response_sets_c_core_s_cookie_and_the_cookie_pins_the_endpoint(
    server, backends, clients
):
    server.set_snapshot(snapshot(backends, "v1"))
    channel, core = clients("ssa-format")
    for client, name in (
        (lambda md=None: pyxds_call(channel, md), "pyxds"),
        (core.call_md, "core"),
    ):
        reply, initial, trailing = client() if name == "pyxds" else client(WHO, None)
        value = set_cookie(initial)
        assert value is not None, (name, initial, trailing)
        assert decoded(value) == f"{address_of(backends, reply)};c1", name
        for _ in range(8):
            again = client(cookie_of(value)) if name == "pyxds" else client(WHO, cookie_of(value))
            assert again[0] == reply, name
            assert set_cookie(again[1]) is None, name  # same endpoint, same cluster: no new cookie


def test_a_cookie_set_by_one_client_pins_the_other_to_the_same_endpoint(server, backends, clients):
    server.set_snapshot(snapshot(backends, "v1"))
    channel, core = clients("ssa-cross")
    core_reply, core_initial, _ = core.call_md(WHO)
    py_reply, py_initial, _ = pyxds_call(channel)
    core_cookie, py_cookie = set_cookie(core_initial), set_cookie(py_initial)
    assert core_cookie and py_cookie
    for _ in range(6):
        assert pyxds_call(channel, cookie_of(core_cookie))[0] == core_reply
        assert core.call_md(WHO, cookie_of(py_cookie))[0] == py_reply
    # every endpoint, both ways: the same cookie, the same backend
    for name in ("b0", "b1", "b2"):
        md = cookie_for(backends[name].address)
        (ours, our_initial, _), (theirs, their_initial, _) = both(channel, core, md)
        assert ours == theirs == name
        assert set_cookie(our_initial) is None and set_cookie(their_initial) is None


@pytest.mark.parametrize(
    "bad",
    [
        [("cookie", f"{COOKIE}=!!!not-base64")],
        [("cookie", f"{COOKIE}=" + base64.b64encode(b"10.9.9.9:1;c1").decode())],  # not ours
        [("cookie", f"{COOKIE}=" + base64.b64encode(b"garbage").decode())],
        [("cookie", f"{COOKIE}=" + "QUJD" * 1300)],  # long (5200 characters), no address
        [("cookie", "other-cookie=abc")],
        # two cookie entries are read as one header: no longer base64 (C-core)
        [("cookie", f"{COOKIE}=" + base64.b64encode(b"x;c1").decode()), ("cookie", "a=b")],
    ],
)
def test_a_bad_cookie_is_a_normal_pick_with_a_new_cookie_in_both(server, backends, clients, bad):
    server.set_snapshot(snapshot(backends, "v1"))
    channel, core = clients("ssa-bad")
    (ours, our_initial, _), (theirs, their_initial, _) = both(channel, core, bad)
    assert ours in backends and theirs in backends
    for reply, initial in ((ours, our_initial), (theirs, their_initial)):
        assert decoded(set_cookie(initial)) == f"{address_of(backends, reply)};c1"


def test_a_failed_rpc_carries_the_cookie_in_its_trailers_as_c_core(server, backends, clients):
    """A response without headers (the server fails the RPC at once) gets
    the cookie in its trailing metadata (C-core: trailers-only)."""
    server.set_snapshot(snapshot(backends, "v1"))
    channel, core = clients("ssa-fail")
    md = cookie_for(backends["b1"].address, cluster="")  # cluster changed: a new cookie
    for reply, initial, trailing in (
        pyxds_call(channel, md, FAIL, "PERMISSION_DENIED"),
        core.call_md(FAIL, md, request="PERMISSION_DENIED"),
    ):
        assert reply == "error:PERMISSION_DENIED"
        assert set_cookie(initial) is None
        assert decoded(set_cookie(trailing)) == f"{backends['b1'].address};c1"


# -- A60: weighted clusters -----------------------------------------------------------------


def test_a_weighted_split_keeps_the_session_on_its_cluster(server, backends, clients):
    routes = [b.route(prefix="", weighted_clusters={"c1": 50, "c2": 50})]
    server.set_snapshot(snapshot(backends, "v-split", routes=routes))
    channel, core = clients("ssa-split")
    for name in ("d1", "b2"):
        cluster = "c2" if name.startswith("d") else "c1"
        md = cookie_for(backends[name].address, cluster)
        for _ in range(10):
            (ours, our_initial, _), (theirs, their_initial, _) = both(channel, core, md)
            assert ours == theirs == name
            assert set_cookie(our_initial) is None and set_cookie(their_initial) is None
    # a first RPC's cookie names the cluster it was sent to
    seen = set()
    for _ in range(20):
        reply, initial, _ = pyxds_call(channel)
        seen.add(decoded(set_cookie(initial)).split(";")[1])
        assert decoded(set_cookie(initial)).split(";")[1] == ("c2" if reply[0] == "d" else "c1")
    assert seen == {"c1", "c2"}


# -- override host status (A55, A75) ---------------------------------------------------------


def _switched(channel, core, backends, gone: str) -> bool:
    """True once neither client sends a new session to ``gone``."""
    for _ in range(6):
        if pyxds_call(channel)[0] == gone or core.call_md(WHO)[0] == gone:
            return False
    return True


def test_a_draining_endpoint_keeps_its_sessions_and_gets_no_new_ones(server, backends, clients):
    statuses = ["UNKNOWN", "HEALTHY", "DRAINING"]
    server.set_snapshot(snapshot(backends, "v1", statuses=statuses))
    channel, core = clients("ssa-draining")
    pinned = cookie_for(backends["b1"].address)
    assert both(channel, core, pinned)[0][0] == "b1"
    server.set_snapshot(snapshot(backends, "v2", statuses=statuses, health={"b1": "DRAINING"}))
    assert wait_until(lambda: _switched(channel, core, backends, "b1"), timeout=10)
    for _ in range(5):
        (ours, our_initial, _), (theirs, their_initial, _) = both(channel, core, pinned)
        assert ours == theirs == "b1"
        assert set_cookie(our_initial) is None and set_cookie(their_initial) is None


def test_a_draining_endpoint_loses_its_sessions_under_the_default_statuses(
    server, backends, clients
):
    server.set_snapshot(snapshot(backends, "v1"))
    channel, core = clients("ssa-draining-default")
    pinned = cookie_for(backends["b1"].address)
    assert both(channel, core, pinned)[0][0] == "b1"
    server.set_snapshot(snapshot(backends, "v2", health={"b1": "DRAINING"}))
    assert wait_until(lambda: _switched(channel, core, backends, "b1"), timeout=10)
    (ours, our_initial, _), (theirs, their_initial, _) = both(channel, core, pinned)
    assert ours != "b1" and theirs != "b1"
    assert decoded(set_cookie(our_initial)) == f"{address_of(backends, ours)};c1"
    assert decoded(set_cookie(their_initial)) == f"{address_of(backends, theirs)};c1"


def test_an_endpoint_that_left_the_cluster_moves_its_sessions(server, backends, clients):
    server.set_snapshot(snapshot(backends, "v1"))
    channel, core = clients("ssa-gone")
    pinned = cookie_for(backends["b2"].address)
    assert both(channel, core, pinned)[0][0] == "b2"
    server.set_snapshot(snapshot(backends, "v2", c1=("b0", "b1")))
    assert wait_until(lambda: _switched(channel, core, backends, "b2"), timeout=10)
    for reply, initial, _ in both(channel, core, pinned):
        assert reply in ("b0", "b1")
        assert decoded(set_cookie(initial)) == f"{address_of(backends, reply)};c1"


# -- A39 overrides and the cookie path ---------------------------------------------------------


def test_per_route_overrides_disable_or_rename_the_cookie(server, backends, clients):
    routes = [
        b.route(
            path=f"/{SERVICE}/Meta",
            cluster="c1",
            typed_per_filter_config={
                "envoy.filters.http.stateful_session": b.stateful_session_per_route(disabled=True)
            },
        ),
        b.route(
            path=f"/{SERVICE}/Sleep",
            cluster="c1",
            typed_per_filter_config={
                "envoy.filters.http.stateful_session": b.stateful_session_per_route(
                    cookie_name="other", path="/"
                )
            },
        ),
        b.route(prefix="", cluster="c1"),
    ]
    server.set_snapshot(snapshot(backends, "v-routes", routes=routes))
    channel, core = clients("ssa-routes")
    (_, our_initial, _), (_, their_initial, _) = both(channel, core, method=f"/{SERVICE}/Meta")
    assert set_cookie(our_initial) is None and set_cookie(their_initial) is None
    (ours, our_initial, _), (theirs, their_initial, _) = both(
        channel, core, method=f"/{SERVICE}/Sleep"
    )
    for reply, initial in ((ours, our_initial), (theirs, their_initial)):
        value = set_cookie(initial)
        assert value.startswith("other=") and value.endswith("; HttpOnly; Path=/")
        assert base64.b64decode(value.split("=", 1)[1].split(";")[0]).decode() == (
            f"{address_of(backends, reply)};c1"
        )


def test_an_rpc_outside_the_cookie_path_gets_no_cookie(server, backends, clients):
    server.set_snapshot(snapshot(backends, "v-path", filter_kwargs={"path": "/other.Service"}))
    channel, core = clients("ssa-path")
    (_, our_initial, _), (_, their_initial, _) = both(channel, core)
    assert set_cookie(our_initial) is None and set_cookie(their_initial) is None


# -- every call kind, sync and aio (pyxds) -------------------------------------------------------


def test_every_sync_call_kind_sees_the_cookie_and_is_pinned(server, backends):
    server.set_snapshot(snapshot(backends, "v1"))
    channel = pyxds.insecure_channel(TARGET, bootstrap=server.bootstrap(node_id="ssa-kinds"))
    try:
        md = cookie_for(backends["b2"].address, cluster="")  # cluster part missing: re-set
        future = channel.unary_unary(WHO).future(b"", metadata=md, timeout=5, wait_for_ready=True)
        assert future.result() == b"b2"
        assert decoded(set_cookie(future.initial_metadata())) == f"{backends['b2'].address};c1"
        stream = channel.unary_stream(f"/{SERVICE}/Stream")(
            b"3", metadata=md, timeout=5, wait_for_ready=True
        )
        assert list(stream) == [b"b2"] * 3
        assert set_cookie(stream.initial_metadata()) is not None
        collect = channel.stream_unary(f"/{SERVICE}/Collect")
        reply, call = collect.with_call(iter([b"x", b"y"]), metadata=md, timeout=5)
        assert reply == b"b2:2" and set_cookie(call.initial_metadata()) is not None
        chat = channel.stream_stream(f"/{SERVICE}/Chat")(iter([b"hi"]), metadata=md, timeout=5)
        assert list(chat) == [b"b2:hi"] and set_cookie(chat.initial_metadata()) is not None
        plain = channel.unary_unary(WHO)(b"", metadata=md, timeout=5)
        assert plain == b"b2"
        with pytest.raises(grpc.RpcError) as failed:
            channel.unary_unary(FAIL)(b"UNAVAILABLE", metadata=md, timeout=5)
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
        assert set_cookie(failed.value.trailing_metadata()) is not None
        assert set_cookie(failed.value.initial_metadata()) is None
    finally:
        channel.close()


def test_aio_calls_see_the_cookie_and_are_pinned(server, backends):
    server.set_snapshot(snapshot(backends, "v1"))
    bootstrap = server.bootstrap(node_id="ssa-aio")

    async def run() -> None:
        channel = pyxds.aio.insecure_channel(TARGET, bootstrap=bootstrap)
        try:
            call = channel.unary_unary(WHO)(b"", timeout=5, wait_for_ready=True)
            reply = (await call).decode()
            value = set_cookie(await call.initial_metadata())
            assert decoded(value) == f"{backends[reply].address};c1"
            for _ in range(5):
                again = channel.unary_unary(WHO)(b"", metadata=cookie_of(value), timeout=5)
                assert (await again).decode() == reply
                assert set_cookie(await again.initial_metadata()) is None
            md = cookie_for(backends["b0"].address, cluster="")
            stream = channel.unary_stream(f"/{SERVICE}/Stream")(b"2", metadata=md, timeout=5)
            assert [r async for r in stream] == [b"b0", b"b0"]
            assert set_cookie(await stream.initial_metadata()) is not None
            failing = channel.unary_unary(FAIL)(b"UNAVAILABLE", metadata=md, timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await failing
            assert set_cookie(failed.value.trailing_metadata()) is not None
            assert set_cookie(await failing.trailing_metadata()) is not None
        finally:
            await channel.close()

    asyncio.run(run())


# -- as a user writes it (docs/stateful-session.md's recipe, in a subprocess) ----------------

USER_SCRIPT = """
import pyxds

channel = pyxds.insecure_channel("xds:///echo-service")
call = channel.unary_unary("/pyxds.test.Echo/Who")
jar = {}

def rpc(request):
    metadata = [("cookie", "; ".join(f"{k}={v}" for k, v in jar.items()))] if jar else None
    reply, info = call.with_call(request, metadata=metadata, timeout=5, wait_for_ready=True)
    for key, value in info.initial_metadata():
        if key == "set-cookie":
            name, _, rest = value.partition("=")
            jar[name] = rest.split(";", 1)[0]
    return reply.decode()

print(" ".join(rpc(b"") for _ in range(6)), sorted(jar))
"""


def test_a_user_script_keeps_its_session_with_a_cookie_jar(server, backends):
    import json
    import os
    import pathlib
    import subprocess
    import sys

    server.set_snapshot(snapshot(backends, "v1"))
    env = dict(os.environ)
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps(server.bootstrap(node_id="ssa-user"))
    src = str(pathlib.Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", USER_SCRIPT], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    *served, jar = done.stdout.split()
    assert len(set(served)) == 1 and served[0] in ("b0", "b1", "b2"), done.stdout
    assert jar == f"['{COOKIE}']"
    assert "Traceback" not in done.stderr


def test_a_session_follows_its_endpoint_into_a_lower_priority(server, backends, clients):
    """A75: the pinned endpoint moves from priority 0 to priority 1 while
    priority 0 still serves; its session stays (the override-host policy
    sits above the priorities), new sessions go to priority 0."""

    def split(version: str, p0: tuple[str, ...], p1: tuple[str, ...]) -> Snapshot:
        base = snapshot(backends, version)
        localities = [
            b.locality(zone="z1", priority=0, endpoints=[backends[n].address for n in p0])
        ]
        if p1:
            localities.append(
                b.locality(zone="z2", priority=1, endpoints=[backends[n].address for n in p1])
            )
        return Snapshot(
            listeners=base.listeners,
            routes=base.routes,
            clusters=base.clusters,
            endpoints=[b.endpoints("c1", localities), base.endpoints[1]],
            version=version,
        )

    server.set_snapshot(split("v1", ("b0", "b1"), ()))
    channel, core = clients("ssa-priority")
    pinned = cookie_for(backends["b1"].address)
    assert both(channel, core, pinned)[0][0] == "b1"
    server.set_snapshot(split("v2", ("b0",), ("b1",)))
    assert wait_until(lambda: _switched(channel, core, backends, "b1"), timeout=10)
    for _ in range(5):
        (ours, our_initial, _), (theirs, their_initial, _) = both(channel, core, pinned)
        assert ours == theirs == "b1"
        assert set_cookie(our_initial) is None and set_cookie(their_initial) is None


# -- found in review (review55): C-core's base64, RLS routes ---------------------------------------


def test_the_cookie_is_decoded_as_c_core_decodes_it(server, backends, clients):
    """absl::Base64Unescape: spaces are skipped, padding is absent or
    complete (a partial one is refused, so is too much), the standard
    alphabet only (not the URL-safe one), no quotes; both clients pin or
    both re-pick."""
    server.set_snapshot(snapshot(backends, "v1"))
    channel, core = clients("ssa-base64")
    address = backends["b2"].address
    value = base64.b64encode(f"{address};c1".encode()).decode()
    # a cluster not in the route (the address still pins), long enough for "=="
    other = "c1" + "x" * ((1 - len(f"{address};c1")) % 3)
    padded = base64.b64encode(f"{address};{other}".encode()).decode()
    assert padded.endswith("==")
    # a cluster part whose encoding has "+" or "/" (not in the route: the address pins)
    raw = next(
        text
        for text in (f"{address};c1" + "\xfb" * k + "?" * j for j in range(9) for k in range(3))
        if set(base64.b64encode(text.encode("latin-1")).decode()) & {"+", "/"}
    ).encode("latin-1")
    rows = {
        value[:6] + " " + value[6:]: True,
        value + " ": True,
        padded[:-1]: False,  # partial padding
        base64.b64encode(raw).decode(): True,
        base64.urlsafe_b64encode(raw).decode(): False,  # the URL-safe alphabet is not read
        f'"{value}"': False,  # RFC 6265's quoted cookie-value: not base64 to absl
        value + "====": False,  # too much padding
    }
    for text, pins in rows.items():
        md = [("cookie", f"{COOKIE}={text}")]
        runs = [both(channel, core, md) for _ in range(4)]
        ours = {run[0][0] for run in runs}
        theirs = {run[1][0] for run in runs}
        if pins:
            assert ours == theirs == {"b2"}, text
        else:
            assert len(ours) > 1 and len(theirs) > 1, (text, ours, theirs)


def test_an_rls_route_s_cookie_has_no_cluster_in_both(server, backends, clients):
    """A route naming the RLS cluster specifier plugin: C-core's cookie is
    ``<address>;`` (no cluster to keep: GetClusterToUse), the address pins,
    a cookie naming a cluster there is re-set; pyxds the same."""
    from pyxds.server import RouteLookupServer

    with RouteLookupServer() as rls:
        rls.set_default(["c1"])
        config = b.route_lookup_config(rls.target, [b.rls_key_builder(SERVICE)])
        base = snapshot(backends, "v-rls")
        server.set_snapshot(
            Snapshot(
                listeners=base.listeners,
                routes=[
                    b.route_config(
                        "echo-service-route",
                        [
                            b.virtual_host(
                                "vh", routes=[b.route(prefix="", cluster_specifier_plugin="rls")]
                            )
                        ],
                        [b.rls_plugin("rls", config)],
                    )
                ],
                clusters=base.clusters,
                endpoints=base.endpoints,
                version="v-rls",
            )
        )
        channel, core = clients("ssa-rls")
        for reply, initial, _ in both(channel, core):
            assert decoded(set_cookie(initial)) == f"{address_of(backends, reply)};"
        for name in ("b0", "b2"):
            address = backends[name].address
            for cluster, sets in (("", False), ("c1", True), ("rls", True)):
                for reply, initial, _ in both(channel, core, cookie_for(address, cluster)):
                    assert reply == name, (cluster, reply)
                    got = set_cookie(initial)
                    assert (decoded(got) if got else None) == (f"{address};" if sets else None)


def test_a_multi_address_endpoint_s_session_moves_to_its_other_address_in_both(server, clients):
    """C-core's MultipleAddressesPerEndpoint (A61 with A55): the cookie
    carries the endpoint's address list, the picked address first; when
    that address dies and another address of the same endpoint serves,
    the session stays on the endpoint (its other address), with a new
    cookie naming that address first."""
    late = Backend("e0").hold()  # the endpoint's second address: held, not serving yet
    first, other = Backend("e1").start(), Backend("e2").start()
    try:
        endpoint = b.endpoint(first.address)
        extra = endpoint.endpoint.additional_addresses.add().address.socket_address
        extra.address, extra.port_value = "127.0.0.1", late.port
        server.set_snapshot(
            Snapshot(
                listeners=[
                    b.listener(
                        "echo-service",
                        http_filters=[
                            b.stateful_session_filter(cookie_name=COOKIE, path=PATH, ttl=120)
                        ],
                    )
                ],
                routes=[
                    b.route_config(
                        "echo-service-route",
                        [b.virtual_host("vh", routes=[b.route(prefix="", cluster="c1")])],
                    )
                ],
                clusters=[b.cluster("c1")],
                endpoints=[
                    b.endpoints(
                        "c1",
                        [b.locality(zone="z1", endpoints=[endpoint, b.endpoint(other.address)])],
                    )
                ],
                version="v-multi",
            )
        )
        channel, core = clients("ssa-multi")
        pinned = cookie_for(f"{first.address},{late.address}")
        for reply, initial, _ in both(channel, core, pinned):
            assert reply == "e1" and set_cookie(initial) is None
        late.start()
        first.stop()
        assert wait_until(
            lambda: (
                {pyxds_call(channel)[0] for _ in range(4)} == {"e0", "e2"}
                and {core.call_md(WHO)[0] for _ in range(4)} == {"e0", "e2"}
            ),
            timeout=15,
        )
        for _ in range(3):
            for reply, initial, _ in both(channel, core, pinned):
                assert reply == "e0"
                assert decoded(set_cookie(initial)) == f"{late.address},{first.address};c1"
    finally:
        for backend in (late, first, other):
            backend.stop()


# -- A55/A75: the status set; A60: a cluster the route lost ---------------------------


@pytest.mark.parametrize(
    ("statuses", "health", "pins"),
    [
        ([], "UNKNOWN", False),  # present and empty: no endpoint keeps a session
        (["HEALTHY"], "UNKNOWN", False),  # UNKNOWN is not HEALTHY
        (["UNKNOWN"], "UNKNOWN", True),
        (["UNKNOWN"], "HEALTHY", False),
        (["DRAINING"], "HEALTHY", False),
        (["UNHEALTHY", "DEGRADED", "HEALTHY"], "HEALTHY", True),  # the others are ignored
    ],
    ids=["empty", "healthy-only", "unknown-only", "unknown-only-healthy", "draining-only", "mixed"],
)
def test_the_override_host_status_set_decides_which_endpoints_keep_sessions_in_both(
    server, backends, clients, statuses, health, pins
):
    """CDS ``common_lb_config.override_host_status`` (A55, A75): a cookie
    pins only an endpoint whose EDS status is in the set; a set present but
    empty pins nothing; statuses other than UNKNOWN, HEALTHY and DRAINING are
    ignored.  Not pinned: a normal pick (round robin) with a new cookie."""
    everyone = {n: health for n in ("b0", "b1", "b2")}
    server.set_snapshot(snapshot(backends, "v1", statuses=statuses, health=everyone))
    channel, core = clients("ssa-statuses")
    pinned = cookie_for(backends["b1"].address)
    for client in ("pyxds", "core"):

        def call(client: str = client) -> tuple:
            return pyxds_call(channel, pinned) if client == "pyxds" else core.call_md(WHO, pinned)

        got = [call() for _ in range(6)]
        if not pins:
            # Not pinned: round robin, which reaches an endpoint once it is
            # READY (they connect in parallel with the first RPCs): call on,
            # bounded, until every endpoint answered.
            got += until_answered(lambda: [call()], everyone, lambda one: one[0])
        replies = [reply for reply, _, _ in got]
        cookies = [set_cookie(initial) for _, initial, _ in got]
        if pins:
            assert replies == ["b1"] * 6 and cookies == [None] * 6, (client, got)
        else:
            assert set(replies) == {"b0", "b1", "b2"}, (client, replies)
            for reply, cookie in zip(replies, cookies, strict=True):
                if reply == "b1":
                    assert cookie is None, (client, got)
                else:
                    assert decoded(cookie) == f"{address_of(backends, reply)};c1", (client, got)


def test_a_cookie_naming_a_cluster_the_route_no_longer_has_is_re_pinned_in_both(
    server, backends, clients
):
    """A60: the cookie's cluster left the route's weighted clusters (or
    its weight became 0, which drops it as C-core does): the RPC takes the
    route's own choice and the response re-sets the cookie with that
    cluster.  The cookie's address still pins when the new cluster has it
    (C-core keeps the host override whatever the cluster)."""
    split = [b.route(prefix="", weighted_clusters={"c1": 1, "c2": 0})]
    server.set_snapshot(snapshot(backends, "v1", routes=split))
    channel, core = clients("ssa-cluster-gone")
    gone = cookie_for(backends["d1"].address, cluster="c2")
    for reply, initial, _ in both(channel, core, gone):
        assert reply in ("b0", "b1", "b2")
        assert decoded(set_cookie(initial)) == f"{address_of(backends, reply)};c1"
    # the cookie's address is also one of c1's: it stays pinned, the cluster is rewritten
    moved = cookie_for(backends["b2"].address, cluster="c2")
    for reply, initial, _ in both(channel, core, moved):
        assert reply == "b2"
        assert decoded(set_cookie(initial)) == f"{backends['b2'].address};c1"


def test_a_cookie_naming_a_route_cluster_whose_cds_resource_is_gone_fails_in_both(
    server, backends, clients
):
    """A60 with the cookie's cluster still in the route but its Cluster
    resource removed: the RPC goes to that cluster and fails UNAVAILABLE in
    both clients (the cookie, not the weights, chose it); without the
    cookie, RPCs to the other cluster still succeed."""
    split = [b.route(prefix="", weighted_clusters={"c1": 1, "c2": 1})]
    snap = snapshot(backends, "v1", routes=split)
    server.set_snapshot(snap)
    channel, core = clients("ssa-cds-gone")
    pinned = cookie_for(backends["d0"].address, cluster="c2")
    assert [reply for reply, _, _ in both(channel, core, pinned)] == ["d0", "d0"]
    server.set_snapshot(
        snap.replace(
            version="v2",
            clusters=[c for c in snap.clusters if c.name == "c1"],
            endpoints=[e for e in snap.endpoints if e.cluster_name == "c1"],
        )
    )
    failing = channel.unary_unary(WHO)
    got: list = []

    def ours() -> str:
        try:
            return failing(b"", timeout=2, metadata=pinned).decode()
        except grpc.RpcError as err:
            return f"error:{err.code().name}: {err.details()}"

    def settled() -> bool:
        got[:] = [ours(), core.call(1, metadata=pinned, wait_for_ready=False, details=True)]
        return got[0].startswith("error:") and all(k.startswith("error:") for k in got[1])

    assert wait_until(settled, timeout=10), got
    (their_failure,) = got[1]
    assert got[0].startswith("error:UNAVAILABLE"), got
    assert their_failure.startswith("error:UNAVAILABLE"), got
    assert "c2" in got[0] and "c2" in their_failure, got
    # no cookie: the weights may still pick c1, which serves in both
    assert {"b0", "b1", "b2"} & set(core.call(8, wait_for_ready=False))
    print("cds-gone failures (pyxds, C-core):", got)


def test_a_long_cookie_s_address_list_is_read_to_its_end_in_both(server, backends, clients):
    """No length cap on the cookie (C-core has none): a 5000+ character
    cookie whose address list ends with a cluster endpoint pins that
    endpoint and is re-set to the endpoint's own address list."""
    server.set_snapshot(snapshot(backends, "v1"))
    channel, core = clients("ssa-long")
    bogus = ",".join(f"10.255.{i // 250}.{i % 250 + 1}:1" for i in range(300))
    value = base64.b64encode(f"{bogus},{backends['b1'].address};c1".encode()).decode()
    assert len(value) > 5000
    long_cookie = [("cookie", f"{COOKIE}={value}")]
    for reply, initial, _ in both(channel, core, long_cookie):
        assert reply == "b1"
        assert decoded(set_cookie(initial)) == f"{backends['b1'].address};c1"
