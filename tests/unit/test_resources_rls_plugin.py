"""RDS cluster specifier plugins (C-core's ClusterSpecifierPluginParse and
XdsRouteLookupClusterSpecifierPlugin): the RLS plugin's generated LB config,
its validation (NACK as C-core), optional plugins, GRPC_EXPERIMENTAL_XDS_RLS_LB."""

from __future__ import annotations

import json

import pytest
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from google.protobuf import any_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.protos import rls_config_pb2
from pyxds.server import builders as b
from pyxds.xds.resources import ROUTE_CONFIG, RouteAction, RouteConfiguration
from pyxds.xds.resources.cluster_specifier import RLS_ENV, RLS_PLUGIN_TYPE

RLS_TYPE = RLS_PLUGIN_TYPE


def lookup_config(**kwargs) -> rls_config_pb2.RouteLookupConfig:
    args = {
        "lookup_service": "rls.example:443",
        "key_builders": [b.rls_key_builder("pkg.Svc", headers={"user": "x-user"})],
        "cache_size_bytes": 1000,
    }
    args.update(kwargs)
    return b.route_lookup_config(**args)


def rc_with_plugin(*plugins, routes=None) -> route_pb2.RouteConfiguration:
    if routes is None:
        routes = [b.route(prefix="", cluster_specifier_plugin="rls")]
    return b.route_config("rc", [b.virtual_host("vh", ["*"], routes)], plugins)


def decode(rc: route_pb2.RouteConfiguration):
    return ROUTE_CONFIG.decode(rc.SerializeToString())


def decode_ok(rc) -> RouteConfiguration:
    result = decode(rc)
    assert result.error is None, result.error
    return result.resource


def decode_err(rc) -> str:
    result = decode(rc)
    assert result.resource is None, result.resource
    return result.error


def test_an_rls_plugin_becomes_c_cores_rls_experimental_config():
    got = decode_ok(rc_with_plugin(b.rls_plugin("rls", lookup_config(max_age=20))))
    (plugin,) = got.cluster_specifier_plugins
    assert plugin.name == "rls"
    assert plugin.type_url == "grpc.lookup.v1.RouteLookupClusterSpecifier"
    assert json.loads(plugin.lb_config) == [
        {
            "rls_experimental": {
                "routeLookupConfig": {
                    "grpcKeybuilders": [
                        {
                            "names": [{"service": "pkg.Svc"}],
                            "headers": [{"key": "user", "names": ["x-user"]}],
                        }
                    ],
                    "lookupService": "rls.example:443",
                    "maxAge": "20s",
                    "cacheSizeBytes": "1000",
                },
                "childPolicy": [{"cds_experimental": {"isDynamic": True}}],
                "childPolicyConfigTargetFieldName": "cluster",
            }
        }
    ]
    (route,) = got.virtual_hosts[0].routes
    assert isinstance(route.action, RouteAction)
    assert route.action.cluster_specifier_plugin == "rls"


def test_the_same_resource_twice_decodes_to_equal_values():
    rc = rc_with_plugin(b.rls_plugin("rls", lookup_config()))
    assert decode_ok(rc) == decode_ok(rc)


def test_plugins_no_route_names_are_left_out():
    rc = rc_with_plugin(
        b.rls_plugin("rls", lookup_config()),
        b.rls_plugin("unused", lookup_config()),
    )
    assert [p.name for p in decode_ok(rc).cluster_specifier_plugins] == ["rls"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"cache_size_bytes": 0}, "routeLookupConfig.cacheSizeBytes: field not present"),
        ({"lookup_service": ""}, "routeLookupConfig.lookupService: field not present"),
        ({"lookup_service": "xds:///"}, "must be valid gRPC target URI"),
        ({"key_builders": []}, "routeLookupConfig.grpcKeybuilders: field not present"),
        ({"default_target": None, "stale_age": 5}, "must be set if staleAge is set"),
        (
            {"key_builders": [b.rls_key_builder("s", headers={"k": "a"}, constant_keys={"k": ""})]},
            'duplicate key "k"',
        ),
        (
            {"key_builders": [b.rls_key_builder("s"), b.rls_key_builder("s")]},
            'duplicate entry for "/s/"',
        ),
    ],
)
def test_a_bad_route_lookup_config_is_nacked(change, problem):
    err = decode_err(rc_with_plugin(b.rls_plugin("rls", lookup_config(**change))))
    assert "cluster_specifier_plugins[0].extension.typed_config: ClusterSpecifierPlugin " in err
    assert "returned invalid LB policy config" in err
    assert problem in err


def test_a_negative_duration_is_nacked():
    config = lookup_config()
    config.max_age.seconds = -5
    err = decode_err(rc_with_plugin(b.rls_plugin("rls", config)))
    assert "routeLookupConfig.maxAge: seconds must be in the range [0, 315576000000]" in err


def test_a_duration_out_of_protobuf_range_is_nacked():
    config = lookup_config()
    config.max_age.seconds = 315_576_000_001
    err = decode_err(rc_with_plugin(b.rls_plugin("rls", config)))
    assert f"typed_config.value[{RLS_TYPE}]: failed to dump proto to JSON" in err


def test_a_required_match_header_is_nacked():
    builder = b.rls_key_builder("s", headers={"k": "h"})
    builder.headers[0].required_match = True
    err = decode_err(rc_with_plugin(b.rls_plugin("rls", lookup_config(key_builders=[builder]))))
    assert "headers[0].requiredMatch: must not be present" in err


def test_a_plugin_without_route_lookup_config_is_nacked():
    plugin = b.rls_plugin("rls", lookup_config())
    plugin.extension.typed_config.Pack(rls_config_pb2.RouteLookupClusterSpecifier())
    err = decode_err(rc_with_plugin(plugin))
    assert f"typed_config.value[{RLS_TYPE}].route_lookup_config: field not present" in err


def test_bytes_that_do_not_parse_are_nacked():
    plugin = b.rls_plugin("rls", lookup_config())
    plugin.extension.typed_config.value = b"\xff\xff\xff"
    assert f"typed_config.value[{RLS_TYPE}]: could not parse plugin config" in decode_err(
        rc_with_plugin(plugin)
    )


def test_an_rls_plugin_in_a_typed_struct_is_nacked():
    plugin = b.rls_plugin("rls", lookup_config())
    ts = typed_struct_pb2.TypedStruct(
        type_url="type.googleapis.com/grpc.lookup.v1.RouteLookupClusterSpecifier"
    )
    plugin.extension.typed_config.Pack(ts)
    assert (
        f"typed_config.value[xds.type.v3.TypedStruct].value[{RLS_TYPE}]: "
        "could not parse plugin config"
    ) in decode_err(rc_with_plugin(plugin))


def test_a_plugin_without_extension_or_typed_config_is_nacked():
    empty = route_components_pb2.ClusterSpecifierPlugin()
    rc = rc_with_plugin(empty, routes=[b.route(cluster="c")])
    assert "cluster_specifier_plugins[0].extension: field not present" in decode_err(rc)
    plugin = b.rls_plugin("rls", lookup_config())
    plugin.extension.ClearField("typed_config")
    assert "extension.typed_config: field not present" in decode_err(rc_with_plugin(plugin))


def test_an_unknown_required_plugin_is_nacked_and_an_optional_one_ignores_its_routes():
    other = route_components_pb2.ClusterSpecifierPlugin()
    other.extension.name = "rls"
    other.extension.typed_config.Pack(router_pb2.Router())
    err = decode_err(rc_with_plugin(other))
    assert (
        "typed_config.value[envoy.extensions.filters.http.router.v3.Router]: "
        "unsupported ClusterSpecifierPlugin type"
    ) in err
    other.is_optional = True
    routes = [b.route(prefix="/a/", cluster_specifier_plugin="rls"), b.route(cluster="fallback")]
    got = decode_ok(rc_with_plugin(other, routes=routes))
    assert [r.action.cluster for r in got.virtual_hosts[0].routes] == ["fallback"]
    assert got.cluster_specifier_plugins == ()


def test_an_optional_rls_plugin_with_a_bad_config_is_still_nacked():
    # is_optional only covers plugin types the client does not know
    plugin = b.rls_plugin("rls", lookup_config(cache_size_bytes=0), optional=True)
    assert "returned invalid LB policy config" in decode_err(rc_with_plugin(plugin))


def test_a_route_naming_an_undeclared_plugin_is_nacked():
    rc = rc_with_plugin(routes=[b.route(cluster_specifier_plugin="nope")])
    assert 'unknown cluster specifier plugin name "nope"' in decode_err(rc)


def test_a_route_naming_a_plugin_with_errors_adds_no_second_error():
    plugin = b.rls_plugin("rls", lookup_config(cache_size_bytes=0))
    err = decode_err(rc_with_plugin(plugin))
    assert "unknown cluster specifier plugin" not in err


def test_a_type_url_without_a_slash_is_nacked():
    plugin = b.rls_plugin("rls", lookup_config())
    plugin.extension.typed_config.CopyFrom(any_pb2.Any(type_url="nonsense", value=b""))
    assert 'typed_config.type_url: invalid value "nonsense"' in decode_err(rc_with_plugin(plugin))


@pytest.mark.parametrize("value", ["false", "no", "0", "bogus"])
def test_with_rls_off_plugin_routes_are_ignored_and_plugins_not_parsed(monkeypatch, value):
    monkeypatch.setenv(RLS_ENV, value)
    bad = b.rls_plugin("rls", lookup_config(cache_size_bytes=0))
    routes = [b.route(prefix="/a/", cluster_specifier_plugin="rls"), b.route(cluster="fallback")]
    got = decode_ok(rc_with_plugin(bad, routes=routes))
    assert [r.action.cluster for r in got.virtual_hosts[0].routes] == ["fallback"]
    assert got.cluster_specifier_plugins == ()


@pytest.mark.parametrize("value", ["true", "TRUE", "yes", "1"])
def test_rls_is_on_when_the_variable_says_true(monkeypatch, value):
    monkeypatch.setenv(RLS_ENV, value)
    got = decode_ok(rc_with_plugin(b.rls_plugin("rls", lookup_config())))
    assert [p.name for p in got.cluster_specifier_plugins] == ["rls"]


def test_the_yaml_of_docs_rls_md_loads_and_decodes():
    import pathlib
    import re

    import yaml

    from pyxds.server import parse_resources

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "rls.md"
    (text,) = re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.S)
    snapshot = parse_resources([yaml.safe_load(text)], validate=True)
    (rc,) = snapshot.routes
    got = decode_ok(rc)
    (plugin,) = got.cluster_specifier_plugins
    rlc = json.loads(plugin.lb_config)[0]["rls_experimental"]["routeLookupConfig"]
    assert rlc["lookupService"] == "rls.example.com:443"
    assert rlc["defaultTarget"] == "greeter-default"
    assert rlc["staleAge"] == "240s"
