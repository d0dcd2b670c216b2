"""A71/A40: the XdsClient key and CSDS ``client_scope`` of a target is the
target as C-core writes it (values read from grpcio-csds over C-core; the e2e
differential in tests/e2e/test_admin_csds.py compares them live)."""

from __future__ import annotations

import pytest

from pyxds.channel.core import parse_target
from pyxds.resolver.xds_resolver import xds_client_scope


@pytest.mark.parametrize(
    ("target", "scope"),
    [
        ("xds:///echo-service", "xds:/echo-service"),
        ("xds:echo-service", "xds:echo-service"),
        ("xds:///echo%20service", "xds:/echo%20service"),
        ("xds:///a:b@c", "xds:/a:b@c"),
        ("xds:///echo-service?q=1", "xds:/echo-service?q=1"),
        ("xds://auth.example/echo-service", "xds://auth.example/echo-service"),
    ],
)
def test_client_scope_is_the_target_uri_written_again_as_c_core_does(target, scope):
    assert xds_client_scope(target) == scope


def test_targets_differing_only_in_form_share_one_scope():
    # one XdsClient per key: xds:///x and xds:/x are the same target
    assert xds_client_scope("xds:///x") == xds_client_scope("xds:/x")


@pytest.mark.parametrize(
    ("target", "scheme"),
    [
        ("xds:echo-service", "xds"),
        ("xds:///echo-service", "xds"),
        ("localhost:50051", "dns"),
        ("127.0.0.1:50051", "dns"),
        ("ipv4:127.0.0.1:1", "ipv4"),
    ],
)
def test_a_registered_scheme_without_slashes_is_that_scheme_as_in_c_core(target, scheme):
    assert parse_target(target)[0] == scheme
