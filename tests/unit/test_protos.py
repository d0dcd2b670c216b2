"""pyxds.protos: the generated grpc.lookup.v1 modules are what
scripts/gen_protos.py makes of proto/ today, and coexist in protobuf's pool."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_checked_in_modules_are_up_to_date():
    pytest.importorskip("grpc_tools")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_the_messages_have_grpc_protos_names_and_round_trip():
    from pyxds.protos import ROUTE_LOOKUP_METHOD, rls_config_pb2, rls_pb2

    request = rls_pb2.RouteLookupRequest(
        target_type="grpc",
        reason=rls_pb2.RouteLookupRequest.REASON_STALE,
        key_map={"k": "v"},
        stale_header_data="h",
    )
    assert rls_pb2.RouteLookupRequest.FromString(request.SerializeToString()) == request
    assert request.DESCRIPTOR.full_name == "grpc.lookup.v1.RouteLookupRequest"
    assert request.DESCRIPTOR.file.name == "grpc/lookup/v1/rls.proto"
    spec = rls_config_pb2.RouteLookupClusterSpecifier()
    assert spec.DESCRIPTOR.full_name == "grpc.lookup.v1.RouteLookupClusterSpecifier"
    service = rls_pb2.DESCRIPTOR.services_by_name["RouteLookupService"]
    method = service.methods_by_name["RouteLookup"]
    assert f"/{service.full_name}/{method.name}" == ROUTE_LOOKUP_METHOD
