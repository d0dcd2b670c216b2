"""``pyxds inspect`` shows each weighted_round_robin endpoint's weight and
its source, or why it has none (issue 19: never silent when no load report
can be had), from the channel's config dump."""

from __future__ import annotations

import io

from rich.console import Console

from pyxds.cli.inspect_model import build, wrr_weights
from pyxds.cli.inspect_view import tree_of


def render(dump_: dict, out: io.StringIO) -> None:
    """As ``pyxds inspect`` prints, on a console wide enough for one line each."""
    Console(file=out, highlight=False, width=400).print(tree_of(build(dump_)))


CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def endpoint(port: int) -> dict:
    return {
        "endpoint": {"address": {"socket_address": {"address": "10.0.0.1", "port_value": port}}}
    }


def dump(rows: list[dict]) -> dict:
    return {
        "target": "xds:///svc",
        "state": "READY",
        "status": "OK",
        "xds_client": {
            "generic_xds_configs": [
                {
                    "type_url": CLUSTER_TYPE,
                    "name": "foreign",
                    "client_status": "ACKED",
                    "version_info": "1",
                    "xds_config": {"name": "foreign", "type": "EDS"},
                },
                {
                    "type_url": CLA_TYPE,
                    "name": "foreign",
                    "client_status": "ACKED",
                    "version_info": "1",
                    "xds_config": {
                        "cluster_name": "foreign",
                        "endpoints": [
                            {"locality": {"zone": "z"}, "lb_endpoints": [endpoint(1), endpoint(2)]}
                        ],
                    },
                },
            ]
        },
        "subchannels": {"10.0.0.1:1": {"state": "READY"}, "10.0.0.1:2": {"state": "READY"}},
        "lb_policy": {
            "policy": "xds_cluster_manager_experimental",
            "children": {
                "cluster:foreign": {
                    "policy": "weighted_round_robin",
                    "cluster": "foreign",
                    "reporting": "per-call",
                    "endpoint_weights": rows,
                }
            },
        },
    }


def test_the_weights_and_their_source_are_shown():
    rows = [
        {"addresses": ["10.0.0.1:1"], "weight": 1000.0, "source": "out-of-band (stand-in)"},
        {"addresses": ["10.0.0.1:2"], "weight": 111.1, "source": "out-of-band (stand-in)"},
    ]
    model = build(dump(rows))
    eps = model["clusters"][0]["priorities"][0]["localities"][0]["endpoints"]
    assert [e["wrr"]["weight"] for e in eps] == [1000.0, 111.1]
    out = io.StringIO()
    render(dump(rows), out)
    assert "wrr weight 1000 (out-of-band (stand-in))" in out.getvalue()


def test_endpoints_without_weight_say_why():
    why = "its backend does not serve OpenRcaService (out-of-band load reports)"
    rows = [{"addresses": ["10.0.0.1:1"], "weight": 0.0, "source": "none yet", "no_weight": why}]
    assert wrr_weights(dump(rows)["lb_policy"]) == {
        ("foreign", "10.0.0.1:1"): {"weight": 0.0, "source": "none yet", "no_weight": why}
    }
    out = io.StringIO()
    render(dump(rows), out)
    assert "wrr: no weight (its backend does not serve OpenRcaService" in out.getvalue()
