"""CSDS conformance (gRFC A40, A71 ``client_scope``): what a CSDS client reads
from an XdsClient's cache, replayed from C-core's
``test/cpp/end2end/xds/xds_csds_end2end_test.cc``, grpc-go's
``xds/csds/csds_e2e_test.go`` and grpc-java's ``CsdsServiceTest``.

Sans-IO: a real XdsClient with real resource types over a fake transport and
FakeClock; the CSDS answer is built as the admin service builds it
(:func:`pyxds.admin.csds.client_status_response`). The service over real
sockets and the comparison with C-core are in
``tests/e2e/test_conformance_csds_service.py`` and
``tests/e2e/test_differential_csds.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import any_pb2
from test_xds_client_client import FakeTransport, ThreadWatcher, real_bootstrap

from pyxds.admin import csds as admin_csds
from pyxds.server import builders as b
from pyxds.testing.fake_clock import FakeClock
from pyxds.xds import csds
from pyxds.xds.ads_state import DATA_ERROR_HANDLING_ENV
from pyxds.xds.bootstrap import load_bootstrap
from pyxds.xds.client import XdsClient
from pyxds.xds.resources import ENDPOINTS_TYPE_URL as EDS
from pyxds.xds.resources import LISTENER_TYPE_URL as LDS

STATUS = csds_pb2.ClientConfig.GenericXdsConfig.DESCRIPTOR.fields_by_name["client_status"].enum_type


def make_env(*features: str) -> SimpleNamespace:
    transports: list[FakeTransport] = []
    bootstrap = load_bootstrap(
        {
            **real_bootstrap(features=features),
            "node": {
                "id": "csds-node",
                "cluster": "csds-cluster",
                "locality": {"region": "r", "zone": "z", "sub_zone": "s"},
                "metadata": {"k": "v", "n": 1},
            },
        }
    )
    clock = FakeClock()
    client = XdsClient(
        bootstrap,
        clock=clock,
        transport_factory=lambda ch: transports.append(FakeTransport(ch)) or transports[-1],
    )
    return SimpleNamespace(client=client, transports=transports, clock=clock)


@pytest.fixture
def env():
    made = make_env()
    yield made
    made.client.close()


def send(env, type_url: str, version: str, nonce: str, *resources: bytes) -> None:
    msg = discovery_pb2.DiscoveryResponse(type_url=type_url, version_info=version, nonce=nonce)
    for value in resources:
        msg.resources.add(type_url=type_url, value=value)
    env.transports[0].respond(msg)


def eds(name: str, port: int) -> bytes:
    return b.endpoints(name, [b.locality(endpoints=[f"127.0.0.1:{port}"])]).SerializeToString()


def bad_eds(name: str) -> bytes:
    """An EDS resource C-core and pyxds reject: a locality without ``locality``
    (C-core ``XdsConfigDumpEndpointError``)."""
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=name)
    group = cla.endpoints.add()
    group.load_balancing_weight.value = 1
    group.lb_endpoints.add().endpoint.address.socket_address.port_value = 2
    return cla.SerializeToString()


def proto_of(env) -> Any:
    return csds.client_config_proto(env.client.dump())


def table(config: Any) -> dict[str, tuple[str, str, str | None, bool, bool]]:
    """name -> (status, version, NACKed version, has xds_config, has last_updated)."""
    return {
        x.name: (
            STATUS.values_by_number[x.client_status].name,
            x.version_info,
            x.error_state.version_info if x.HasField("error_state") else None,
            x.HasField("xds_config"),
            x.HasField("last_updated"),
        )
        for x in config.generic_xds_configs
    }


def test_xds_config_is_the_resource_as_received_unknown_fields_included(env):
    """A40 "Detail: Expose xDS Config As Is": the dump carries the resource the
    way gRPC received it. C-core keeps the serialized resource
    (``XdsClient::ResourceState::serialized_proto``) and grpc-go's
    ``TestCSDS`` compares ``xds_config`` with the Any the server sent; a
    field this process's protos do not know (a newer xDS API's) must
    survive, and so must the server's byte order."""
    env.client.watch(EDS, "e", ThreadWatcher())
    env.transports[0].connected()
    known = eds("e", 1)
    unknown_field = bytes([0xF8, 0xFF, 0x3F, 0x07])  # field 131071, varint 7
    received = unknown_field + known  # the server's order: unknown field first
    send(env, EDS, "1", "n1", received)
    (entry,) = proto_of(env).generic_xds_configs
    assert entry.client_status == STATUS.values_by_name["ACKED"].number
    assert entry.xds_config == any_pb2.Any(type_url=EDS, value=received)
    # The dict form (config_dump, pyxds inspect) is still the JSON of the resource.
    (as_dict,) = env.client.dump()["generic_xds_configs"]
    assert as_dict["xds_config"]["cluster_name"] == "e"


def test_never_accepted_nacked_resource_has_error_state_only(env):
    """A NACKED resource that was never accepted has no ``version_info``,
    ``xds_config`` or ``last_updated``, only ``error_state`` with the rejected
    version (grpc-java ``CsdsService.getClientConfigForXdsClient``: version,
    time and resource only with a raw resource; C-core fills them only from
    an accepted resource)."""
    env.client.watch(EDS, "e", ThreadWatcher())
    env.transports[0].connected()
    send(env, EDS, "7", "n1", bad_eds("e"))
    (entry,) = proto_of(env).generic_xds_configs
    assert table(proto_of(env)) == {"e": ("NACKED", "", "7", False, False)}
    # C-core's framing of a NACK's error (its ResourceState::SetNacked)
    assert entry.error_state.details.startswith("invalid resource: ")
    assert "endpoints[0].locality" in entry.error_state.details
    assert entry.error_state.HasField("last_update_attempt")


def test_nack_then_accept_follows_a40_example(env):
    """A40 "ADS Parsing Logic Update" example, with A46's rule that the valid
    resources of a NACKed response are accepted (C-core, grpc-go
    ``TestCSDS_NACK``: the good one ACKED at the new version, the bad one
    NACKED at the old version with the rejected version in error_state); an
    accepted update clears the error state ("Accepted update will clean
    error states"); an EDS resource left out of a response keeps its state."""
    for name in "abc":
        env.client.watch(EDS, name, ThreadWatcher())
    env.transports[0].connected()
    send(env, EDS, "1", "n1", eds("a", 1), eds("b", 2), eds("c", 3))
    assert table(proto_of(env)) == {n: ("ACKED", "1", None, True, True) for n in "abc"}
    send(env, EDS, "2", "n2", eds("a", 1), bad_eds("b"))
    assert table(proto_of(env)) == {
        "a": ("ACKED", "2", None, True, True),
        "b": ("NACKED", "1", "2", True, True),
        "c": ("ACKED", "1", None, True, True),
    }
    send(env, EDS, "3", "n3", eds("c", 4))
    assert table(proto_of(env))["b"] == ("NACKED", "1", "2", True, True)
    send(env, EDS, "4", "n4", eds("b", 5), eds("c", 4))
    config = proto_of(env)
    assert table(config) == {
        "a": ("ACKED", "2", None, True, True),
        "b": ("ACKED", "4", None, True, True),
        "c": ("ACKED", "4", None, True, True),
    }
    b_entry = next(x for x in config.generic_xds_configs if x.name == "b")
    assert b_entry.xds_config.value == eds("b", 5)


def listener(name: str) -> bytes:
    return b.listener(name, route_config_name="r").SerializeToString()


def error_fields(entry: Any) -> tuple[str, ...]:
    return tuple(sorted(f.name for f, _ in entry.error_state.ListFields()))


def test_deleted_listener_has_the_deleting_version_as_its_error(env):
    """A88 "Cache Entry States": a DOES_NOT_EXIST entry "will contain an error
    indicating how the deletion occurred". C-core
    (``ResourceState::SetDoesNotExistOnLdsOrCdsDeletion``, seen live in
    tests/e2e/test_differential_csds.py): details "does not exist", the
    deleting response's version and time; the dropped resource's version,
    time and bytes are gone."""
    env.client.watch(LDS, "l", ThreadWatcher())
    env.transports[0].connected()
    send(env, LDS, "1", "n1", listener("l"))
    send(env, LDS, "2", "n2")
    (entry,) = proto_of(env).generic_xds_configs
    assert table(proto_of(env)) == {"l": ("DOES_NOT_EXIST", "", "2", False, False)}
    assert entry.error_state.details == "does not exist"
    assert error_fields(entry) == ("details", "last_update_attempt", "version_info")


def test_ignored_deletion_keeps_the_resource_and_says_does_not_exist():
    """A53 ``ignore_resource_deletion`` with A88's cache states: the entry is
    DOES_NOT_EXIST, still holds the resource (version 1, its bytes) and the
    deletion is its error (C-core ``SetDoesNotExistOnLdsOrCdsDeletion``
    without dropping the resource)."""
    env = make_env("ignore_resource_deletion")
    try:
        env.client.watch(LDS, "l", ThreadWatcher())
        env.transports[0].connected()
        send(env, LDS, "1", "n1", listener("l"))
        send(env, LDS, "2", "n2")
        (entry,) = proto_of(env).generic_xds_configs
        assert table(proto_of(env)) == {"l": ("DOES_NOT_EXIST", "1", "2", True, True)}
        assert entry.xds_config.value == listener("l")
        assert entry.error_state.details == "does not exist"
    finally:
        env.client.close()


def test_does_not_exist_by_timer_has_an_error_with_details_only(env):
    """A88 "Cache Entry States" DOES_NOT_EXIST after the resource timer
    (C-core ``SetDoesNotExistOnTimeout``: "does not exist", no version, so
    ``FillGenericXdsConfig`` writes neither version nor time; C-core
    ``XdsConfigDumpListenerDoesNotExist``)."""
    env.client.watch(LDS, "l", ThreadWatcher())
    env.transports[0].connected()
    env.clock.advance(15.0)
    (entry,) = proto_of(env).generic_xds_configs
    assert table(proto_of(env)) == {"l": ("DOES_NOT_EXIST", "", "", False, False)}
    assert entry.error_state.details == "does not exist"
    assert error_fields(entry) == ("details",)


def test_timeout_has_an_error_naming_the_server(monkeypatch):
    """A88 "Cache Entry States" TIMEOUT ("the error will indicate the
    timeout") with ``resource_timer_is_transient_error`` (C-core
    ``SetTimeout``: "timeout obtaining resource from xDS server <uri>", no
    version or time), A88's env var guard on."""
    monkeypatch.setenv(DATA_ERROR_HANDLING_ENV, "true")
    env = make_env("resource_timer_is_transient_error")
    try:
        env.client.watch(LDS, "l", ThreadWatcher())
        env.transports[0].connected()
        env.clock.advance(30.0)
        (entry,) = proto_of(env).generic_xds_configs
        assert table(proto_of(env)) == {"l": ("TIMEOUT", "", "", False, False)}
        assert entry.error_state.details == "timeout obtaining resource from xDS server 127.0.0.1:1"
        assert error_fields(entry) == ("details",)
    finally:
        env.client.close()


def test_node_is_the_node_the_xds_server_receives(env):
    """A40 "Detail: Generated Node Information": ``ClientConfig.node`` is the
    Node the control plane receives, with the generated ``user_agent_name``,
    ``user_agent_version`` and ``client_features`` (C-core
    ``XdsConfigDumpVanilla`` EqNode, grpc-go ``TestCSDS`` wantNode)."""
    env.client.watch(LDS, "l", ThreadWatcher())
    sent = env.transports[0].requests()[0].node
    node = proto_of(env).node
    assert node == sent
    assert node.id == "csds-node" and node.cluster == "csds-cluster"
    assert node.locality.zone == "z" and node.metadata.fields["k"].string_value == "v"
    assert node.user_agent_name and node.user_agent_version
    assert "envoy.lb.does_not_support_overprovisioning" in node.client_features


def test_no_xds_client_gives_an_empty_response(monkeypatch):
    """No XdsClient in the process: CSDS answers, with no ``config`` (C-core
    ``XdsConfigDumpEmpty``, grpc-go ``TestCSDSNoXDSClient``, grpc-java
    ``fetchClientConfig_xdsClientPoolNotInitialized``)."""
    monkeypatch.setattr(XdsClient, "instances", classmethod(lambda cls: []))
    assert admin_csds.client_status_response() == csds_pb2.ClientStatusResponse()


def test_client_without_subscriptions_is_listed_with_its_node_and_scope():
    """An XdsClient that watches nothing yet is one ``ClientConfig`` with its
    node and ``client_scope`` and no resources (grpc-java
    ``getClientConfigForXdsClient_noSubscribedResources``)."""
    bootstrap = {**real_bootstrap(), "node": {"id": "csds-idle"}}
    _client, release = XdsClient.get_or_create(bootstrap, "xds:/idle")
    try:
        response = admin_csds.client_status_response()
        (config,) = [c for c in response.config if c.node.id == "csds-idle"]
        assert config.client_scope == "xds:/idle"
        assert list(config.generic_xds_configs) == []
    finally:
        release()


def test_two_targets_are_two_configs_each_with_its_own_listener():
    """A71 "Update CSDS to aggregate configs from multiple XdsClient
    instances": one ``ClientConfig`` per channel target, each with the
    resources of its own XdsClient (C-core ``XdsConfigDumpMultiClient``,
    grpc-java ``multipleXdsClients``, grpc-go ``TestCSDS``'s two clients)."""
    bootstrap = {**real_bootstrap(), "node": {"id": "csds-multi"}}
    one, release_one = XdsClient.get_or_create(bootstrap, "xds:/one")
    two, release_two = XdsClient.get_or_create(bootstrap, "xds:/two")
    try:
        one.watch(LDS, "one", ThreadWatcher())
        two.watch(LDS, "two", ThreadWatcher())
        response = admin_csds.client_status_response()
        configs = [c for c in response.config if c.node.id == "csds-multi"]
        assert [c.client_scope for c in configs] == ["xds:/one", "xds:/two"]
        assert [[x.name for x in c.generic_xds_configs] for c in configs] == [["one"], ["two"]]
    finally:
        release_one()
        release_two()


class _Aborted(Exception):
    pass


class _Context:
    """What the servicer needs of ``grpc.ServicerContext``."""

    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted


def test_node_matchers_are_refused_with_invalid_argument():
    """A40 "Detail: Node Matching": a request with node matchers fails
    INVALID_ARGUMENT (grpc-java ``fetchClientConfig_invalidArgument`` and
    ``streamClientStatus_requestInvalid``: the answers before it are sent,
    then the stream ends; grpc-go ``buildClientStatusRespForReq``). C-core
    ignores them (docs/differences-from-c-core.md)."""
    import grpc

    servicer = admin_csds.CsdsServicer()
    refused = csds_pb2.ClientStatusRequest()
    refused.node_matchers.add().node_id.exact = "x"
    context = _Context()
    with pytest.raises(_Aborted):
        servicer.FetchClientStatus(refused, context)
    assert context.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "node_matchers not supported")

    context = _Context()
    plain = csds_pb2.ClientStatusRequest()
    answers = servicer.StreamClientStatus(iter([plain, refused, plain]), context)
    assert isinstance(next(answers), csds_pb2.ClientStatusResponse)
    with pytest.raises(_Aborted):
        next(answers)
    assert context.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "node_matchers not supported")
