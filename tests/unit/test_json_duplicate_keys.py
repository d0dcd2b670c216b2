"""A key repeated in one JSON object is refused, as C-core's JSON reader
refuses it (grpcio 1.85: ``JSON parsing failed: [duplicate key "node" at
index 101]`` for a bootstrap, the same for a ``grpc.service_config``),
instead of Python's silent "the last one wins"."""

from __future__ import annotations

import json

import pytest

from pyxds import _json
from pyxds.resolver.service_config import parse_service_config
from pyxds.resolver.static_resolver import lb_selection_from_options
from pyxds.security.spiffe import parse_bundle_map
from pyxds.status import Status
from pyxds.xds.bootstrap import BootstrapError, load_bootstrap

_SERVERS = '"xds_servers": [{"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]}]'


def test_a_repeated_key_is_an_error_naming_the_key() -> None:
    with pytest.raises(ValueError, match='duplicate key "a"'):
        _json.loads('{"a": 1, "b": 2, "a": 3}')


def test_a_repeated_key_deep_inside_is_an_error_too() -> None:
    with pytest.raises(ValueError, match='duplicate key "id"'):
        _json.loads('{"x": [{"y": {"id": 1, "id": 1}}]}')


def test_equal_keys_in_different_objects_are_fine() -> None:
    text = '{"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 3}, {"k": 4}]}'
    assert _json.loads(text) == json.loads(text)


def test_a_bootstrap_with_a_repeated_key_is_refused_naming_it() -> None:
    text = "{" + _SERVERS + ', "node": {"id": "a"}, "node": {"id": "b"}}'
    with pytest.raises(BootstrapError, match='invalid JSON: duplicate key "node"'):
        load_bootstrap(text)


def test_a_bootstrap_without_repeated_keys_still_loads() -> None:
    bootstrap = load_bootstrap("{" + _SERVERS + ', "node": {"id": "a"}}')
    assert bootstrap.node.id == "a"


def test_a_service_config_with_a_repeated_key_is_refused() -> None:
    text = '{"loadBalancingConfig": [{"round_robin": {}}], "loadBalancingConfig": []}'
    with pytest.raises(ValueError, match='duplicate key "loadBalancingConfig"'):
        parse_service_config(text)


def test_a_channel_option_service_config_with_a_repeated_key_fails_the_selection() -> None:
    text = '{"loadBalancingConfig": [{"round_robin": {}}], "loadBalancingConfig": []}'
    selection = lb_selection_from_options({"grpc.service_config": text})
    assert isinstance(selection, Status)
    assert 'duplicate key "loadBalancingConfig"' in selection.details


def test_a_spiffe_bundle_map_with_a_repeated_key_is_refused() -> None:
    with pytest.raises(ValueError, match='duplicate key "trust_domains"'):
        parse_bundle_map('{"trust_domains": {}, "trust_domains": {}}')
