"""Bootstrap conformance: scenarios of C-core test/core/xds/xds_bootstrap_test.cc
(and grpc-go internal/xds/bootstrap tests), asserting what is accepted, what
is rejected and which field the error names."""

from __future__ import annotations

import json

import pytest

from pyxds.xds.bootstrap import (
    BootstrapError,
    LocalityName,
    listener_resource_name,
    load_bootstrap,
)

SERVER = {"server_uri": "fake:///lb", "channel_creds": [{"type": "insecure"}]}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP", raising=False)
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP_CONFIG", raising=False)


def error_of(cfg) -> str:
    with pytest.raises(BootstrapError) as info:
        load_bootstrap(cfg)
    return str(info.value)


def test_full_bootstrap_is_parsed():
    """C-core XdsBootstrapTest.Basic."""
    cfg = {
        "xds_servers": [
            {
                "server_uri": "fake:///lb",
                "channel_creds": [{"type": "fake"}, {"type": "insecure"}],
                "server_features": ["xds_v3", "ignore_resource_deletion"],
                "ignore": 0,
            },
            {"server_uri": "fake:///lb2", "channel_creds": [{"type": "insecure"}]},
        ],
        "authorities": {
            "xds.example.com": {
                "client_listener_resource_name_template": "xdstp://xds.example.com/"
                "envoy.config.listener.v3.Listener/grpc/server/%s",
                "xds_servers": [
                    {"server_uri": "fake:///xds_server", "channel_creds": [{"type": "insecure"}]}
                ],
            }
        },
        "node": {
            "id": "foo",
            "cluster": "bar",
            "locality": {"region": "milky_way", "zone": "sol_system", "sub_zone": "earth"},
            "metadata": {"foo": 1, "bar": 2},
            "ignore": "whee",
        },
        "server_listener_resource_name_template": "example/resource",
        "ignore": {},
    }
    b = load_bootstrap(cfg)
    assert [s.server_uri for s in b.xds_servers] == ["fake:///lb", "fake:///lb2"]
    assert b.xds_servers[0].channel_creds_type == "insecure"
    assert b.xds_servers[0].ignore_resource_deletion
    assert b.node.id == "foo" and b.node.cluster == "bar"
    assert b.node.locality == LocalityName("milky_way", "sol_system", "earth")
    assert b.node.metadata == {"foo": 1, "bar": 2}
    assert b.server_listener_resource_name_template == "example/resource"
    assert [s.server_uri for s in b.servers_for("xds.example.com")] == ["fake:///xds_server"]


def test_valid_without_node():
    """C-core XdsBootstrapTest.ValidWithoutNode."""
    b = load_bootstrap({"xds_servers": [SERVER]})
    assert b.node.id == "" and b.node.locality is None


def test_missing_xds_servers_is_an_error():
    assert "xds_servers: field not present" in error_of({})


def test_empty_xds_servers_is_an_error():
    assert "xds_servers: must be non-empty" in error_of({"xds_servers": []})


def test_top_level_fields_of_wrong_type_are_errors():
    """C-core XdsBootstrapTest.TopFieldsWrongTypes."""
    msg = error_of({"xds_servers": 1, "node": 1, "certificate_providers": 1})
    assert "xds_servers: is not an array" in msg
    assert "node: is not an object" in msg
    assert "certificate_providers: is not an object" in msg


def test_server_without_uri_is_an_error():
    """C-core XdsBootstrapTest.XdsServerMissingServerUri."""
    msg = error_of({"xds_servers": [{"channel_creds": [{"type": "insecure"}]}]})
    assert "xds_servers[0].server_uri: field not present" in msg


def test_server_uri_and_creds_of_wrong_type_are_errors():
    """C-core XdsBootstrapTest.XdsServerUriAndCredsWrongTypes."""
    msg = error_of({"xds_servers": [{"server_uri": 1, "channel_creds": 1}]})
    assert "xds_servers[0].server_uri: is not a string" in msg
    assert "xds_servers[0].channel_creds: is not an array" in msg


def test_missing_channel_creds_is_an_error():
    msg = error_of({"xds_servers": [{"server_uri": "fake:///lb"}]})
    assert "xds_servers[0].channel_creds: field not present" in msg


def test_no_known_channel_creds_is_an_error():
    """C-core XdsBootstrapTest.NoKnownChannelCreds."""
    cfg = {"xds_servers": [{"server_uri": "fake:///lb", "channel_creds": [{"type": "unknown"}]}]}
    assert "xds_servers[0].channel_creds: no known creds type found" in error_of(cfg)


def test_first_supported_channel_creds_wins():
    cfg = {
        "xds_servers": [
            {
                "server_uri": "fake:///lb",
                "channel_creds": [{"type": "unknown"}, {"type": "insecure"}, {"type": "tls"}],
            }
        ]
    }
    assert load_bootstrap(cfg).xds_servers[0].channel_creds_type == "insecure"


def test_server_feature_that_is_not_a_string_is_an_error():
    """C-core loads server_features as a set of strings."""
    cfg = {"xds_servers": [dict(SERVER, server_features=["xds_v3", 1])]}
    assert "xds_servers[0].server_features[1]: is not a string (got number)" in error_of(cfg)


def test_unknown_server_features_are_ignored():
    cfg = {"xds_servers": [dict(SERVER, server_features=["whatever", "fail_on_data_errors"])]}
    server = load_bootstrap(cfg).xds_servers[0]
    assert server.fail_on_data_errors and not server.ignore_resource_deletion
    assert not server.resource_timer_is_transient_error


def test_node_fields_of_wrong_type_are_errors():
    """C-core XdsBootstrapTest.NodeFieldsWrongTypes / LocalityFieldsWrongType."""
    msg = error_of(
        {
            "xds_servers": [SERVER],
            "node": {"id": 0, "cluster": 0, "metadata": 0, "locality": {"region": 0}},
        }
    )
    for field in ("node.id", "node.cluster", "node.metadata", "node.locality.region"):
        assert f"{field}: is not " in msg


def test_authority_template_with_wrong_prefix_is_an_error():
    """C-core XdsBootstrapTest.AuthorityXdsServerInvalidResourceTemplate."""
    cfg = {
        "xds_servers": [SERVER],
        "authorities": {
            "xds.example.com": {"client_listener_resource_name_template": "xds://wrong/%s"}
        },
    }
    assert 'field must begin with "xdstp://xds.example.com/"' in error_of(cfg)


def test_authority_without_servers_uses_top_level_servers():
    """C-core XdsBootstrapTest.AuthorityXdsServerMissing / A47."""
    b = load_bootstrap({"xds_servers": [SERVER], "authorities": {"a.com": {}}})
    assert b.servers_for("a.com") == b.xds_servers
    assert (
        listener_resource_name(b, "a.com", "svc")
        == "xdstp://a.com/envoy.config.listener.v3.Listener/svc"
    )


def test_unknown_authority_is_a_lookup_error():
    b = load_bootstrap({"xds_servers": [SERVER]})
    with pytest.raises(LookupError, match='authority "nope" not present in bootstrap config'):
        listener_resource_name(b, "nope", "svc")


def test_xdstp_template_percent_encodes_the_service_name():
    """A47: the target's path is percent-encoded into an xdstp name."""
    b = load_bootstrap(
        {
            "xds_servers": [SERVER],
            "client_default_listener_resource_name_template": "xdstp://a.com/"
            "envoy.config.listener.v3.Listener/%s",
        }
    )
    name = listener_resource_name(b, None, "my svc?x")
    assert name == "xdstp://a.com/envoy.config.listener.v3.Listener/my%20svc%3Fx"
    plain = load_bootstrap({"xds_servers": [SERVER]})
    assert listener_resource_name(plain, None, "my svc?x") == "my svc?x"


def test_bootstrap_file_env_wins_over_inline_config(tmp_path, monkeypatch):
    """A27: GRPC_XDS_BOOTSTRAP first, then GRPC_XDS_BOOTSTRAP_CONFIG."""
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"xds_servers": [SERVER], "node": {"id": "from-file"}}))
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP", str(f))
    monkeypatch.setenv(
        "GRPC_XDS_BOOTSTRAP_CONFIG", json.dumps({"xds_servers": [SERVER], "node": {"id": "inl"}})
    )
    assert load_bootstrap().node.id == "from-file"
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP")
    assert load_bootstrap().node.id == "inl"


def test_no_bootstrap_anywhere_is_an_error_naming_both_variables():
    with pytest.raises(BootstrapError) as info:
        load_bootstrap()
    assert "GRPC_XDS_BOOTSTRAP" in str(info.value)
    assert "GRPC_XDS_BOOTSTRAP_CONFIG" in str(info.value)


def test_invalid_json_is_an_error_naming_the_source(tmp_path):
    f = tmp_path / "b.json"
    f.write_text("{not json")
    assert str(f) in error_of(str(f))


def test_unknown_certificate_provider_plugin_is_an_error():
    """C-core CertificateProviderStore: "Unrecognized plugin name"."""
    cfg = {
        "xds_servers": [SERVER],
        "certificate_providers": {"p": {"plugin_name": "fancy", "config": {}}},
    }
    assert 'certificate_providers["p"].plugin_name: Unrecognized plugin name: fancy' in (
        error_of(cfg)
    )
    cfg["certificate_providers"]["p"]["plugin_name"] = "file_watcher"
    cfg["certificate_providers"]["p"]["config"] = {"ca_certificate_file": "/ca.pem"}
    assert load_bootstrap(cfg).certificate_providers["p"]["plugin_name"] == "file_watcher"
