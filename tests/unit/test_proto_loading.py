"""pyxds decodes, ACKs and NACKs the same whatever the order in which the
generated ``_pb2`` modules (xds-protos, protobuf's well-known types) are
imported (issue 18 item 5, the protobuf descriptors).

pyxds may load the descriptors and message classes it needs without
importing the generated modules.  Whatever it does, a program that imports
them itself must see the very classes pyxds parses with, and pyxds must
answer exactly as when it imported them.  Each check runs in fresh
interpreters, one hash seed, three orders:

* ``before``: the program imports every generated module pyxds uses
  first, then pyxds;
* ``after``: pyxds decodes everything first, then the program imports the
  generated modules, and pyxds decodes everything again;
* ``never``: the program never imports a generated module itself.

In each, the child decodes a corpus of serialized resources (client and
server Listeners with their HttpConnectionManager filters, RDS, CDS with
every cluster kind and LB policy pyxds knows, EDS; each valid one also
truncated and with bytes flipped, so NACKs of every kind are in it) with
``pyxds.xds.resources``, runs them through the ADS state machine (the
DiscoveryRequests it sends back, ACK or NACK, in text format; what the
watchers get), dumps the cache as CSDS (dict and ``ClientConfig``), and
parses ORCA reports, LRS requests and RLS messages.  It also records, for
every message type met: module and qualified name, text format, pickling,
``Any`` packing and unpacking, the well-known types' mixins
(``Duration.ToTimedelta``, ``Struct``, ``Timestamp``), and the symbol
database.  The three orders must give identical records; where the
program imported the generated modules, every class pyxds holds must be
that module's class (identity, ``isinstance``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from functools import cache
from typing import Any

import pytest
from google.protobuf import duration_pb2, struct_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.server import builders as b
from pyxds.server import inbound as ib

_TP = "type.googleapis.com/"
URLS = {
    "LDS": _TP + "envoy.config.listener.v3.Listener",
    "RDS": _TP + "envoy.config.route.v3.RouteConfiguration",
    "CDS": _TP + "envoy.config.cluster.v3.Cluster",
    "EDS": _TP + "envoy.config.endpoint.v3.ClusterLoadAssignment",
}

PROVIDERS = {"default": {"plugin_name": "file_watcher", "config": {"ca_certificate_file": "x"}}}


def _generated_modules() -> list[str]:
    """Every generated module of xds-protos and protobuf this process (which
    imported pyxds's xDS client, server side, builders, CSDS, LRS, ORCA)
    has loaded: the ones a user's program may import beside pyxds."""
    import pyxds.admin.csds
    import pyxds.lb.orca
    import pyxds.orca.service
    import pyxds.server.lrs
    import pyxds.xds.client
    import pyxds.xds.lrs_transport  # noqa: F401

    return sorted(
        name
        for name in sys.modules
        if name.endswith("_pb2")
        and name.split(".")[0] in ("envoy", "xds", "udpa", "validate", "google")
    )


def _typed_struct_policy() -> typed_struct_pb2.TypedStruct:
    value = struct_pb2.Struct()
    value.update({"shuffleAddressList": True, "n": 2.5, "l": [1, "a", None]})
    return typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/pick_first", value=value)


def _valid() -> list[tuple[str, bytes]]:
    """Valid resources of every shape pyxds decodes (serialized)."""
    from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2
    from envoy.extensions.load_balancing_policies.pick_first.v3 import pick_first_pb2
    from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
    from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2
    from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2

    rc = b.route_config(
        "r",
        [
            b.virtual_host(
                "vh",
                routes=[
                    b.route(
                        prefix="/svc/",
                        cluster="c",
                        timeout=1.5,
                        max_stream_duration=2,
                        grpc_timeout_header_max=3,
                        hash_policies=[b.hash_policy("x-h"), b.hash_policy(channel_id=True)],
                        retry_policy=b.retry_policy(),
                        headers=[b.header_matcher("x-a", exact="v")],
                    ),
                    b.route(path="/a/B", weighted_clusters={"c": 3, "d": 1}, case_sensitive=False),
                    b.route(
                        regex="/svc/.*",
                        headers=[b.header_matcher("x-b", safe_regex="a+b", ignore_case=True)],
                        cluster="c",
                        hash_policies=[b.hash_policy("x-h", regex="[0-9]", substitution="#")],
                        runtime_fraction=(25, "HUNDRED"),
                    ),
                    b.route(
                        prefix="/fault/",
                        cluster="c",
                        typed_per_filter_config={
                            "fault": b.fault_config(abort_grpc_status=14, abort_percent=50)
                        },
                    ),
                    b.route(prefix="/rls/", cluster_specifier_plugin="rls"),
                    b.route(""),
                ],
            )
        ],
        [
            b.rls_plugin(
                "rls",
                b.route_lookup_config(
                    "rls.example:443", [b.rls_key_builder("svc")], lookup_service_timeout=1
                ),
            )
        ],
    )
    filters = [
        b.fault_filter(delay=0.5, delay_percent=(1, 100), max_active_faults=3),
        b.stateful_session_filter(cookie_name="c", path="/", ttl=60),
        ib.rbac_filter("rbac", "ALLOW", {"p": ib.rbac_policy()}),
    ]
    ring = ring_hash_pb2.RingHash(minimum_ring_size={"value": 16}, maximum_ring_size={"value": 64})
    wrr = wrr_locality_pb2.WrrLocality()
    wrr.endpoint_picking_policy.policies.add().typed_extension_config.CopyFrom(
        b._typed_extension("rr", round_robin_pb2.RoundRobin())
    )
    out: list[tuple[str, Any]] = [
        ("LDS", b.listener("lis", "r")),
        ("LDS", b.listener("inline", route_config=rc, max_stream_duration=5)),
        ("LDS", b.listener("filters", "r", http_filters=filters)),
        ("LDS", ib.istio_inbound_listener("0.0.0.0:8080")),
        (
            "LDS",
            ib.istio_inbound_listener(
                "0.0.0.0:8081",
                strict=True,
                deny={"deny-0": ib.rbac_policy(principals=[ib.principal_name(exact="spiffe://a")])},
                allow={"allow-0": ib.rbac_policy()},
            ),
        ),
        (
            "LDS",
            ib.server_listener(
                "srv",
                "127.0.0.1:9000",
                [ib.filter_chain(ib.inbound_hcm(rds="inbound"))],
                default_filter_chain=ib.filter_chain(ib.inbound_hcm()),
            ),
        ),
        ("RDS", rc),
        ("RDS", ib.inbound_route_config()),
        ("CDS", b.cluster("c")),
        ("CDS", b.cluster("eds", eds_service_name="e", max_requests=7, lrs_server=True)),
        ("CDS", b.cluster("rh", lb_policy="RING_HASH")),
        ("CDS", b.cluster("lr", lb_policy="LEAST_REQUEST")),
        ("CDS", b.cluster("dns", kind="LOGICAL_DNS", dns_host="example.com", dns_port=443)),
        ("CDS", b.cluster("agg", aggregate_children=["c", "dns"])),
        ("CDS", b.cluster("p", load_balancing_policy=[("ring", ring)])),
        ("CDS", b.cluster("w", load_balancing_policy=[("wrr", wrr)])),
        (
            "CDS",
            b.cluster(
                "l",
                load_balancing_policy=[
                    ("lr", least_request_pb2.LeastRequest(choice_count={"value": 3})),
                    ("pf", pick_first_pb2.PickFirst(shuffle_address_list=True)),
                ],
            ),
        ),
        ("CDS", b.cluster("ts", load_balancing_policy=[("custom", _typed_struct_policy())])),
        ("CDS", b.cluster("tls", upstream_tls=b.upstream_tls_context("default", "default"))),
        ("CDS", b.cluster("oh", override_host_status=["HEALTHY", "DRAINING"])),
        ("CDS", b.cluster("orca", lrs_server=True, lrs_report_endpoint_metrics=["cpu"])),
        (
            "EDS",
            b.endpoints(
                "c",
                [
                    b.locality("r", "z", "s", 3, 0, ["10.0.0.1:80", b.endpoint("10.0.0.2:81", 5)]),
                    b.locality("r", "z2", weight=1, priority=1, endpoints=["[::1]:82"]),
                    b.locality(
                        "r2",
                        endpoints=[
                            b.endpoint("10.0.0.3:80", health_status="DRAINING", hostname="h")
                        ],
                    ),
                ],
                drop_overloads={"lb": 1000},
            ),
        ),
        ("EDS", b.endpoints("empty")),
    ]
    return [(kind, msg.SerializeToString()) for kind, msg in out]


@cache
def corpus() -> list[tuple[str, bytes]]:
    """The valid resources, each also cut short and with bytes flipped."""
    rng = random.Random(18)
    out = []
    for kind, data in _valid():
        out.append((kind, data))
        for _ in range(3):
            out.append((kind, data[: rng.randrange(len(data) or 1)]))
            flipped = bytearray(data)
            for _ in range(1 + len(data) // 64):
                flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            out.append((kind, bytes(flipped)))
    return out


def _extra() -> dict[str, str]:
    """Serialized ORCA / LRS / RLS / discovery messages the child parses (hex)."""
    from envoy.service.discovery.v3 import discovery_pb2
    from envoy.service.load_stats.v3 import lrs_pb2
    from xds.data.orca.v3 import orca_load_report_pb2

    from pyxds.protos import rls_pb2

    orca = orca_load_report_pb2.OrcaLoadReport(
        cpu_utilization=0.5, rps_fractional=12.5, named_metrics={"a": 1.0}, utilization={"u": 0.2}
    )
    lrs = lrs_pb2.LoadStatsResponse(
        clusters=["c"], load_reporting_interval=duration_pb2.Duration(seconds=3)
    )
    rls = rls_pb2.RouteLookupResponse(targets=["t"], header_data="h")
    wrapped = discovery_pb2.DiscoveryResponse(version_info="w", nonce="nw", type_url=URLS["CDS"])
    res = discovery_pb2.Resource(name="wrapped", version="1")
    res.resource.Pack(b.cluster("wrapped"))
    wrapped.resources.add().Pack(res)
    return {
        "orca": orca.SerializeToString().hex(),
        "lrs": lrs.SerializeToString().hex(),
        "rls": rls.SerializeToString().hex(),
        "wrapped": wrapped.SerializeToString().hex(),
    }


_CHILD = textwrap.dedent(
    """
    import datetime, importlib, json, pickle, sys
    mode, generated, providers = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    data = json.loads(sys.stdin.read())
    corpus = [(kind, bytes.fromhex(h)) for kind, h in data["corpus"]]
    extra = {k: bytes.fromhex(v) for k, v in data["extra"].items()}
    urls = data["urls"]

    if mode == "before":
        for name in generated:
            importlib.import_module(name)

    from google.protobuf import descriptor_pool, message, message_factory, symbol_database
    from google.protobuf import text_format
    import pyxds.xds.resources as res
    from pyxds.xds.resources.listener import decode_listener
    from pyxds.xds import ads_state, csds
    from pyxds.xds.lrs_state import LrsStreamState
    from pyxds.xds.load_store import ClusterLoadReport
    from pyxds.lb import orca
    from pyxds.testing.fake_clock import FakeClock

    class Server:
        server_uri = "xds.example:443"
        ignore_resource_deletion = False
        fail_on_data_errors = False
        resource_timer_is_transient_error = False

    class Watcher:
        def __init__(self, log, name):
            self.log, self.name = log, name

        def on_resource_changed(self, value):
            self.log.append((self.name, "changed", repr(value)))

        def on_ambient_error(self, status):
            self.log.append((self.name, "ambient", repr(status)))

    # the Any payloads pyxds decodes itself (so loads whatever the order);
    # protobuf's text format and JSON expand any type that happens to be
    # in the default pool, which depends on what the program imported
    UNPACKED = {
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "envoy.extensions.clusters.aggregate.v3.ClusterConfig",
        "envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash",
        "envoy.extensions.load_balancing_policies.wrr_locality.v3.WrrLocality",
        "envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
        "xds.type.v3.TypedStruct",
    }
    EMPTY_POOL = descriptor_pool.DescriptorPool()

    def text(msg):
        return text_format.MessageToString(msg, descriptor_pool=EMPTY_POOL)

    def cls(full_name):
        desc = descriptor_pool.Default().FindMessageTypeByName(full_name)
        return message_factory.GetMessageClass(desc)

    def walk(msg, seen, out):
        # every message type under msg: its class's module and qualified
        # name; Anys unpacked into their class; the well-known mixins
        t = type(msg)
        key = t.DESCRIPTOR.full_name
        if key not in seen:
            seen.add(key)
            out.append(["type", key, t.__module__, t.__qualname__])
        if key == "google.protobuf.Any":
            if msg.TypeName() not in UNPACKED:
                out.append(["any", msg.type_url])
                return
            inner = cls(msg.TypeName())
            unpacked = inner()
            ok = msg.Unpack(unpacked)
            out.append(["any", msg.type_url, ok, msg.Is(inner.DESCRIPTOR)])
            walk(unpacked, seen, out)
            return
        if key == "google.protobuf.Duration":
            out.append(["duration", str(msg.ToTimedelta()), msg.ToJsonString()])
        if key == "google.protobuf.Struct":
            out.append(["struct", sorted(msg.keys()), repr(sorted(msg.items()))])
        for field, value in msg.ListFields():
            if field.message_type is None:
                continue
            if field.message_type.GetOptions().map_entry:
                values = list(value.values())
            elif field.is_repeated:
                values = list(value)
            else:
                values = [value]
            for v in values:
                if isinstance(v, message.Message):
                    walk(v, seen, out)

    def protos():
        # each resource parsed with the class of its type in the default pool
        out = []
        for kind, blob in corpus[:: 7]:
            klass = cls(urls[kind][len("type.googleapis.com/"):])
            try:
                msg = klass.FromString(blob)
            except message.DecodeError as err:
                out.append(["decode error", str(err)])
                continue
            types = []
            walk(msg, set(), types)
            again = pickle.loads(pickle.dumps(msg))
            out.append(
                [
                    text(msg),
                    repr(msg) == str(msg),
                    types,
                    again == msg and type(again) is klass,
                    symbol_database.Default().GetSymbol(klass.DESCRIPTOR.full_name) is klass,
                ]
            )
        return out

    def decode():
        out = []
        for kind, blob in corpus:
            if kind == "LDS":
                out.append(repr(decode_listener(blob, providers)))
            else:
                out.append(repr(res.RESOURCE_TYPES[urls[kind]].decode(blob, use_memo=False)))
        return out

    def ads():
        log = []
        clock = FakeClock()
        node = ads_state.base_pb2.Node(id="node-1", cluster="cluster-1")
        state = ads_state.AdsState(
            Server(), node, resource_types=res.RESOURCE_TYPES, clock=clock,
            wall_clock=lambda: 1_700_000_000.0 + clock.now(),
        )
        names = {}
        for i, (kind, blob) in enumerate(corpus):
            names.setdefault(kind, []).append(blob)
        responses = []
        for kind, blobs in sorted(names.items()):
            response = ads_state.discovery_pb2.DiscoveryResponse(
                version_info="1", nonce="n-" + kind, type_url=urls[kind]
            )
            for blob in blobs:
                response.resources.add(type_url=urls[kind], value=blob)
            responses.append(response)
        for name in ["lis", "inline", "filters", "r", "c", "eds", "agg", "dns", "wrapped", "empty"]:
            for url in urls.values():
                state.add_watcher(url, name, Watcher(log, name))
        state.on_stream_started()
        requests = [text_format.MessageToString(r) for r in state.take_requests()]
        for response in responses:
            state.on_response(response)
            requests += [text_format.MessageToString(r) for r in state.take_requests()]
        wrapped = ads_state.discovery_pb2.DiscoveryResponse.FromString(extra["wrapped"])
        state.on_response(wrapped)
        requests += [text_format.MessageToString(r) for r in state.take_requests()]
        config = csds.client_config(node, state.snapshot())
        try:
            dump = text_format.MessageToString(csds.client_config_proto(config))
        except Exception as err:  # an entry whose raw bytes do not parse (see the report)
            dump = repr(err)
        good = [e for e in config["generic_xds_configs"] if e["client_status"] == "ACKED"]
        good = text_format.MessageToString(
            csds.client_config_proto({**config, "generic_xds_configs": good})
        )
        # protobuf's JSON of a resource needs every type it names in the pool,
        # so the dump's xds_config depends on what the program loaded (see
        # the test): kept apart from the rest
        json_form = [e.pop("xds_config", None) for e in config["generic_xds_configs"]]
        return {
            "requests": requests,
            "watchers": log,
            "csds": config,
            "csds_acked": good,
            "csds_json": json_form,
            "csds_proto": dump,
        }

    def others():
        out = {}
        report = orca.parse_report(extra["orca"])
        out["orca"] = [text_format.MessageToString(report), type(report).__module__,
                       sorted(report.named_metrics.items())]
        out["orca_bad"] = repr(orca.parse_report(b"\\xff\\xff"))
        lrs = LrsStreamState(ads_state.base_pb2.Node(id="n"))
        out["lrs_initial"] = text_format.MessageToString(lrs.initial_request())
        response = type(lrs.initial_request()).DESCRIPTOR.file.pool.FindMessageTypeByName(
            "envoy.service.load_stats.v3.LoadStatsResponse")
        response = message_factory.GetMessageClass(response).FromString(extra["lrs"])
        out["lrs_restart"] = lrs.on_response(response)
        report = ClusterLoadReport("c", "e", 1.5, dropped_requests={"x": 2}, uncategorized_drops=1)
        request = lrs.report_request([report])
        out["lrs_report"] = text_format.MessageToString(request)
        from pyxds.protos import rls_pb2
        rls = rls_pb2.RouteLookupResponse.FromString(extra["rls"])
        out["rls"] = text_format.MessageToString(rls)
        return out

    def run():
        return {"decode": decode(), "ads": ads(), "protos": protos(), "others": others()}

    def identity():
        # every class pyxds holds through a generated module's name is that
        # module's class, and the messages it parsed are its instances
        wrong = []
        checked = 0
        for modname, module in sorted(sys.modules.items()):
            if not modname.startswith("pyxds.") or modname.startswith("pyxds.protos"):
                continue
            for gname, value in sorted(vars(module).items()):
                real_name = getattr(value, "__name__", None)
                if not gname.endswith("_pb2") or real_name not in generated:
                    continue
                real = importlib.import_module(real_name)
                for attr, cls_ in vars(real).items():
                    if isinstance(cls_, type) and issubclass(cls_, message.Message):
                        checked += 1
                        if getattr(value, attr, None) is not cls_:
                            wrong.append([modname, gname, attr])
        from envoy.config.cluster.v3 import cluster_pb2
        from envoy.config.listener.v3 import listener_pb2
        from google.protobuf import any_pb2, duration_pb2
        cluster = cluster_pb2.Cluster(name="x", type=cluster_pb2.Cluster.EDS)
        cluster.eds_cluster_config.eds_config.ads.SetInParent()
        parsed = res.CLUSTER.decode(cluster.SerializeToString())
        lis = ads_state.discovery_pb2.DiscoveryResponse().resources.add()
        lis.Pack(listener_pb2.Listener(name="l"))
        return {
            "wrong": wrong,
            "checked": checked,
            "any": isinstance(lis, any_pb2.Any) and lis.Is(listener_pb2.Listener.DESCRIPTOR),
            "duration": isinstance(duration_pb2.Duration(), message.Message),
            "ack": parsed.error is None,
        }

    out = {"first": run()}
    if mode == "after":
        for name in generated:
            importlib.import_module(name)
        out["again"] = run()
    if mode != "never":
        out["identity"] = identity()
    print(json.dumps(out))
    """
)


@cache
def child(mode: str) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            mode,
            json.dumps(_generated_modules()),
            json.dumps(PROVIDERS),
        ],
        env={**os.environ, "PYTHONHASHSEED": "0"},
        input=json.dumps(
            {
                "corpus": [(kind, data.hex()) for kind, data in corpus()],
                "extra": _extra(),
                "urls": URLS,
            }
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_corpus_has_acks_and_nacks_of_every_type() -> None:
    """The comparison below is not vacuous: every type ACKs and NACKs."""
    decoded = child("never")["first"]["decode"]
    kinds = [kind for kind, _ in corpus()]
    for kind in URLS:
        seen = [d for k, d in zip(kinds, decoded, strict=True) if k == kind]
        acks = [d for d in seen if d.endswith(", None)") or d.endswith("error=None)")]
        assert len(acks) >= 2, (kind, seen)
        assert len(seen) - len(acks) >= 5, (kind, seen)
    requests = child("never")["first"]["ads"]["requests"]
    assert any("error_detail" in r for r in requests), "no NACK sent"
    assert any("error_detail" not in r and "response_nonce" in r for r in requests), "no ACK"


@pytest.mark.parametrize("mode", ["before", "after"])
def test_decode_ack_nack_and_csds_are_the_same_whenever_the_generated_modules_load(
    mode: str,
) -> None:
    """Everything but the JSON form of the CSDS dump: protobuf's JSON needs
    every type a resource names, also those pyxds never loads (the router
    filter's, named by every Listener), so that part shows what the program
    imported, not what pyxds did; ``after`` compares it too, before the
    program's imports."""
    never = child("never")["first"]
    out = child(mode)
    runs = [out["first"], out["again"]] if mode == "after" else [out["first"]]
    for run in runs:
        for part in ("decode", "others", "protos"):
            assert run[part] == never[part], part
        for part, value in never["ads"].items():
            if part not in ("csds_json", "csds_proto"):
                assert run["ads"][part] == value, part
    if mode == "after":
        assert out["first"]["ads"] == never["ads"]


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_program_importing_the_generated_modules_gets_the_classes_pyxds_uses(mode: str) -> None:
    identity = child(mode)["identity"]
    assert identity["wrong"] == []
    assert identity["checked"] >= 60
    assert identity["any"] and identity["duration"] and identity["ack"]


def test_message_classes_carry_their_generated_modules_names() -> None:
    """Classes have the module and qualified name the generated module gives
    them (repr, pickling by reference), also for nested and Any-packed types."""
    protos = child("never")["first"]["protos"]
    types = [t[1:] for entry in protos if len(entry) == 5 for t in entry[2] if t[0] == "type"]
    assert len(types) >= 40
    for full_name, module, qualname in types:
        package = full_name.rsplit(".", qualname.count(".") + 1)[0]
        assert module.endswith("_pb2"), (full_name, module)
        assert full_name == f"{package}.{qualname}", (full_name, module, qualname)
    assert all(entry[3] and entry[4] for entry in protos if len(entry) == 5)  # pickle, sym db
    seen = {t[0] for entry in protos if len(entry) == 5 for t in entry[2]}
    assert {"duration", "struct", "any"} <= seen
    unpacked = [t for entry in protos if len(entry) == 5 for t in entry[2] if len(t) == 4]
    assert unpacked and all(t[0] != "any" or t[2:] == [True, True] for t in unpacked)


def test_a_csds_dump_converts_when_a_resource_names_a_type_the_program_never_loaded() -> None:
    """Every Listener names the router filter, whose module pyxds never
    imports: its JSON form stays opaque in the dump dict, and the
    ``ClientConfig`` proto (the CSDS service's answer) carries its bytes
    instead of failing the whole dump."""
    ads = child("never")["first"]["ads"]
    opaque = [j for j in ads["csds_json"] if j and "value" in j and len(j) == 2]
    assert opaque  # the case happens in a plain program
    assert not ads["csds_proto"].startswith("ParseError"), ads["csds_proto"][:300]
    assert ads["csds_proto"].count("generic_xds_configs {") == len(ads["csds_json"])
