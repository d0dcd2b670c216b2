"""Differential: the A66 per-attempt metrics of one scenario through grpcio's
C-core (``grpc.insecure_channel("xds:///...")`` with grpcio-observability's
``OpenTelemetryPlugin``) and through pyxds (``pyxds.metrics.enable``), each
in its own process (the plugin and C-core's bootstrap are per process),
against the same pyxds.server and the same backend, each read with the
OpenTelemetry SDK's ``InMemoryMetricReader``.

What grpcio-observability 1.85 exports is A66's per-attempt set:
``grpc.client.attempt.started``, ``.duration`` and the two message-size
histograms (no ``grpc.client.call.duration``: "not required yet" in its
``base_metrics``; none of A78's WRR, pick_first or XdsClient metrics: C-core
records them, but its Python plugin registers no instrument for them).
Those four are compared: names, units, label keys and values, counts per
label set, message-size sums.  The scenario covers what decides an
attempt's existence and its labels (A66 "Attempts are created after name
resolution and after any xDS HTTP filters but before the LB pick"):
registered and generic methods, an OK and a failed status, retries (A44),
retried failed picks, a retry whose pushback runs into the deadline, a
fault abort (A33), a route that matches nothing, a target with no
Listener, a cancelled and a timed-out attempt, streams, a plain (non-xDS)
target.

grpcio-observability is not in the ``test`` extra: 1.85.0 pins
``grpcio==1.85.0``, older than the generated stubs of tests/e2e/protos
need; it works over grpcio 1.85.x (``pip install --no-deps
grpcio-observability==1.85.0``).  Without it the module is skipped.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from concurrent import futures
from typing import Any

import grpc
import pytest
from cli_process import cli_env
from ports import EXCLUSIVE

from pyxds.server import ManagementServer, Snapshot
from pyxds.server import builders as b

try:  # grpcio-observability over this grpcio: importable here?
    import grpc_observability  # noqa: F401
except Exception:  # pragma: no cover - depends on the environment
    pytest.skip(
        "grpcio-observability (C-core's OpenTelemetry plugin) is not installed",
        allow_module_level=True,
    )
pytest.importorskip("opentelemetry.sdk.metrics")

SERVICE = "pyxds.test.Metrics"
COMPARED = (
    "grpc.client.attempt.started",
    "grpc.client.attempt.duration",
    "grpc.client.attempt.sent_total_compressed_message_size",
    "grpc.client.attempt.rcvd_total_compressed_message_size",
)


def _handlers() -> grpc.GenericRpcHandler:
    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        return b"backend"

    def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(getattr(grpc.StatusCode, request.decode()), "no")

    def pushback(request: bytes, context: grpc.ServicerContext) -> bytes:
        # A6: the next attempt no sooner than 10 s, far past the deadline
        context.set_trailing_metadata((("grpc-retry-pushback-ms", "10000"),))
        context.abort(grpc.StatusCode.UNAVAILABLE, "later")

    def sleep(request: bytes, context: grpc.ServicerContext) -> bytes:
        time.sleep(float(request))
        return b"late"

    def stream(request: bytes, context: grpc.ServicerContext):
        for _ in range(int(request)):
            yield b"part"

    def chat(requests, context: grpc.ServicerContext):
        for request in requests:
            yield b">" + request

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Who": grpc.unary_unary_rpc_method_handler(who),
            "Generic": grpc.unary_unary_rpc_method_handler(who),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
            "Pushback": grpc.unary_unary_rpc_method_handler(pushback),
            "Sleep": grpc.unary_unary_rpc_method_handler(sleep),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )


def _snapshot(backend: str, dead: str) -> Snapshot:
    retry = b.retry_policy("unavailable", num_retries=2, base_interval=0.01)
    routes = [
        b.route(prefix=f"/{SERVICE}/Fail", cluster="live", retry_policy=retry),
        b.route(prefix=f"/{SERVICE}/Pushback", cluster="live", retry_policy=retry),
        b.route(prefix=f"/{SERVICE}/Unreachable", cluster="dead", retry_policy=retry),
        b.route(prefix=f"/{SERVICE}/Dropped", cluster="dropping", retry_policy=retry),
        b.route(prefix=f"/{SERVICE}/", cluster="live"),  # nothing for other services
    ]
    faulty = [b.fault_filter(abort_grpc_status=14, abort_percent=100)]
    return Snapshot(
        listeners=[
            b.listener("metrics", route_config_name="metrics-route"),
            b.listener("faulty", route_config_name="faulty-route", http_filters=faulty),
        ],
        routes=[
            b.route_config("metrics-route", [b.virtual_host("v", ["*"], routes)]),
            b.route_config("faulty-route", [b.virtual_host("v", ["*"], [b.route(cluster="live")])]),
        ],
        clusters=[b.cluster("live"), b.cluster("dead"), b.cluster("dropping")],
        endpoints=[
            b.endpoints("live", [b.locality("r", "z", "s", endpoints=[backend])]),
            b.endpoints("dead", [b.locality(endpoints=[dead])]),
            # A27 drop_overloads at 100 %: every pick dropped (never retried)
            b.endpoints(
                "dropping",
                [b.locality(endpoints=[backend])],
                drop_overloads={"throttle": 1_000_000},
            ),
        ],
    )


def _scenario(backend: str) -> list[dict[str, Any]]:
    """Steps: target, method, kind (uu/us/ss), registered, request, n,
    timeout, wait_for_ready, cancel_after."""
    m = f"/{SERVICE}/"
    xds = "xds:///metrics"
    return [
        {"target": xds, "method": m + "Who", "registered": True, "n": 3},
        {"target": xds, "method": m + "Generic", "n": 2},  # A66: "other"
        {"target": xds, "method": m + "Fail", "registered": True, "request": "INTERNAL"},
        # A44 retries: 3 attempts, each UNAVAILABLE
        {"target": xds, "method": m + "Fail", "registered": True, "request": "UNAVAILABLE"},
        # a retry pushed back past the deadline: 1 attempt, the call DEADLINE_EXCEEDED
        {"target": xds, "method": m + "Pushback", "registered": True, "timeout": 1.0},
        # failed picks (nothing listens), retried: 3 attempts
        {"target": xds, "method": m + "Unreachable", "registered": True, "wfr": False},
        # a drop: one attempt UNAVAILABLE, not retried
        {"target": xds, "method": m + "Dropped", "registered": True},
        # no route matches: no attempt
        {"target": xds, "method": "/other.Svc/X", "registered": True},
        # A33 abort: no attempt
        {"target": "xds:///faulty", "method": m + "Who", "registered": True, "n": 2},
        # no Listener: no attempt
        {"target": "xds:///nowhere", "method": m + "Who", "registered": True, "timeout": 0.5},
        {"target": xds, "method": m + "Sleep", "registered": True, "request": "2", "timeout": 0.3},
        {"target": xds, "method": m + "Sleep", "registered": True, "request": "2", "cancel": 0.3},
        {"target": xds, "method": m + "Stream", "registered": True, "kind": "us", "request": "3"},
        {"target": xds, "method": m + "Chat", "registered": True, "kind": "ss", "messages": 4},
        {"target": backend, "method": m + "Who", "registered": True},
        # grpc.aio channels (pyxds.aio): the same rules
        {"target": xds, "method": m + "Who", "registered": True, "aio": True, "n": 2},
        {"target": xds, "method": m + "Generic", "aio": True},
        {
            "target": xds,
            "method": m + "Fail",
            "registered": True,
            "request": "UNAVAILABLE",
            "aio": True,
        },
        {"target": xds, "method": m + "Stream", "registered": True, "kind": "us", "request": "3"}
        | {"aio": True, "n": 3},
    ]


_CLIENT = r"""
import json, os, sys, time
import grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

kind, scenario = sys.argv[1], json.loads(sys.stdin.read())
reader = InMemoryMetricReader()
provider = MeterProvider(metric_readers=[reader])
if kind == "core":
    import grpc_observability
    plugin = grpc_observability.OpenTelemetryPlugin(meter_provider=provider)
    plugin.register_global()
    make = grpc.insecure_channel
else:
    import pyxds, pyxds.metrics
    a78 = [n for n in pyxds.metrics.INSTRUMENTS if n not in pyxds.metrics.DEFAULT_METRICS]
    pyxds.metrics.enable(provider, enable_metrics=a78)  # A78's are off by default
    bootstrap = json.loads(os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"])
    make = lambda target: pyxds.insecure_channel(target, bootstrap=bootstrap)
channels, outcomes = {}, []
aio_steps = [step for step in scenario if step.get("aio")]
for step in [step for step in scenario if not step.get("aio")]:
    target = step["target"]
    channel = channels.get(target) or channels.setdefault(target, make(target))
    kind_ = step.get("kind", "uu")
    factory = {"uu": channel.unary_unary, "us": channel.unary_stream,
               "ss": channel.stream_stream}[kind_]
    mc = factory(step["method"], _registered_method=step.get("registered", False))
    options = {"timeout": step.get("timeout", 10), "wait_for_ready": step.get("wfr", True)}
    request = step.get("request", "").encode()
    for _ in range(step.get("n", 1)):
        try:
            if "cancel" in step:
                future = mc.future(request, **options)
                time.sleep(step["cancel"])
                future.cancel()
                future.result()
            elif kind_ == "uu":
                mc(request, **options)
            elif kind_ == "us":
                list(mc(request, **options))
            else:
                list(mc(iter([b"abc"] * step["messages"]), **options))
            outcomes.append("OK")
        except grpc.FutureCancelledError:
            outcomes.append("CANCELLED")
        except grpc.RpcError as err:
            outcomes.append(err.code().name)
async def run_aio():
    import grpc.aio
    if kind == "core":
        make_aio = grpc.aio.insecure_channel
    else:
        import pyxds.aio
        make_aio = lambda target: pyxds.aio.insecure_channel(target, bootstrap=bootstrap)
    aio_channels = {}
    for step in aio_steps:
        target = step["target"]
        channel = aio_channels.get(target) or aio_channels.setdefault(target, make_aio(target))
        streams = step.get("kind") == "us"
        factory = channel.unary_stream if streams else channel.unary_unary
        mc = factory(step["method"], _registered_method=step.get("registered", False))
        for _ in range(step.get("n", 1)):
            try:
                call = mc(step.get("request", "").encode(), timeout=10, wait_for_ready=True)
                if streams:
                    [r async for r in call]
                else:
                    await call
                outcomes.append("OK")
            except grpc.RpcError as err:
                outcomes.append(err.code().name)
    for channel in aio_channels.values():
        await channel.close()
if aio_steps:
    import asyncio
    asyncio.run(run_aio())
if kind == "core":
    plugin.deregister_global()  # flushes C-core's batched stats into the provider
for channel in channels.values():
    channel.close()
points = []
data = reader.get_metrics_data()
for rm in (data.resource_metrics if data else ()):
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            for p in m.data.data_points:
                points.append({
                    "name": m.name, "unit": m.unit, "labels": dict(p.attributes),
                    "value": getattr(p, "value", None), "count": getattr(p, "count", None),
                    "sum": getattr(p, "sum", None),
                })
print(json.dumps({"outcomes": outcomes, "points": points}))
"""


def _run(kind: str, scenario: list[dict[str, Any]], bootstrap: dict) -> dict[str, Any]:
    env = cli_env({"GRPC_XDS_BOOTSTRAP_CONFIG": json.dumps(bootstrap)})
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT, kind],
        input=json.dumps(scenario),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def runs():
    """The scenario's outcomes and metric points: {"core": ..., "pyxds": ...}."""
    from ports import held_ports

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[EXCLUSIVE])
    server.add_generic_rpc_handlers((_handlers(),))
    backend = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    control = ManagementServer().start()
    try:
        with held_ports() as ports:
            control.set_snapshot(_snapshot(backend, ports.dead_address()))
            bootstrap = control.bootstrap(node_id="differential-metrics")
            scenario = _scenario(backend)
            yield {kind: _run(kind, scenario, bootstrap) for kind in ("core", "pyxds")}
    finally:
        control.stop()
        server.stop(None).wait(5)


def _canonical(target: str) -> str:
    """A66's grpc.target of a target without a scheme: ``dns:///`` + it."""
    return target if ":///" in target else "dns:///" + target


def _compared(run: dict[str, Any]) -> dict[tuple, tuple]:
    """(name, unit, labels) -> (counter value or histogram count, size sum)
    of the four compared instruments (durations' sums are times: left out);
    grpc.target in A66's canonical form (grpcio's Python plugin records the
    plain target as given: test_plain_target_is_canonical_as_a66_says)."""
    out = {}
    for p in run["points"]:
        if p["name"] not in COMPARED:
            continue
        labels = dict(p["labels"], **{"grpc.target": _canonical(p["labels"]["grpc.target"])})
        key = (p["name"], p["unit"], tuple(sorted(labels.items())))
        size_sum = p["sum"] if p["name"].endswith("message_size") else None
        out[key] = (p["value"] if p["count"] is None else p["count"], size_sum)
    return out


def test_both_clients_saw_the_same_outcomes(runs):
    assert runs["pyxds"]["outcomes"] == runs["core"]["outcomes"]
    assert runs["core"]["outcomes"] == [
        *["OK"] * 5,  # Who x3, Generic x2
        "INTERNAL",  # Fail
        "UNAVAILABLE",  # Fail, retried twice
        "DEADLINE_EXCEEDED",  # Pushback
        "UNAVAILABLE",  # Unreachable
        "UNAVAILABLE",  # Dropped
        "UNAVAILABLE",  # no matching route
        *["UNAVAILABLE"] * 2,  # fault abort
        "DEADLINE_EXCEEDED",  # no Listener
        "DEADLINE_EXCEEDED",  # Sleep
        "CANCELLED",  # Sleep, cancelled
        *["OK"] * 3,  # Stream, Chat, the plain target
        *["OK"] * 3,  # aio: Who x2, Generic
        "UNAVAILABLE",  # aio: Fail, retried twice
        *["OK"] * 3,  # aio: Stream x3
    ]


def test_attempt_metrics_match_c_core_label_set_by_label_set(runs):
    """Names, units, label keys and values (grpc.method, grpc.target,
    grpc.status; no optional label unless enabled), attempt counts and
    message-size sums, point for point (A66 "Client Per-Attempt
    Instruments")."""
    ours, theirs = _compared(runs["pyxds"]), _compared(runs["core"])
    assert ours == theirs


def _attempts(run: dict[str, Any]) -> collections.Counter:
    return collections.Counter(
        {
            (p["labels"]["grpc.method"], p["labels"]["grpc.target"]): p["value"]
            for p in run["points"]
            if p["name"] == "grpc.client.attempt.started"
        }
    )


def test_attempts_exist_after_routing_and_filters_only_like_c_core(runs):
    """A66: no attempt for a fault abort, a route that matches nothing or a
    target with no Listener; one per retry; none after a pushback that
    runs into the deadline."""
    m = f"{SERVICE}/"
    for kind in ("core", "pyxds"):
        started = _attempts(runs[kind])
        assert ("other.Svc/X", "xds:///metrics") not in started, kind
        assert not [k for k in started if k[1] in ("xds:///faulty", "xds:///nowhere")], kind
        # INTERNAL; 3 UNAVAILABLE; 3 UNAVAILABLE through grpc.aio
        assert started[m + "Fail", "xds:///metrics"] == 1 + 3 + 3, kind
        assert started[m + "Unreachable", "xds:///metrics"] == 3, kind
        assert started[m + "Pushback", "xds:///metrics"] == 1, kind
        assert started[m + "Dropped", "xds:///metrics"] == 1, kind


def test_generic_method_is_other_like_c_core(runs):
    """A66 "Attributes": a method the channel did not register is "other";
    the registered ones by name."""
    for kind in ("core", "pyxds"):
        started = _attempts(runs[kind])
        assert started["other", "xds:///metrics"] == 2 + 1, kind  # sync, aio
        assert started[f"{SERVICE}/Who", "xds:///metrics"] == 3 + 2, kind


def test_pyxds_records_a66_call_duration_once_per_call(runs):
    """A66 "Client Per-Call Instruments" (C-core's Python plugin does not
    export it): one grpc.client.call.duration per RPC, with its status."""
    calls = collections.Counter()
    for p in runs["pyxds"]["points"]:
        if p["name"] == "grpc.client.call.duration":
            calls[p["labels"]["grpc.status"]] += p["count"]
    assert calls == collections.Counter(runs["pyxds"]["outcomes"])


def test_plain_target_is_canonical_as_a66_says(runs):
    """A66 "Attributes": grpc.target is the "canonicalized target URI ...
    the form with the scheme included if the user didn't mention the
    scheme": ``127.0.0.1:port`` is ``dns:///127.0.0.1:port`` (C++ and
    grpc-go record that form). grpcio's Python plugin records the target as
    the application gave it: a difference pyxds keeps on purpose
    (docs/differences-from-c-core.md)."""
    plain = {
        kind: {
            p["labels"]["grpc.target"]
            for p in runs[kind]["points"]
            if p["name"] == "grpc.client.attempt.started"
            and not p["labels"]["grpc.target"].startswith("xds:")
        }
        for kind in ("core", "pyxds")
    }
    (given,) = plain["core"]
    assert ":///" not in given
    assert plain["pyxds"] == {"dns:///" + given}
    pick_first = {
        p["labels"]["grpc.target"]
        for p in runs["pyxds"]["points"]
        if p["name"] == "grpc.lb.pick_first.connection_attempts_succeeded"
    }
    # A78: pick_first's grpc.target is A66's attribute too
    assert "dns:///" + given in pick_first and given not in pick_first
