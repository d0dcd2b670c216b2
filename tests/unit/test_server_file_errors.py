"""Resource file errors name the file, the line and the field (pyxds serve)."""

from __future__ import annotations

import pytest

from pyxds.server.files import ResourceFileError, load_resources, merge_snapshots

CLUSTER = """\
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: {name}
  type: {kind}
  edsClusterConfig:
    edsConfig: {{ads: {{}}, resourceApiVersion: V3}}
"""


def load(tmp_path, text: str, name: str = "r.yaml", validate: bool = True):
    path = tmp_path / name
    path.write_text(text)
    return load_resources(str(path), validate=validate)


def error(tmp_path, text: str, name: str = "r.yaml", validate: bool = True) -> str:
    with pytest.raises(ResourceFileError) as info:
        load(tmp_path, text, name, validate)
    return str(info.value)


def test_unknown_field_is_named_with_its_line(tmp_path):
    text = CLUSTER.format(name="a", kind="EDS") + CLUSTER.format(name="b", kind="EDS").replace(
        "edsConfig:", "edsConfg:"
    )
    message = error(tmp_path, text)
    assert message.startswith(f"{tmp_path}/r.yaml:10: resources[1].edsClusterConfig.edsConfg: ")
    assert "Available Fields" not in message


def test_bad_enum_value_is_named_with_its_line(tmp_path):
    message = error(tmp_path, CLUSTER.format(name="a", kind="EDZ"))
    assert ":3: resources[0].type: Invalid enum value EDZ" in message


def test_resource_a_grpc_client_would_nack_is_refused_unless_validation_is_off(tmp_path):
    text = CLUSTER.format(name="a", kind="STATIC")
    message = error(tmp_path, text)
    assert ":1: resources[0] (a): type: unknown discovery type" in message
    assert load(tmp_path, text, validate=False).clusters[0].name == "a"


def test_yaml_and_json_syntax_errors_give_the_line(tmp_path):
    assert ":3: invalid YAML:" in error(tmp_path, "resources:\n- a: 1\n- b: x: y\n")
    assert ":2: invalid JSON:" in error(tmp_path, '{"resources":\n [,]}', name="r.json")


def test_merging_files_refuses_a_resource_defined_twice(tmp_path):
    one = load(tmp_path, CLUSTER.format(name="a", kind="EDS"), "one.yaml")
    two = load(tmp_path, CLUSTER.format(name="a", kind="EDS"), "two.yaml")
    with pytest.raises(ResourceFileError, match=r"two\.yaml: resource 'a' .* also defined in one"):
        merge_snapshots([("one.yaml", one), ("two.yaml", two)])
    three = load(tmp_path, CLUSTER.format(name="b", kind="EDS"), "three.yaml")
    merged = merge_snapshots([("one.yaml", one), ("three.yaml", three)])
    assert sorted(c.name for c in merged.clusters) == ["a", "b"]


BAD_RLS = """\
- "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
  name: echo-route
  cluster_specifier_plugins:
  - extension:
      name: rls
      typed_config:
        "@type": type.googleapis.com/grpc.lookup.v1.RouteLookupClusterSpecifier
        route_lookup_config:
          lookup_service: rls.example.com:443
          cache_size_bytes: "1000"
          grpc_keybuilders:
          - names: [{service: pkg.Greeter}]
            headers: [{key: user, names: [x-user]}, {key: user, names: [x-other]}]
  virtual_hosts:
  - name: all
    domains: ["*"]
    routes:
    - match: {prefix: /pkg.Greeter/}
      route: {cluster_specifier_plugin: rls}
"""


def test_an_rls_plugin_a_grpc_client_would_nack_is_refused_naming_the_key(tmp_path):
    message = error(tmp_path, BAD_RLS)
    assert "ClusterSpecifierPlugin returned invalid LB policy config" in message
    assert 'grpcKeybuilders[0].headers[1].key: duplicate key "user"' in message
    fixed = BAD_RLS.replace("{key: user, names: [x-other]}", "{key: who, names: [x-other]}")
    assert load(tmp_path, fixed).routes[0].name == "echo-route"
