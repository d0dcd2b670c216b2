"""A101 SNI rules, sans-IO: the Cluster's ``sni`` / ``auto_host_sni`` /
``auto_sni_san_validation`` (behind GRPC_EXPERIMENTAL_XDS_SNI, on by
default), the SNI each endpoint's connections send (from the endpoint's
host name: EDS ``hostname`` or a LOGICAL_DNS cluster's name), SAN validation
against it (DNS SANs, DNS rules; without an SNI the SAN matchers, as A101),
and subchannels keyed by their SNI."""

from __future__ import annotations

import grpc
import grpc.experimental
import pytest
from test_cds_support import build, cds_update, eds_entry, loc, xds_config
from test_security import TLS_A, FakeRelay, make_pool, parse

from pyxds.security import experiments
from pyxds.security.peer_check import SAN_MISMATCH, SNI_MISMATCH, check_peer
from pyxds.security.tls_config import (
    ADDRESS_NAME_ATTRIBUTE,
    SECURITY_ATTRIBUTE,
    ProviderRef,
    SanMatcher,
    UpstreamTlsConfig,
    server_name,
)
from pyxds.server import builders as b
from pyxds.xds.resources.types import EndpointAddress, Locality


def tls_with(**fields) -> UpstreamTlsConfig:
    return UpstreamTlsConfig(ca=ProviderRef("mesh"), **fields)


# ------------------------------------------------------------------ which SNI


@pytest.mark.parametrize(
    ("fields", "address_name", "sni"),
    [
        ({}, None, None),
        ({}, "host.example:443", None),  # auto_host_sni off: the host name is not used
        ({"sni": "cfg.example"}, "host.example:443", "cfg.example"),
        ({"auto_host_sni": True}, "host.example:443", "host.example"),  # without the port
        ({"auto_host_sni": True}, "host.example", "host.example"),
        ({"auto_host_sni": True}, "[2001:db8::1]:443", "2001:db8::1"),
        ({"auto_host_sni": True, "sni": "cfg.example"}, "host.example:1", "host.example"),
        ({"auto_host_sni": True, "sni": "cfg.example"}, None, "cfg.example"),  # no host name
        ({"auto_host_sni": True, "sni": "cfg.example"}, "", "cfg.example"),
        ({"auto_host_sni": True}, None, None),
    ],
)
def test_sni_is_the_host_name_then_the_configured_sni_then_none(fields, address_name, sni):
    assert server_name(tls_with(**fields), address_name) == sni


# ------------------------------------------------------------------ validation


def test_sni_fields_are_read_from_the_cluster():
    ctx = b.upstream_tls_context(
        "mesh", "mesh", sni="a.example", auto_host_sni=True, auto_sni_san_validation=True
    )
    config, error = parse(ctx)
    assert error == ""
    assert (config.sni, config.auto_host_sni, config.auto_sni_san_validation) == (
        "a.example",
        True,
        True,
    )


def test_an_sni_longer_than_255_characters_is_nacked_as_c_core():
    assert parse(b.upstream_tls_context("mesh", sni="a" * 255))[1] == ""
    config, error = parse(b.upstream_tls_context("mesh", sni="a" * 256))
    assert config is None
    assert error.endswith(".sni: must be shorter than 255 characters")


@pytest.mark.parametrize("value", ["false", "0", "no", "bogus"])
def test_sni_fields_are_ignored_when_the_switch_is_not_true(monkeypatch, value):
    monkeypatch.setenv(experiments.SNI_ENV, value)
    config, error = parse(
        b.upstream_tls_context(
            "mesh", sni="a" * 300, auto_host_sni=True, auto_sni_san_validation=True
        )
    )
    assert error == ""
    assert (config.sni, config.auto_host_sni, config.auto_sni_san_validation) == ("", False, False)


# ------------------------------------------------------------------ SAN validation against SNI


def _check(tls, sni, *sans):
    peer = {"subjectAltName": tuple(sans)}
    return check_peer(tls, sni, None, lambda d: None, "h2", peer)


@pytest.mark.parametrize(
    ("sni", "san", "ok"),
    [
        ("a.example", "a.example", True),
        ("A.Example", "a.example", True),  # DNS names in any case
        ("a.example.", "a.example", True),  # absolute and relative names are equal
        ("x.b.example", "*.b.example", True),  # a wildcard SAN covers one label
        ("y.x.b.example", "*.b.example", False),
        ("b.example", "*.b.example", False),
        ("a.example", "other.example", False),
    ],
)
def test_auto_sni_san_validation_matches_dns_sans_against_the_sni(sni, san, ok):
    tls = tls_with(auto_sni_san_validation=True)
    assert _check(tls, sni, ("DNS", san)) == (None if ok else SNI_MISMATCH)


def test_auto_sni_san_validation_replaces_the_san_matchers():
    tls = tls_with(
        auto_sni_san_validation=True, san_matchers=(SanMatcher("exact", "spiffe://x/y"),)
    )
    assert _check(tls, "a.example", ("DNS", "a.example")) is None  # the matcher is not used
    assert _check(tls, "a.example", ("URI", "spiffe://x/y")) == SNI_MISMATCH
    assert _check(tls, "a.example", ("URI", "a.example")) == SNI_MISMATCH  # DNS SANs only


def test_auto_sni_san_validation_without_sni_uses_the_san_matchers_as_a101():
    """A101: with no SNI the SAN matchers apply (as grpc-go); C-core 1.85
    compares with an empty name and refuses every peer (e2e:
    test_xds_security_sni.py differential, differences-from-c-core.md)."""
    tls = tls_with(auto_sni_san_validation=True, san_matchers=(SanMatcher("exact", "a.example"),))
    assert _check(tls, None, ("DNS", "a.example")) is None
    assert _check(tls, None, ("DNS", "b.example")) == SAN_MISMATCH
    assert _check(tls_with(auto_sni_san_validation=True), None, ("DNS", "b")) is None
    assert _check(tls_with(), None, ("DNS", "a.example")) is None


# ------------------------------------------------------------------ host names reach the pool


def test_eds_hostname_becomes_the_endpoints_address_name():
    helper, policy, config = build([{"cds_experimental": {"cluster": "c1"}}])
    locality = Locality(
        loc("a"),
        1,
        (
            EndpointAddress(("10.0.0.1:80",), hostname="one.example:80"),
            EndpointAddress(("10.0.0.2:80",)),
        ),
    )
    policy.update(cds_update(config, xds_config({"c1": eds_entry("c1", [locality])})))
    attrs = {s.address: s.attributes for s in helper.subchannels}
    assert attrs["10.0.0.1:80"][ADDRESS_NAME_ATTRIBUTE] == "one.example:80"
    assert ADDRESS_NAME_ATTRIBUTE not in attrs["10.0.0.2:80"]


def test_pool_gives_each_sni_its_own_relay(monkeypatch):
    creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    pool, _ = make_pool(monkeypatch, creds)
    auto = UpstreamTlsConfig(ca=TLS_A.ca, auto_host_sni=True)
    one = pool.create("10.0.0.1:80", {SECURITY_ATTRIBUTE: auto, ADDRESS_NAME_ATTRIBUTE: "a:80"})
    same = pool.create("10.0.0.1:80", {SECURITY_ATTRIBUTE: auto, ADDRESS_NAME_ATTRIBUTE: "a:80"})
    other = pool.create("10.0.0.1:80", {SECURITY_ATTRIBUTE: auto, ADDRESS_NAME_ATTRIBUTE: "b:80"})
    assert one.core is same.core and other.core is not one.core
    assert [r.sni for r in FakeRelay.made] == ["a", "b"]
