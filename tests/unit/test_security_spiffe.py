"""A87 SPIFFE rules, sans-IO: SPIFFE ID parsing and the peer's ID (C-core's
rules and words), trust bundle maps in the JSON shape C-core reads, the
file_watcher provider's ``spiffe_bundle_map_file`` behind
GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE, the contexts chosen by trust domain and
the peer checks (ALPN, SPIFFE, SANs) in C-core's order."""

from __future__ import annotations

import json
import ssl

import pytest

from pyxds.security import experiments
from pyxds.security.contexts import Trust
from pyxds.security.peer_check import ALPN_MISSING, SAN_MISMATCH, check_peer
from pyxds.security.providers import Certificates, FileWatcherProvider, validate_file_watcher_config
from pyxds.security.spiffe import (
    SpiffeBundleMap,
    SpiffeId,
    parse_bundle_map,
    parse_spiffe_id,
    peer_spiffe_id,
)
from pyxds.security.tls_config import ProviderRef, SanMatcher, UpstreamTlsConfig
from pyxds.testing.certs import CertAuthority, spiffe_bundle_map, write_spiffe_bundle_map


@pytest.fixture
def spiffe_on(monkeypatch):
    monkeypatch.setenv(experiments.SPIFFE_ENV, "true")


@pytest.fixture(scope="module")
def cas():
    return {"a": CertAuthority("domain a"), "b": CertAuthority("domain b")}


# ------------------------------------------------------------------ SPIFFE IDs


@pytest.mark.parametrize(
    ("uri", "domain", "path"),
    [
        ("spiffe://example.com", "example.com", ""),
        ("spiffe://example.com/us", "example.com", "/us"),
        ("spiffe://example.com/ns/default/sa/backend", "example.com", "/ns/default/sa/backend"),
        ("SPIFFE://example.com/x", "example.com", "/x"),  # the scheme in any case
        ("spiffe://a-b_c.0/P.a-t_H", "a-b_c.0", "/P.a-t_H"),
        ("spiffe://" + "a" * 255, "a" * 255, ""),
    ],
)
def test_valid_spiffe_ids_split_into_trust_domain_and_path(uri, domain, path):
    assert parse_spiffe_id(uri) == SpiffeId(domain, path)


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("", "SPIFFE ID cannot be parsed from empty URI"),
        ("spiffe://a/" + "b" * 2040, "URI length is 2051, maximum allowed for SPIFFE ID is 2048"),
        ("spiffe://a/b#c", "SPIFFE ID cannot contain query fragments"),
        ("spiffe://a/b?c=d", "SPIFFE ID cannot contain query parameters"),
        ("spiffe://a/\u00fc", "SPIFFE ID URI cannot contain non-ascii characters. Contains 0xc3"),
        ("https://example.com/a", "SPIFFE ID must start with spiffe://"),
        ("spiffe://example.com/", "SPIFFE ID cannot end with a /"),
        ("spiffe:///path", "The trust domain cannot be empty"),
        ("spiffe://Example.com/a", "Trust domain contains invalid character 'E'"),
        ("spiffe://ex:ample/a", "Trust domain contains invalid character ':'"),
        ("spiffe://" + "a" * 256, "Trust domain maximum length is 255 characters"),
        ("spiffe://a/b//c", "Path segment cannot be empty"),
        ("spiffe://a/./b", "Path segment cannot be a relative modifier (. or ..)"),
        ("spiffe://a/b/..", "Path segment cannot be a relative modifier (. or ..)"),
        ("spiffe://a/b c", "Path segment contains invalid character ' '"),
        ("spiffe://a/b%20c", "Path segment contains invalid character '%'"),
    ],
)
def test_malformed_spiffe_ids_are_rejected_in_c_cores_words(uri, reason):
    with pytest.raises(ValueError) as err:
        parse_spiffe_id(uri)
    assert str(err.value).startswith(reason)


def _peer(*sans):
    return {"subjectAltName": tuple(sans)}


def test_peer_spiffe_id_is_its_one_uri_san_other_kinds_do_not_count():
    peer = _peer(("DNS", "backend"), ("URI", "spiffe://a/s"), ("IP Address", "127.0.0.1"))
    assert peer_spiffe_id(peer) == SpiffeId("a", "/s")


@pytest.mark.parametrize(
    ("peer", "reason"),
    [
        (_peer(("DNS", "backend")), "spiffe: no SPIFFE ID found in leaf certificate."),
        ({}, "spiffe: no SPIFFE ID found in leaf certificate."),
        (
            _peer(("URI", "spiffe://a/x"), ("URI", "spiffe://a/y")),
            "spiffe: more than one SAN URI found",
        ),
        (_peer(("URI", "https://a/x")), "SPIFFE ID must start with spiffe://"),
    ],
)
def test_a_peer_without_exactly_one_valid_spiffe_uri_is_rejected(peer, reason):
    with pytest.raises(ValueError, match=reason.replace(".", r"\.")):
        peer_spiffe_id(peer)


# ------------------------------------------------------------------ bundle maps


def test_bundle_map_in_c_cores_shape_gives_each_domains_roots(cas):
    doc = spiffe_bundle_map({"a.example": [cas["a"]], "b.example": [cas["a"], cas["b"]]})
    bundle_map = parse_bundle_map(json.dumps(doc))
    assert bundle_map.roots("a.example") == (cas["a"].der,)
    assert bundle_map.roots("b.example") == (cas["a"].der, cas["b"].der)
    with pytest.raises(KeyError, match=r"No spiffe bundle found for trust domain c\.example"):
        bundle_map.roots("c.example")


def test_bundle_map_fields_c_core_does_not_read_are_ignored(cas):
    doc = spiffe_bundle_map({"a": [cas["a"]]}, kid="k1", alg="ES256")
    doc["trust_domains"]["a"]["spiffe_refresh_hint"] = 300
    doc["other"] = True
    assert parse_bundle_map(json.dumps(doc)).roots("a") == (cas["a"].der,)


def test_empty_map_and_empty_bundle_are_valid():
    assert parse_bundle_map('{"trust_domains": {}}').bundles == {}
    assert parse_bundle_map('{"trust_domains": {"a": {"keys": []}}}').roots("a") == ()


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.pop("trust_domains"), "field:trust_domains error:field not present"),
        (lambda d: d["trust_domains"]["a"].pop("keys"), 'trust_domains["a"].keys error:field not'),
        (
            lambda d: d["trust_domains"]["a"]["keys"][0].update(use="jwt-svid"),
            'keys[0].use error:value must be "x509-svid", got "jwt-svid"',
        ),
        (lambda d: d["trust_domains"]["a"]["keys"][0].pop("use"), "keys[0].use error:field not"),
        (
            lambda d: d["trust_domains"]["a"]["keys"][0].update(kty="OKP"),
            'keys[0].kty error:value must be one of "EC", "RSA", got "OKP"',
        ),
        (lambda d: d["trust_domains"]["a"]["keys"][0].pop("kty"), "keys[0].kty error:field not"),
        (lambda d: d["trust_domains"]["a"]["keys"][0].pop("x5c"), "keys[0].x5c error:field not"),
        (
            lambda d: d["trust_domains"]["a"]["keys"][0]["x5c"].append("AAAA"),
            "keys[0].x5c error:array length must be 1, got 2",
        ),
        (
            lambda d: d["trust_domains"]["a"]["keys"][0].update(x5c=["bm90IGEgY2VydA=="]),
            "keys[0].x5c[0] error:not a base64 DER X.509 certificate",
        ),
        (
            lambda d: d["trust_domains"].update(Bad=d["trust_domains"]["a"]),
            'field:trust_domains["Bad"] error:invalid trust domain',
        ),
    ],
)
def test_one_bad_entry_rejects_the_whole_map_naming_the_field(cas, mutate, problem):
    doc = spiffe_bundle_map({"a": [cas["a"]], "z": [cas["b"]]})
    mutate(doc)
    with pytest.raises(ValueError) as err:
        parse_bundle_map(json.dumps(doc))
    assert problem in str(err.value)


def test_a_map_that_is_not_json_is_rejected():
    with pytest.raises(ValueError, match="JSON parse error"):
        parse_bundle_map("{not json")
    with pytest.raises(ValueError, match="is not an object"):
        parse_bundle_map("[]")


# ------------------------------------------------------------------ provider


def test_spiffe_map_replaces_the_ca_file_when_switched_on(tmp_path, cas, spiffe_on):
    path = write_spiffe_bundle_map(str(tmp_path / "map.json"), spiffe_bundle_map({"a": [cas["a"]]}))
    (tmp_path / "ca.pem").write_bytes(cas["b"].pem)
    config = {"ca_certificate_file": str(tmp_path / "ca.pem"), "spiffe_bundle_map_file": path}
    certs = FileWatcherProvider(config).certificates()
    assert certs.ca_pem is None and certs.ca_error is None  # A87: the CA file is ignored
    assert certs.spiffe == SpiffeBundleMap({"a": (cas["a"].der,)})


def test_spiffe_field_is_ignored_without_the_switch(tmp_path, cas, monkeypatch):
    monkeypatch.delenv(experiments.SPIFFE_ENV, raising=False)
    path = write_spiffe_bundle_map(str(tmp_path / "m.json"), spiffe_bundle_map({}))
    (tmp_path / "ca.pem").write_bytes(cas["b"].pem)
    config = {"ca_certificate_file": str(tmp_path / "ca.pem"), "spiffe_bundle_map_file": path}
    certs = FileWatcherProvider(config).certificates()
    assert certs.spiffe is None and certs.ca_pem == cas["b"].pem
    # Without the switch a config naming only the map lacks a certificate source.
    assert validate_file_watcher_config({"spiffe_bundle_map_file": path}, "c") == [
        'c: at least one of "certificate_file" and "ca_certificate_file" must be specified'
    ]


def test_a87_spelling_of_the_field_is_read_too(tmp_path, cas, spiffe_on):
    path = write_spiffe_bundle_map(str(tmp_path / "m.json"), spiffe_bundle_map({"a": [cas["a"]]}))
    certs = FileWatcherProvider({"spiffe_trust_bundle_map_file": path}).certificates()
    assert certs.spiffe is not None and certs.spiffe.roots("a") == (cas["a"].der,)
    assert validate_file_watcher_config({"spiffe_trust_bundle_map_file": path}, "c") == []
    assert validate_file_watcher_config(
        {"spiffe_trust_bundle_map_file": path, "spiffe_bundle_map_file": "/other"}, "c"
    ) == [
        'c: fields "spiffe_bundle_map_file" and "spiffe_trust_bundle_map_file" name different files'
    ]


def test_bootstrap_config_rules_with_the_switch_are_c_cores(spiffe_on):
    assert validate_file_watcher_config({"spiffe_bundle_map_file": "/m"}, "c") == []
    assert validate_file_watcher_config({"refresh_interval": "1s"}, "c") == [
        'c: at least one of "certificate_file", "ca_certificate_file", and '
        '"spiffe_bundle_map_file" must be specified'
    ]
    assert validate_file_watcher_config({"spiffe_bundle_map_file": 3}, "c") == [
        "c.spiffe_bundle_map_file: is not a string"
    ]


@pytest.mark.parametrize(
    ("value", "enabled"),
    [
        *[(v, True) for v in ("true", "TRUE", "1", "yes", "t", "y")],
        *[(v, False) for v in ("false", "0", "no", "", "on")],
    ],
)
def test_the_switch_is_parsed_as_c_core_parses_booleans(monkeypatch, value, enabled):
    monkeypatch.setenv(experiments.SPIFFE_ENV, value)
    assert experiments.spiffe_enabled() is enabled


def test_a_map_that_fails_the_first_load_is_an_error_naming_the_file(tmp_path, spiffe_on):
    path = tmp_path / "map.json"
    path.write_text("{broken")
    certs = FileWatcherProvider({"spiffe_bundle_map_file": str(path)}).certificates()
    assert certs.spiffe is None
    assert certs.ca_error.startswith(f"spiffe bundle map file {path} failed to load: JSON parse")
    missing = tmp_path / "missing.json"
    certs = FileWatcherProvider({"spiffe_bundle_map_file": str(missing)}).certificates()
    assert certs.ca_error == (
        f"spiffe bundle map file {missing} failed to load: No such file or directory"
    )


def test_a_later_bad_map_keeps_the_map_in_use_and_a_good_one_replaces_it(tmp_path, cas, spiffe_on):
    now = [0.0]
    path = str(tmp_path / "map.json")
    write_spiffe_bundle_map(path, spiffe_bundle_map({"a": [cas["a"]]}))
    provider = FileWatcherProvider(
        {"spiffe_bundle_map_file": path, "refresh_interval": "1s"}, clock=lambda: now[0]
    )
    first = provider.certificates()
    for bad in ("{garbage", json.dumps({"trust_domains": {"UPPER": {"keys": []}}}), None):
        if bad is None:
            (tmp_path / "map.json").unlink()
        else:
            (tmp_path / "map.json").write_text(bad)
        now[0] += 1
        assert provider.certificates() is first  # A87: errors keep the map in use
    write_spiffe_bundle_map(path, spiffe_bundle_map({"b": [cas["b"]]}))
    now[0] += 1
    assert provider.certificates().spiffe == SpiffeBundleMap({"b": (cas["b"].der,)})


# ------------------------------------------------------------------ contexts and checks


def _trust(bundles, cas) -> Trust:
    spiffe = SpiffeBundleMap({d: tuple(cas[c].der for c in names) for d, names in bundles.items()})
    tls = UpstreamTlsConfig(ca=ProviderRef("mesh"))
    return Trust(tls, Certificates(None, None, None, None, None, 1, spiffe), None)


def test_one_trust_domain_needs_one_handshake_several_need_the_peers_roots(cas):
    single = _trust({"a": ["a"]}, cas)
    assert single.for_domain("a") is single.first
    several = _trust({"a": ["a"], "b": ["b"]}, cas)
    ctx_a = several.for_domain("a")
    assert ctx_a is not several.first and several.for_domain("a") is ctx_a
    assert several.for_domain("b") not in (ctx_a, several.first)
    with pytest.raises(KeyError, match="No spiffe bundle found for trust domain c"):
        several.for_domain("c")
    same_roots = _trust({"a": ["a"], "b": ["a"]}, cas)
    assert same_roots.for_domain("b") is same_roots.first


def _check(peer, tls=None, sni=None, spiffe=None, alpn="h2", contexts=None):
    tls = tls or UpstreamTlsConfig(ca=ProviderRef("mesh"))
    contexts = contexts or {}

    def domain_context(domain):
        if domain not in contexts:
            raise KeyError(f"No spiffe bundle found for trust domain {domain}")
        return contexts[domain]

    return check_peer(tls, sni, spiffe, domain_context, alpn, peer)


def test_alpn_is_checked_first_as_c_core():
    assert _check(_peer(("DNS", "x")), alpn=None) == ALPN_MISSING
    assert _check(_peer(("DNS", "x")), alpn="http/1.1") == ALPN_MISSING
    assert _check(_peer(("DNS", "x"))) is None


def test_spiffe_check_names_the_context_of_the_peers_domain():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    spiffe = SpiffeBundleMap({"a": ()})
    peer = _peer(("URI", "spiffe://a/svc"))
    assert _check(peer, spiffe=spiffe, contexts={"a": ctx}) is ctx
    assert _check(_peer(("URI", "spiffe://b/svc")), spiffe=spiffe, contexts={"a": ctx}) == (
        "SPIFFE verification failed: No spiffe bundle found for trust domain b"
    )
    assert _check(_peer(("DNS", "a")), spiffe=spiffe, contexts={"a": ctx}) == (
        "SPIFFE verification failed: spiffe: no SPIFFE ID found in leaf certificate."
    )


def test_san_matchers_still_apply_to_a_spiffe_peer():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    tls = UpstreamTlsConfig(
        ca=ProviderRef("mesh"), san_matchers=(SanMatcher("exact", "spiffe://a/other"),)
    )
    peer = _peer(("URI", "spiffe://a/svc"))
    assert _check(peer, tls=tls, spiffe=SpiffeBundleMap({"a": ()}), contexts={"a": ctx}) == (
        SAN_MISMATCH
    )
