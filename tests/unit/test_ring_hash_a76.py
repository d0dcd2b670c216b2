"""ring_hash gRFC A76: ``requestHashHeader`` (behind C-core's env var
GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY), the random-hash walk
for requests without the header, the non-xDS "hash attribute not present"
failure, and endpoint hash keys from EDS ``envoy.lb`` / ``hash_key``
metadata through the cds policy."""

from __future__ import annotations

import grpc
import pytest
import xxhash
from envoy.config.endpoint.v3 import endpoint_pb2
from test_cds_support import (
    build,
    cds_update,
    eds_cluster,
    eds_entry,
    loc,
    xds_config,
)

from pyxds.lb import (
    ConnectivityState,
    Endpoint,
    LBConfigError,
    PickComplete,
    PickFail,
    PickQueue,
    ResolverUpdate,
    registry,
)
from pyxds.lb.api import PickArgs
from pyxds.lb.ring_hash import REQUEST_HASH_HEADER_ENV, RingHash, RingHashConfig
from pyxds.testing import FakeHelper
from pyxds.xds.resources import ENDPOINTS
from pyxds.xds.resources.types import EndpointAddress, Locality

READY = ConnectivityState.READY
IDLE = ConnectivityState.IDLE
CONNECTING = ConnectivityState.CONNECTING
TF = ConnectivityState.TRANSIENT_FAILURE
NAME = "ring_hash_experimental"


@pytest.fixture
def a76(monkeypatch):
    monkeypatch.setenv(REQUEST_HASH_HEADER_ENV, "true")


def parse(body):
    return registry.select([{NAME: body}])[1]


def addr(port: int) -> str:
    return f"127.0.0.1:{port}"


def make(config: RingHashConfig, ports=(80, 81, 82), attrs=None, seed: int = 0):
    helper = FakeHelper(seed=seed)
    policy = RingHash(helper)
    attrs = attrs or {}
    endpoints = [Endpoint((addr(p),), attrs.get(p, {})) for p in ports]
    assert policy.update(ResolverUpdate(endpoints, config)) is None
    return policy, helper


def pick(helper: FakeHelper, metadata=(), **attributes):
    return helper.last.picker.pick(PickArgs("/s/m", tuple(metadata), attributes))


def owner(policy: RingHash, request_hash: int) -> str:
    ring = policy.ring
    return policy.endpoints[ring.endpoints[ring.start(request_hash)]].endpoint.addresses[0]


def make_ready(policy: RingHash, helper: FakeHelper, port: int) -> None:
    """Create the endpoint's child (as a pick would) and take it READY."""
    endpoint = next(e for e in policy.endpoints if e.endpoint.addresses[0] == addr(port))
    endpoint.request_connection()
    subchannel = helper.subchannel(addr(port))
    subchannel.set_state(CONNECTING)
    subchannel.set_state(READY)


# ---------------------------------------------------------------- config


def test_request_hash_header_is_ignored_without_the_env_var(monkeypatch):
    monkeypatch.delenv(REQUEST_HASH_HEADER_ENV, raising=False)
    assert parse({"requestHashHeader": "x-user"}) == RingHashConfig()
    assert parse({"requestHashHeader": "bad header!"}) == RingHashConfig()


def test_request_hash_header_is_parsed_with_the_env_var(a76):
    assert parse({"requestHashHeader": "x-user"}).request_hash_header == "x-user"
    assert parse({"requestHashHeader": "X-User"}).request_hash_header == "x-user"
    assert parse({"requestHashHeader": "x-user"}) == parse({"requestHashHeader": "x-user"})


@pytest.mark.parametrize("value", ["bad header", "x-user-bin", 7, ":path", "ü"])
def test_invalid_or_binary_request_hash_header_is_rejected_naming_the_field(a76, value):
    with pytest.raises(LBConfigError, match="requestHashHeader"):
        parse({"requestHashHeader": value})


# ---------------------------------------------------------------- picks


def test_header_value_is_hashed_with_xxh64(a76):
    policy, helper = make(parse({"requestHashHeader": "x-user"}))
    for port in (80, 81, 82):
        make_ready(policy, helper, port)
    for user in ("alice", "bob", "carol", "dave"):
        want = owner(policy, xxhash.xxh64_intdigest(user.encode(), seed=0))
        result = pick(helper, [("x-user", user)])
        assert isinstance(result, PickComplete) and result.subchannel.address == want
        assert pick(helper, [("x-user", user)]).subchannel.address == want  # sticky


def test_several_header_values_are_joined_with_a_comma(a76):
    policy, helper = make(parse({"requestHashHeader": "x-user"}))
    for port in (80, 81, 82):
        make_ready(policy, helper, port)
    want = owner(policy, xxhash.xxh64_intdigest(b"a,b", seed=0))
    assert pick(helper, [("x-user", "a"), ("x-user", "b")]).subchannel.address == want


def test_header_overrides_the_xds_hash(a76):
    policy, helper = make(parse({"requestHashHeader": "x-user"}))
    for port in (80, 81, 82):
        make_ready(policy, helper, port)
    want = owner(policy, xxhash.xxh64_intdigest(b"alice", seed=0))
    result = pick(helper, [("x-user", "alice")], request_hash=12345, cluster="cluster:c")
    assert result.subchannel.address == want


def test_request_without_the_header_goes_to_a_ready_endpoint(a76):
    policy, helper = make(parse({"requestHashHeader": "x-user"}), seed=5)
    make_ready(policy, helper, 81)
    helper.clock.advance(0)
    connects = {p: helper.subchannel(addr(p)).connect_calls for p in (81,)}
    for _ in range(30):
        result = pick(helper)
        assert isinstance(result, PickComplete) and result.subchannel.address == addr(81)
    assert helper.subchannel(addr(81)).connect_calls == connects[81]


def test_request_without_the_header_wakes_at_most_one_idle_endpoint(a76):
    """A76: walking from a random hash with nothing READY, at most one IDLE
    endpoint is asked to connect, and the pick queues."""
    policy, helper = make(parse({"requestHashHeader": "x-user"}), seed=1)
    assert all(e.state is IDLE for e in policy.endpoints)
    assert isinstance(pick(helper), PickQueue)
    helper.clock.advance(0)
    assert len(helper.subchannels) == 1  # one endpoint's child created


def test_request_without_the_header_wakes_nobody_while_one_connects(a76):
    policy, helper = make(parse({"requestHashHeader": "x-user"}), seed=1)
    endpoint = policy.endpoints[0]
    endpoint.request_connection()
    helper.subchannel(endpoint.endpoint.addresses[0]).set_state(CONNECTING)
    created = len(helper.subchannels)
    for _ in range(10):
        assert isinstance(pick(helper), PickQueue)
    helper.clock.advance(0)
    assert len(helper.subchannels) == created


def test_request_without_the_header_fails_when_every_endpoint_failed(a76):
    policy, helper = make(parse({"requestHashHeader": "x-user"}), ports=(80, 81))
    for endpoint in policy.endpoints:
        endpoint.request_connection()
        subchannel = helper.subchannel(endpoint.endpoint.addresses[0])
        subchannel.set_state(CONNECTING)
        subchannel.set_state(TF, "refused")
    result = pick(helper)
    assert isinstance(result, PickFail)
    assert result.status.code is grpc.StatusCode.UNAVAILABLE
    assert "ring hash cannot find a connected endpoint" in result.status.details


def test_non_xds_call_without_a_hash_fails_internal():
    """A76 pseudo code, C-core's words (grpcio 1.85: "hash attribute not
    present"): no header configured, no hash set by the xDS ConfigSelector."""
    policy, helper = make(RingHashConfig())
    make_ready(policy, helper, 80)
    result = pick(helper)
    assert isinstance(result, PickFail)
    assert result.status.code is grpc.StatusCode.INTERNAL
    assert result.status.details == "hash attribute not present"
    assert isinstance(pick(helper, cluster="cluster:c"), (PickComplete, PickQueue))


# ---------------------------------------------------------------- endpoint hash keys


def test_endpoint_hash_key_places_the_endpoint_instead_of_its_address():
    config = RingHashConfig(16, 16)
    keyed, _ = make(config, attrs={p: {"hash_key": f"pod-{p - 80}"} for p in (80, 81, 82)})
    moved, _ = make(
        config,
        ports=(90, 91, 92),
        attrs={p: {"hash_key": f"pod-{p - 90}"} for p in (90, 91, 92)},
    )
    assert keyed.ring.hashes == moved.ring.hashes  # new addresses, same keys: same ring
    plain, _ = make(config)
    assert plain.ring.hashes != keyed.ring.hashes


def test_empty_hash_key_falls_back_to_the_address():
    config = RingHashConfig(16, 16)
    keyed, _ = make(config, attrs={80: {"hash_key": ""}})
    plain, _ = make(config)
    assert keyed.ring.hashes == plain.ring.hashes


def test_changed_hash_key_rebuilds_the_ring():
    config = RingHashConfig(16, 16)
    policy, _helper = make(config, attrs={80: {"hash_key": "a"}})
    before = policy.ring.hashes
    endpoints = [
        Endpoint((addr(80),), {"hash_key": "b"}),
        Endpoint((addr(81),)),
        Endpoint((addr(82),)),
    ]
    policy.update(ResolverUpdate(endpoints, config))
    assert policy.ring.hashes != before


def _cla(hash_key) -> bytes:
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="e1")
    lep = cla.endpoints.add()
    lep.locality.region = "r"
    lep.load_balancing_weight.value = 1
    lbe = lep.lb_endpoints.add()
    lbe.endpoint.address.socket_address.address = "10.0.0.1"
    lbe.endpoint.address.socket_address.port_value = 80
    if hash_key is not None:
        lbe.metadata.filter_metadata["envoy.lb"].update({"hash_key": hash_key})
    return cla.SerializeToString()


@pytest.mark.parametrize(("value", "want"), [("pod-7", "pod-7"), (None, ""), (3, "")])
def test_eds_reads_hash_key_from_envoy_lb_metadata(value, want):
    result = ENDPOINTS.decode(_cla(value))
    assert result.error is None, result.error
    (endpoint,) = result.resource.priorities[0][0].endpoints
    assert endpoint.hash_key == want


def _keyed_cds():
    helper, policy, config = build([{"cds_experimental": {"cluster": "c1"}}])
    entry = eds_entry(
        eds_cluster("c1"),
        [
            Locality(
                loc("a"),
                1,
                (EndpointAddress((addr(80),), hash_key="pod-0"), EndpointAddress((addr(81),))),
            )
        ],
    )
    policy.update(cds_update(config, xds_config({"c1": entry})))
    return {s.address: s.attributes for s in helper.subchannels}


def test_cds_hands_the_hash_key_to_the_endpoint_attributes_when_compat_is_off(monkeypatch):
    monkeypatch.setenv("GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT", "false")
    attributes = _keyed_cds()
    assert attributes[addr(80)]["hash_key"] == "pod-0"
    assert "hash_key" not in attributes[addr(81)]


@pytest.mark.parametrize("value", [None, "true", "TRUE"])
def test_cds_ignores_hash_keys_by_default_as_grpcio_1_85(monkeypatch, value):
    """A76's backward-compatibility switch: unset means true (keys ignored)."""
    if value is None:
        monkeypatch.delenv("GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT", raising=False)
    else:
        monkeypatch.setenv("GRPC_XDS_ENDPOINT_HASH_KEY_BACKWARD_COMPAT", value)
    assert all("hash_key" not in a for a in _keyed_cds().values())
