"""The resource validators load what a resource names when it names it, and
decode exactly as when everything is loaded (issue 18, start-up).

A plain client config (LDS api_listener, RDS, CDS, EDS) must not load the
server side's validators (server Listener types, RBAC), RE2, protobuf's
JSON module or the SPIFFE bundle maps; a resource naming one of them loads
it then.  Each case decodes serialized resources in a fresh interpreter
(only ``pyxds.xds.resources`` imported, nothing else of pyxds) and
compares the results, ACK or NACK words alike, with the same bytes decoded
in an interpreter that loaded every module first (both with one hash seed,
so that reprs of sets compare).  Counts of modules, never times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from google.protobuf import struct_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.server import builders as b
from pyxds.server import inbound as ib

#: loaded only when a resource names what they validate
LAZY = (
    "pyxds.xds.resources.server_types",
    "pyxds.xds.resources.server_listener",
    "pyxds.xds.resources.rbac",
    "pyxds.security.spiffe",
    "re2",
    "google.protobuf.json_format",
)

PROVIDERS = {"default": {"plugin_name": "file_watcher", "config": {"ca_certificate_file": "x"}}}

#: what the "everything loaded" interpreter imports first
_EVERYTHING = (
    "import pyxds.serving, pyxds.security.providers, pyxds.security.spiffe, re2\n"
    "import google.protobuf.json_format, pyxds.xds.resources.server_listener\n"
)

_CHILD = textwrap.dedent(
    """
    import json, sys
    from pyxds.xds.resources import CLUSTER, ROUTE_CONFIG
    from pyxds.xds.resources.listener import decode_listener
    lazy = json.loads(sys.argv[1])
    providers = json.loads(sys.argv[2])

    def loaded():
        return sorted(m for m in lazy if m in sys.modules)

    out = {"at_import": loaded(), "results": [], "loaded": []}
    for kind, hexed in json.loads(sys.stdin.read()):
        data = bytes.fromhex(hexed)
        if kind == "LDS":
            result = decode_listener(data, providers)
        else:
            result = {"RDS": ROUTE_CONFIG, "CDS": CLUSTER}[kind].decode(data, use_memo=False)
        if not isinstance(result, tuple):  # a DecodeResult
            result = (result.name, result.resource, result.error)
        out["results"].append(repr(result))
        out["loaded"].append(loaded())
    print(json.dumps(out))
    """
)


def _decode(resources: list[tuple[str, bytes]], everything: bool = False) -> dict:
    """Decoded in a new interpreter: {"at_import": lazy modules loaded by the
    import, "results": reprs, "loaded": lazy modules loaded after each}."""
    code = (_EVERYTHING if everything else "") + _CHILD
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(LAZY), json.dumps(PROVIDERS)],
        env={**os.environ, "PYTHONHASHSEED": "0"},
        input=json.dumps([(kind, data.hex()) for kind, data in resources]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _plain() -> list[tuple[str, bytes]]:
    """What a plain client config is made of."""
    rc = b.route_config(
        "r", [b.virtual_host("vh", routes=[b.route(prefix="/svc/", cluster="c"), b.route("")])]
    )
    return [
        ("LDS", b.listener("lis", "r").SerializeToString()),
        ("LDS", b.listener("inline", route_config=rc).SerializeToString()),
        ("RDS", rc.SerializeToString()),
        ("CDS", b.cluster("c").SerializeToString()),
        ("CDS", b.cluster("rh", lb_policy="RING_HASH").SerializeToString()),
    ]


def _typed_struct_policy() -> typed_struct_pb2.TypedStruct:
    value = struct_pb2.Struct()
    value.update({"shuffleAddressList": True})
    return typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/pick_first", value=value)


#: resources naming a lazily loaded validator, and the modules each must load
NAMING_LAZY_TYPES = {
    "server Listener with RBAC": (
        "LDS",
        lambda: ib.istio_inbound_listener(
            "0.0.0.0:8080",
            strict=True,
            deny={"deny-0": ib.rbac_policy(principals=[ib.principal_name(exact="spiffe://a")])},
            allow={"allow-0": ib.rbac_policy()},
        ),
        {"pyxds.xds.resources.server_types", "pyxds.xds.resources.rbac"},
    ),
    "client Listener naming the RBAC filter": (
        "LDS",
        lambda: b.listener(
            "lis", "r", http_filters=[ib.rbac_filter("rbac", "ALLOW", {}), b.router_filter()]
        ),
        set(),
    ),
    "route regexes": (
        "RDS",
        lambda: b.route_config(
            "r",
            [
                b.virtual_host(
                    "vh",
                    routes=[
                        b.route(
                            regex="/svc/.*",
                            headers=[b.header_matcher("x-a", safe_regex="a+b", ignore_case=True)],
                            cluster="c",
                            hash_policies=[b.hash_policy("x-h", regex="[0-9]", substitution="#")],
                        )
                    ],
                )
            ],
        ),
        {"re2"},
    ),
    "an invalid regex (NACK)": (
        "RDS",
        lambda: b.route_config("r", [b.virtual_host("vh", routes=[b.route(regex="(?=x)")])]),
        {"re2"},
    ),
    "RLS cluster specifier plugin": (
        "RDS",
        lambda: b.route_config(
            "r",
            [b.virtual_host("vh", routes=[b.route(cluster_specifier_plugin="rls")])],
            [
                b.rls_plugin(
                    "rls",
                    b.route_lookup_config(
                        "rls.example:443",
                        [b.rls_key_builder("svc")],
                        lookup_service_timeout=1,
                    ),
                )
            ],
        ),
        {"google.protobuf.json_format"},
    ),
    "TypedStruct LB policy": (
        "CDS",
        lambda: b.cluster("c", load_balancing_policy=[("custom", _typed_struct_policy())]),
        {"google.protobuf.json_format"},
    ),
}


def test_a_plain_client_config_loads_no_lazily_loaded_validator() -> None:
    resources = _plain()
    out = _decode(resources)
    assert out["at_import"] == []
    assert out["loaded"][-1] == [], "a plain config loaded what it does not name"
    assert all(seen.endswith(", None)") for seen in out["results"]), out["results"]  # ACKs
    assert out["results"] == _decode(resources, everything=True)["results"]


@pytest.mark.parametrize("case", sorted(NAMING_LAZY_TYPES))
def test_a_resource_naming_a_lazily_loaded_type_decodes_as_with_everything_loaded(
    case: str,
) -> None:
    kind, build, loads = NAMING_LAZY_TYPES[case]
    resources = [(kind, build().SerializeToString())]
    out = _decode(resources)
    assert out["at_import"] == []
    everything = _decode(resources, everything=True)
    assert set(everything["at_import"]) >= loads  # the comparison is not vacuous
    assert out["results"] == everything["results"]
    assert loads <= set(out["loaded"][0])
