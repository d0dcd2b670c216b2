"""Bootstrap loading and validation (A27 bootstrap, A47 names, A88 server features)."""

from __future__ import annotations

import json
import pathlib

import pytest

from pyxds.xds.bootstrap import (
    Bootstrap,
    BootstrapError,
    LocalityName,
    Node,
    XdsServerConfig,
    listener_resource_name,
    load_bootstrap,
)


def minimal(**extra):
    cfg = {
        "xds_servers": [
            {"server_uri": "xds.example.com:443", "channel_creds": [{"type": "insecure"}]}
        ],
        "node": {"id": "node-1"},
    }
    cfg.update(extra)
    return cfg


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP", raising=False)
    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP_CONFIG", raising=False)


def error_of(source) -> str:
    with pytest.raises(BootstrapError) as info:
        load_bootstrap(source)
    return str(info.value)


# ---------------------------------------------------------------- sources


def test_dict_source_parses_servers_and_node():
    b = load_bootstrap(minimal())
    assert b.xds_servers == (XdsServerConfig("xds.example.com:443", "insecure", {}, ()),)
    assert b.node.id == "node-1"
    assert b.client_default_listener_resource_name_template == "%s"
    assert b.server_listener_resource_name_template is None


def test_json_text_source_equals_dict_source():
    assert load_bootstrap(json.dumps(minimal())) == load_bootstrap(minimal())


def test_path_source_str_and_pathlike(tmp_path: pathlib.Path):
    f = tmp_path / "bootstrap.json"
    f.write_text(json.dumps(minimal()))
    assert load_bootstrap(str(f)) == load_bootstrap(f) == load_bootstrap(minimal())


def test_env_file_is_used_when_source_is_none(tmp_path, monkeypatch):
    f = tmp_path / "b.json"
    f.write_text(json.dumps(minimal(node={"id": "from-file"})))
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP", str(f))
    assert load_bootstrap().node.id == "from-file"


def test_env_file_takes_precedence_over_inline_config(tmp_path, monkeypatch):
    f = tmp_path / "b.json"
    f.write_text(json.dumps(minimal(node={"id": "from-file"})))
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP", str(f))
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP_CONFIG", json.dumps(minimal(node={"id": "inline"})))
    assert load_bootstrap().node.id == "from-file"


def test_env_inline_config_used_when_no_file_env(monkeypatch):
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP_CONFIG", json.dumps(minimal(node={"id": "inline"})))
    assert load_bootstrap().node.id == "inline"


def test_explicit_source_wins_over_env(monkeypatch):
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP_CONFIG", json.dumps(minimal(node={"id": "inline"})))
    assert load_bootstrap(minimal(node={"id": "explicit"})).node.id == "explicit"


def test_no_source_and_no_env_is_an_error_naming_both_env_vars():
    msg = error_of(None)
    assert "GRPC_XDS_BOOTSTRAP" in msg and "GRPC_XDS_BOOTSTRAP_CONFIG" in msg


def test_missing_file_error_names_the_file(tmp_path):
    path = str(tmp_path / "nope.json")
    msg = error_of(path)
    assert path in msg and "cannot read" in msg


def test_env_file_error_names_the_env_var_and_file(tmp_path, monkeypatch):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"node": {}}))
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP", str(f))
    msg = error_of(None)
    assert f"GRPC_XDS_BOOTSTRAP={f}" in msg and "xds_servers: field not present" in msg


def test_env_inline_error_names_the_env_var(monkeypatch):
    monkeypatch.setenv("GRPC_XDS_BOOTSTRAP_CONFIG", "{not json")
    msg = error_of(None)
    assert msg.startswith("GRPC_XDS_BOOTSTRAP_CONFIG: invalid JSON")


def test_invalid_json_in_file_names_the_file(tmp_path):
    f = tmp_path / "b.json"
    f.write_text("{oops")
    msg = error_of(f)
    assert str(f) in msg and "invalid JSON" in msg


def test_top_level_not_an_object_is_an_error(tmp_path):
    f = tmp_path / "b.json"
    f.write_text("[1, 2]")
    assert "top level is not an object (got array)" in error_of(f)


# ---------------------------------------------------------------- xds_servers


def test_xds_servers_missing():
    assert "xds_servers: field not present" in error_of({"node": {"id": "x"}})


def test_xds_servers_not_an_array():
    assert "xds_servers: is not an array (got object)" in error_of({"xds_servers": {}})


def test_xds_servers_empty():
    assert "xds_servers: must be non-empty" in error_of({"xds_servers": []})


def test_server_entry_not_an_object():
    assert "xds_servers[0]: is not an object (got string)" in error_of({"xds_servers": ["x"]})


def test_server_uri_missing_and_wrong_type():
    msg = error_of({"xds_servers": [{"channel_creds": [{"type": "insecure"}]}]})
    assert "xds_servers[0].server_uri: field not present" in msg
    msg = error_of({"xds_servers": [{"server_uri": 5, "channel_creds": [{"type": "insecure"}]}]})
    assert "xds_servers[0].server_uri: is not a string (got number)" in msg


def test_server_uri_empty():
    msg = error_of({"xds_servers": [{"server_uri": "", "channel_creds": [{"type": "insecure"}]}]})
    assert "xds_servers[0].server_uri: must be non-empty" in msg


def test_channel_creds_missing():
    msg = error_of({"xds_servers": [{"server_uri": "a:1"}]})
    assert "xds_servers[0].channel_creds: field not present" in msg


def test_channel_creds_first_supported_wins_google_default_skipped():
    cfg = minimal()
    cfg["xds_servers"][0]["channel_creds"] = [
        {"type": "google_default"},
        {"type": "tls", "config": {"ca_certificate_file": "/ca.pem"}},
        {"type": "insecure"},
    ]
    server = load_bootstrap(cfg).xds_servers[0]
    assert server.channel_creds_type == "tls"
    assert server.channel_creds_config == {"ca_certificate_file": "/ca.pem"}


def test_channel_creds_none_supported_is_an_error():
    cfg = minimal()
    cfg["xds_servers"][0]["channel_creds"] = [{"type": "google_default"}, {"type": "fancy"}]
    assert "xds_servers[0].channel_creds: no known creds type found" in error_of(cfg)


def test_channel_creds_entry_type_missing_and_config_not_object():
    cfg = minimal()
    cfg["xds_servers"][0]["channel_creds"] = [{"config": {}}, {"type": "insecure", "config": 3}]
    msg = error_of(cfg)
    assert "xds_servers[0].channel_creds[0].type: field not present" in msg
    assert "xds_servers[0].channel_creds[1].config: is not an object (got number)" in msg


def test_server_features_flags():
    cfg = minimal()
    cfg["xds_servers"][0]["server_features"] = [
        "xds_v3",
        "fail_on_data_errors",
        "resource_timer_is_transient_error",
        "ignore_resource_deletion",
    ]
    s = load_bootstrap(cfg).xds_servers[0]
    assert s.fail_on_data_errors and s.resource_timer_is_transient_error
    assert s.ignore_resource_deletion
    plain = load_bootstrap(minimal()).xds_servers[0]
    assert not (
        plain.fail_on_data_errors
        or plain.resource_timer_is_transient_error
        or plain.ignore_resource_deletion
    )


def test_server_features_not_an_array():
    cfg = minimal()
    cfg["xds_servers"][0]["server_features"] = "xds_v3"
    assert "xds_servers[0].server_features: is not an array (got string)" in error_of(cfg)


def test_all_errors_are_reported_together():
    msg = error_of({"xds_servers": [{"server_uri": 1}], "node": "x"})
    assert "xds_servers[0].server_uri" in msg
    assert "xds_servers[0].channel_creds" in msg
    assert "node: is not an object (got string)" in msg


def test_unknown_fields_are_ignored():
    assert load_bootstrap(minimal(future_field={"x": 1})) == load_bootstrap(minimal())


# ---------------------------------------------------------------- node


def test_node_fields_and_proto():
    b = load_bootstrap(
        minimal(
            node={
                "id": "n1",
                "cluster": "c1",
                "locality": {"region": "r", "zone": "z", "sub_zone": "s"},
                "metadata": {"k": "v", "nested": {"list": [1, "two"]}},
            }
        )
    )
    assert b.node.locality == LocalityName("r", "z", "s")
    proto = b.node.to_proto()
    assert proto.id == "n1" and proto.cluster == "c1"
    assert (proto.locality.region, proto.locality.zone, proto.locality.sub_zone) == ("r", "z", "s")
    assert proto.metadata["k"] == "v"
    assert list(proto.metadata["nested"]["list"]) == [1, "two"]
    assert proto.user_agent_name == "pyxds"
    assert proto.user_agent_version
    assert "envoy.lb.does_not_support_overprovisioning" in proto.client_features
    assert "xds.config.resource-in-sotw" in proto.client_features


def test_node_absent_gives_empty_node():
    cfg = minimal()
    del cfg["node"]
    assert load_bootstrap(cfg).node == Node()


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"id": 3}, "node.id: is not a string (got number)"),
        ({"cluster": []}, "node.cluster: is not a string (got array)"),
        ({"locality": "x"}, "node.locality: is not an object (got string)"),
        ({"locality": {"zone": 1}}, "node.locality.zone: is not a string (got number)"),
        ({"metadata": [1]}, "node.metadata: is not an object (got array)"),
    ],
)
def test_node_malformed_fields(node, expected):
    assert expected in error_of(minimal(node=node))


# ---------------------------------------------------------------- templates / authorities


def test_listener_name_without_authority_uses_default_template():
    b = load_bootstrap(minimal())
    assert listener_resource_name(b, None, "greeter:50051") == "greeter:50051"
    assert listener_resource_name(b, "", "greeter") == "greeter"


def test_listener_name_default_xdstp_template_percent_encodes():
    b = load_bootstrap(
        minimal(
            client_default_listener_resource_name_template=(
                "xdstp://xds.authority.com/envoy.config.listener.v3.Listener/%s"
            )
        )
    )
    assert listener_resource_name(b, None, "my svc?x") == (
        "xdstp://xds.authority.com/envoy.config.listener.v3.Listener/my%20svc%3Fx"
    )


def test_listener_name_non_xdstp_template_is_not_encoded():
    b = load_bootstrap(minimal(client_default_listener_resource_name_template="pre/%s/post"))
    assert listener_resource_name(b, None, "a b") == "pre/a b/post"


def test_authority_default_template():
    b = load_bootstrap(minimal(authorities={"auth.example": {}}))
    assert listener_resource_name(b, "auth.example", "svc") == (
        "xdstp://auth.example/envoy.config.listener.v3.Listener/svc"
    )


def test_authority_custom_template_and_servers():
    b = load_bootstrap(
        minimal(
            authorities={
                "a.example": {
                    "client_listener_resource_name_template": "xdstp://a.example/L/%s",
                    "xds_servers": [
                        {"server_uri": "other:1", "channel_creds": [{"type": "insecure"}]}
                    ],
                }
            }
        )
    )
    assert listener_resource_name(b, "a.example", "svc") == "xdstp://a.example/L/svc"
    assert b.servers_for("a.example")[0].server_uri == "other:1"
    assert b.servers_for(None) == b.xds_servers


def test_authority_without_servers_uses_top_level_servers():
    b = load_bootstrap(minimal(authorities={"a": {}}))
    assert b.servers_for("a") == b.xds_servers


def test_unknown_authority_is_a_lookup_error():
    b = load_bootstrap(minimal())
    with pytest.raises(LookupError, match='authority "nope" not present in bootstrap config'):
        listener_resource_name(b, "nope", "svc")
    with pytest.raises(LookupError):
        b.servers_for("nope")


def test_authority_template_must_start_with_its_xdstp_prefix():
    msg = error_of(
        minimal(authorities={"a": {"client_listener_resource_name_template": "xdstp://b/L/%s"}})
    )
    assert 'authorities["a"].client_listener_resource_name_template' in msg
    assert 'must begin with "xdstp://a/"' in msg


def test_authority_not_an_object_and_bad_servers():
    msg = error_of(minimal(authorities={"a": 1, "b": {"xds_servers": [{"server_uri": "x"}]}}))
    assert 'authorities["a"]: is not an object (got number)' in msg
    assert 'authorities["b"].xds_servers[0].channel_creds: field not present' in msg


def test_template_fields_wrong_type():
    msg = error_of(
        minimal(
            client_default_listener_resource_name_template=1,
            server_listener_resource_name_template=[],
        )
    )
    assert "client_default_listener_resource_name_template: is not a string" in msg
    assert "server_listener_resource_name_template: is not a string" in msg


def test_server_listener_template_kept():
    b = load_bootstrap(minimal(server_listener_resource_name_template="grpc/server?x=%s"))
    assert b.server_listener_resource_name_template == "grpc/server?x=%s"


# ---------------------------------------------------------------- certificate providers


def test_certificate_providers_kept():
    config = {"certificate_file": "/c", "private_key_file": "/k", "refresh_interval": "5s"}
    providers = {"default": {"plugin_name": "file_watcher", "config": config}}
    b = load_bootstrap(minimal(certificate_providers=providers))
    assert b.certificate_providers == providers
    assert b.certificate_providers["default"]["config"]["certificate_file"] == "/c"


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({}, 'at least one of "certificate_file" and "ca_certificate_file" must be specified'),
        (
            {"certificate_file": "/c", "ca_certificate_file": "/ca"},
            '"certificate_file" and "private_key_file" must be both set or both unset',
        ),
        (
            {"ca_certificate_file": "/ca", "refresh_interval": "10"},
            "refresh_interval: Not a duration (no s suffix)",
        ),
        ({"ca_certificate_file": 7}, "ca_certificate_file: is not a string"),
    ],
)
def test_file_watcher_config_errors_name_the_field(config, error):
    """A29 file_watcher config, checked as C-core's factory does: the bootstrap fails."""
    msg = error_of(
        minimal(certificate_providers={"p": {"plugin_name": "file_watcher", "config": config}})
    )
    assert 'certificate_providers["p"].config' in msg
    assert error in msg


def test_certificate_providers_malformed():
    msg = error_of(minimal(certificate_providers={"a": {"config": {}}, "b": 1}))
    assert 'certificate_providers["a"].plugin_name: field not present' in msg
    assert 'certificate_providers["b"]: is not an object (got number)' in msg


# ---------------------------------------------------------------- values


def test_same_bootstrap_twice_is_equal_and_hashable():
    cfg = minimal(
        node={"id": "n", "metadata": {"a": [1, {"b": 2}]}},
        authorities={"x": {}},
        certificate_providers={
            "p": {"plugin_name": "file_watcher", "config": {"ca_certificate_file": "/ca"}}
        },
    )
    a, b = load_bootstrap(cfg), load_bootstrap(json.dumps(cfg))
    assert a == b and hash(a) == hash(b)
    assert isinstance(a, Bootstrap)
    assert {a: 1}[b] == 1


def test_bootstrap_values_are_immutable():
    b = load_bootstrap(minimal(node={"id": "n", "metadata": {"a": 1}}))
    with pytest.raises(AttributeError):
        b.node = Node()  # type: ignore[misc]
    with pytest.raises(TypeError):
        b.node.metadata["a"] = 2  # type: ignore[index]


def test_authority_empty_template_uses_default_with_encoded_authority():
    b = load_bootstrap(minimal(authorities={"a b": {"client_listener_resource_name_template": ""}}))
    assert listener_resource_name(b, "a b", "svc") == (
        "xdstp://a%20b/envoy.config.listener.v3.Listener/svc"
    )


def test_a_bootstrap_file_that_is_not_utf8_is_a_bootstrap_error_naming_the_byte(tmp_path):
    f = tmp_path / "bootstrap.json"
    f.write_bytes(b'{"xds_servers": []}\xff')
    with pytest.raises(BootstrapError, match=r"bootstrap\.json: not UTF-8 JSON: byte 19"):
        load_bootstrap(str(f))
