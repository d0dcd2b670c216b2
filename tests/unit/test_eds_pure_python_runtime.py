"""EDS decoding under protobuf's pure-Python runtime.

protobuf picks its runtime per platform (``upb`` where a wheel has it, the
pure-Python one elsewhere, or as ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION``
says).  pyxds must decode the same resources under either.  The EDS parser
once called ``ClusterLoadAssignment.HasField`` on each ``LbEndpoint``: upb
has one ``HasField`` for every message class and took it; the pure-Python
runtime's is per class and raised, so every EDS response was NACKed and a
plain ``xds:`` channel never served.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

_PROGRAM = textwrap.dedent(
    """
    import json
    from envoy.config.endpoint.v3 import endpoint_pb2
    from google.protobuf.internal import api_implementation
    from pyxds.xds.resources import ENDPOINTS

    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="c")
    locality = cla.endpoints.add()
    locality.locality.zone = "z"
    locality.load_balancing_weight.value = 1
    for port, weight in ((1001, 3), (1002, 0)):
        lbe = locality.lb_endpoints.add()
        address = lbe.endpoint.address.socket_address
        address.address, address.port_value = "127.0.0.1", port
        if weight:
            lbe.load_balancing_weight.value = weight
        lbe.metadata.filter_metadata["envoy.lb"].update({"hash_key": f"k{port}"})
    decoded = ENDPOINTS.decode(cla.SerializeToString())
    endpoints = decoded.resource.priorities[0][0].endpoints if decoded.error is None else ()
    print(json.dumps({
        "runtime": api_implementation.Type(),
        "error": decoded.error,
        "endpoints": [[e.addresses[0], e.weight, e.hash_key] for e in endpoints],
    }))
    """
)


def test_eds_decodes_the_same_under_the_pure_python_protobuf_runtime() -> None:
    seen = {}
    for runtime in ("upb", "python"):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": runtime,
        }
        proc = subprocess.run(
            [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=60, env=env
        )
        assert proc.returncode == 0, proc.stderr
        seen[runtime] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["python"]["runtime"] == "python"
    assert seen["python"]["error"] is None
    assert seen["python"]["endpoints"] == [
        ["127.0.0.1:1001", 3, "k1001"],
        ["127.0.0.1:1002", 1, "k1002"],
    ]
    assert seen["upb"] == {**seen["python"], "runtime": "upb"}
