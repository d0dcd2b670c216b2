"""xdstp resource names in the XdsClient (gRFC A47): the canonical form a
name is subscribed and cached under, and names that do not parse.

C-core XdsClient::ParseXdsResourceName / ConstructFullXdsResourceName (the
query parameters canonicalised by key, the path's first segment checked
against the resource type) and test/core/xds/xds_client_test.cc
FederationWithUnparseableXdstpResourceName; AdsResponseParser::ParseResource
("Cannot parse xDS resource name" in the NACK).  Sans-IO over AdsState, and
the XdsClient with a fake transport.
"""

from __future__ import annotations

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from test_xds_client_ads_state import (
    CDS,
    LDS,
    RecordingWatcher,
    _encode,
    connected_stream,
    make_state,
    res,
)
from test_xds_client_client import (  # noqa: F401  (env: a pytest fixture)
    TYPES,
    FakeTransport,
    ThreadWatcher,
    env,
    real_bootstrap,
)

from pyxds.testing.fake_clock import FakeClock
from pyxds.xds.ads_state import CacheState, canonical_resource_name
from pyxds.xds.client import XdsClient

CLUSTER_PATH = "xdstp://auth/envoy.config.cluster.v3.Cluster"


def _response(type_url: str, version: str, nonce: str, *named: tuple[str, str]):
    msg = discovery_pb2.DiscoveryResponse(type_url=type_url, version_info=version, nonce=nonce)
    for name, value in named:
        msg.resources.add(type_url=type_url, value=_encode(type_url, name, value))
    return msg


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("plain-name?b=2&a=1", "plain-name?b=2&a=1"),  # old-style: opaque
        (f"{CLUSTER_PATH}/c", f"{CLUSTER_PATH}/c"),
        (f"{CLUSTER_PATH}/c?b=2&a=1", f"{CLUSTER_PATH}/c?a=1&b=2"),
        (f"{CLUSTER_PATH}/c?a=1&a=3", f"{CLUSTER_PATH}/c?a=3"),  # the last one wins
        (f"{CLUSTER_PATH}/c/d?z=&y=1#frag", f"{CLUSTER_PATH}/c/d?y=1&z="),
        # what grpcio 1.85 was seen requesting for these names
        (f"{CLUSTER_PATH}/a%3Ab", f"{CLUSTER_PATH}/a:b"),
        (f"{CLUSTER_PATH}/a%2Fb", f"{CLUSTER_PATH}/a/b"),
        (f"{CLUSTER_PATH}/c?k=a%3Ab&j", f"{CLUSTER_PATH}/c?j=&k=a:b"),
        (f"{CLUSTER_PATH}/a%zz", f"{CLUSTER_PATH}/a%25zz"),
        (f"{CLUSTER_PATH}/\u00fc", f"{CLUSTER_PATH}/%C3%BC"),
        (f"{CLUSTER_PATH}/c?b=1&a=2&b=3", f"{CLUSTER_PATH}/c?a=2&b=3"),
        (
            "xdstp://Names.Example/envoy.config.cluster.v3.Cluster/c",
            "xdstp://Names.Example/envoy.config.cluster.v3.Cluster/c",
        ),
    ],
)
def test_xdstp_name_is_canonicalised_as_c_core_does(name, canonical):
    """C-core ParseXdsResourceName: the path and query percent-decoded, the
    query parameters through a map (sorted by key, the last wins);
    ConstructFullXdsResourceName encodes them again and drops the fragment.
    The cases after the first five are what grpcio 1.85 put on the wire for
    these route cluster names (probed with pyxds.server)."""
    assert canonical_resource_name(name, CDS) == canonical


@pytest.mark.parametrize(
    "name", ["xdstp://x", "xdstp://auth/envoy.config.listener.v3.Listener/c", "xdstp://auth/"]
)
def test_xdstp_name_whose_path_is_not_the_resource_type_does_not_parse(name):
    """C-core: "xdstp URI path must indicate valid xDS resource type"."""
    with pytest.raises(ValueError, match="must indicate valid xDS resource type"):
        canonical_resource_name(name, CDS)


def test_subscription_carries_the_canonical_xdstp_name():
    """The request names the resource as C-core's ConstructFullXdsResourceName
    writes it: parameters sorted."""
    state, _ = make_state()
    state.add_watcher(CDS, f"{CLUSTER_PATH}/c?b=2&a=1", RecordingWatcher())
    (req,) = connected_stream(state)
    assert list(req.resource_names) == [f"{CLUSTER_PATH}/c?a=1&b=2"]


def test_two_spellings_of_one_xdstp_name_share_one_subscription():
    """Both watches are one cache entry (C-core keys it by the parsed name;
    grpc-go TestFederation_*ResourceContextParamOrder, grpc-java
    ldsResourceUpdated_withXdstpResourceName_witUnorderedContextParams):
    one name subscribed, both watchers told."""
    state, _ = make_state()
    first, second = RecordingWatcher(), RecordingWatcher()
    state.add_watcher(CDS, f"{CLUSTER_PATH}/c?b=2&a=1", first)
    state.add_watcher(CDS, f"{CLUSTER_PATH}/c?a=1&b=2", second)
    (req,) = connected_stream(state)
    assert list(req.resource_names) == [f"{CLUSTER_PATH}/c?a=1&b=2"]
    state.on_response(_response(CDS, "1", "A", (f"{CLUSTER_PATH}/c?a=1&b=2", "v")))
    want = [("changed", res(CDS, f"{CLUSTER_PATH}/c?a=1&b=2", "v"))]
    assert first.take() == want and second.take() == want


def test_response_resource_with_its_parameters_in_another_order_reaches_the_watcher():
    """C-core parses a response resource's name the same way before it looks
    the subscription up: the server may write the parameters in any order."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, f"{CLUSTER_PATH}/c?a=1&b=2", watcher)
    connected_stream(state)
    state.on_response(_response(CDS, "1", "A", (f"{CLUSTER_PATH}/c?b=2&a=1", "v")))
    assert watcher.take() == [("changed", res(CDS, f"{CLUSTER_PATH}/c?b=2&a=1", "v"))]
    (ack,) = state.take_requests()
    assert ack.version_info == "1" and not ack.HasField("error_detail")


def test_lds_resource_with_parameters_reordered_is_not_read_as_deleted():
    """LDS/CDS responses are complete: the resource present under another
    spelling of its name is present, not deleted."""
    state, _ = make_state(a88=False)
    name = "xdstp://auth/envoy.config.listener.v3.Listener/l?x=1&y=2"
    watcher = RecordingWatcher()
    state.add_watcher(LDS, name, watcher)
    connected_stream(state)
    state.on_response(_response(LDS, "1", "A", (name, "v")))
    watcher.take()
    other_spelling = name.replace("x=1&y=2", "y=2&x=1")
    state.on_response(_response(LDS, "2", "B", (other_spelling, "v")))
    # the resource itself carries the server's spelling: a new value, no error
    assert watcher.take() == [("changed", res(LDS, other_spelling, "v"))]
    (entry,) = state.snapshot()
    assert entry.state is CacheState.ACKED


def test_response_resource_whose_xdstp_name_does_not_parse_is_nacked():
    """C-core AdsResponseParser::ParseResource: "resource index N: <name>:
    Cannot parse xDS resource name"; the other resources are applied."""
    state, _ = make_state()
    watcher = RecordingWatcher()
    state.add_watcher(CDS, "c", watcher)
    connected_stream(state)
    bad = "xdstp://auth/envoy.config.listener.v3.Listener/c"
    state.on_response(_response(CDS, "1", "A", (bad, "v"), ("c", "v")))
    (nack,) = state.take_requests()
    assert f"resource index 0: {bad}: Cannot parse xDS resource name" in nack.error_detail.message
    assert watcher.take() == [("changed", res(CDS, "c", "v"))]


def test_watch_of_unparseable_xdstp_name_fails_at_once(env):  # noqa: F811
    """C-core XdsClientTest.FederationWithUnparseableXdstpResourceName:
    INVALID_ARGUMENT "Unable to parse resource name xdstp://x"; nothing is
    subscribed."""
    watcher = ThreadWatcher()
    env.client.watch(CDS, "xdstp://x", watcher)
    ((kind, status),) = watcher.wait()
    assert kind == "changed" and status.code == grpc.StatusCode.INVALID_ARGUMENT
    assert status.details == "Unable to parse resource name xdstp://x"
    assert env.transports == []


def test_server_reported_error_names_are_canonicalised_too():
    """A88 (TP3) ``resource_errors``: C-core parses their names as it parses
    resources' (HandleServerReportedResourceError): another spelling reaches
    the watcher, a name that does not parse is in the NACK."""
    state, _ = make_state(a88=True)
    watcher = RecordingWatcher()
    state.add_watcher(CDS, f"{CLUSTER_PATH}/c?a=1&b=2", watcher)
    connected_stream(state)
    msg = _response(CDS, "1", "A")
    for name in (f"{CLUSTER_PATH}/c?b=2&a=1", "xdstp://x"):
        err = msg.resource_errors.add()
        err.resource_name.name = name
        err.error_detail.code = grpc.StatusCode.PERMISSION_DENIED.value[0]
        err.error_detail.message = "no"
    state.on_response(msg)
    ((kind, status),) = watcher.take()
    assert kind == "changed" and status.code == grpc.StatusCode.PERMISSION_DENIED
    (nack,) = state.take_requests()
    assert "resource_errors index 1: xdstp://x: Cannot parse xDS resource name" in (
        nack.error_detail.message
    )


def _client_with_authorities(authorities: dict) -> tuple[XdsClient, list[FakeTransport]]:
    config = real_bootstrap()
    config["authorities"] = authorities
    transports: list[FakeTransport] = []
    client = XdsClient(
        config,
        clock=FakeClock(),
        resource_types=TYPES,
        transport_factory=lambda ch: transports.append(FakeTransport(ch)) or transports[-1],
    )
    return client, transports


def test_authority_without_servers_shares_the_top_level_stream():
    """C-core XdsClientTest.FederationAuthorityDefaultsToTopLevelXdsServer:
    an authority with no xds_servers uses the top-level server, and its
    names go in the same request as the old-style ones."""
    client, transports = _client_with_authorities({"xds.example.com": {}})
    xdstp = "xdstp://xds.example.com/envoy.config.listener.v3.Listener/foo2"
    try:
        client.watch(LDS, "foo1", ThreadWatcher())
        client.watch(LDS, xdstp, ThreadWatcher())
        client.dump()  # the serializer has run both watches
        (transport,) = transports
        assert transport.channel.server.server_uri == "127.0.0.1:1"
        assert list(transport.requests()[-1].resource_names) == ["foo1", xdstp]
    finally:
        client.close()


def test_xdstp_name_with_empty_authority_uses_the_empty_authority_entry():
    """grpc-java ldsResourceUpdated_withXdstpResourceName_withEmptyAuthority:
    ``xdstp:///...`` is the bootstrap's "" authority."""
    client, transports = _client_with_authorities(
        {
            "": {
                "xds_servers": [
                    {"server_uri": "127.0.0.1:7", "channel_creds": [{"type": "insecure"}]}
                ]
            }
        }
    )
    name = "xdstp:///envoy.config.listener.v3.Listener/listener1"
    try:
        client.watch(LDS, name, ThreadWatcher())
        client.dump()
        (transport,) = transports
        assert transport.channel.server.server_uri == "127.0.0.1:7"
        assert list(transport.requests()[-1].resource_names) == [name]
    finally:
        client.close()


def test_empty_authority_keeps_its_double_slash():
    """``xdstp:///type/id`` stays as written (grpc-java's form).  grpcio 1.85
    requests it as ``xdstp:/type/id``, a name no server holding the
    original spelling matches (docs/differences-from-c-core.md)."""
    name = "xdstp:///envoy.config.cluster.v3.Cluster/e"
    assert canonical_resource_name(name, CDS) == name
