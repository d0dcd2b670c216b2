"""xDS security conformance cases taken from the other gRPC implementations'
test suites and the gRFCs, sans-IO:

* SAN matching (gRFC A29 "Server Authorization"): C-core
  ``test/core/credentials/transport/xds/xds_credentials_test.cc``
  (``XdsSanMatchingTest.*``), grpc-go
  ``internal/credentials/xds/handshake_info_test.go`` (``TestDNSMatch``,
  ``TestMatchingSANExists_*``), grpc-java
  ``xds/.../security/trust/XdsX509TrustManagerTest.java``.
* SPIFFE IDs and bundle maps (gRFC A87): C-core
  ``test/core/credentials/transport/tls/spiffe_utils_test.cc``
  (``SpiffeId.*``, ``SpiffeBundle.*``), grpc-go
  ``internal/credentials/spiffe/spiffe_test.go``.
* SNI (gRFC A101): the gRFC's text, grpc-go ``handshake_info_test.go``
  (``TestAutoHostSNI_DNS_SANValidation_Failures``) and
  ``test/xds/xds_client_sni_test.go`` (``TestClientSideXDS_FallbackSANMatchers``).
* UpstreamTlsContext validation (A29 "CDS changes"): C-core
  ``test/core/xds/xds_common_types_test.cc`` (``CommonTlsConfigTest.*``),
  ``test/core/xds/xds_cluster_resource_type_test.cc`` (``TlsConfigTest.*``),
  grpc-go ``internal/xds/xdsclient/xdsresource/unmarshal_cds_test.go``.

Where the implementations disagree, the case says which one pyxds follows
(the spec first, then C-core) and why.
"""

from __future__ import annotations

import base64
import json
import re

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from google.protobuf import struct_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.security import san
from pyxds.security.peer_check import SAN_MISMATCH, SNI_MISMATCH, check_peer
from pyxds.security.spiffe import SpiffeId, parse_bundle_map, parse_spiffe_id, peer_spiffe_id
from pyxds.security.tls_config import (
    ProviderRef,
    SanMatcher,
    UpstreamTlsConfig,
    parse_upstream_tls_context,
)
from pyxds.server import builders as b
from pyxds.testing.certs import CertAuthority, spiffe_bundle_map
from pyxds.xds.resources._common import Errors
from pyxds.xds.resources.cluster import decode_cluster

PROVIDERS = {"mesh": {"plugin_name": "file_watcher", "config": {"ca_certificate_file": "/ca"}}}


def matchers(*specs: dict) -> tuple[SanMatcher, ...]:
    """SanMatchers as the CDS validator builds them from StringMatcher protos
    (``{"exact": "x"}``, ``{"prefix": "p", "ignore_case": True}``,
    ``{"safe_regex": "..."}``)."""
    errs = Errors()
    ctx = b.upstream_tls_context("mesh", None, list(specs))
    config = parse_upstream_tls_context(ctx.SerializeToString(), errs, PROVIDERS)
    assert config is not None, errs.text()
    return config.san_matchers


def cert(*, dns=(), uri=(), email=(), ip=()) -> dict:
    """A peer certificate as ``ssl.getpeercert()`` shows it."""
    sans = [("DNS", v) for v in dns] + [("URI", v) for v in uri]
    sans += [("email", v) for v in email] + [("IP Address", v) for v in ip]
    return {"subjectAltName": tuple(sans)}


def accepts(specs, peer) -> bool:
    return san.check(matchers(*specs), peer)


# ------------------------------------------------------------------ A29 SAN matching: C-core


def ex(value):
    return {"exact": value}


@pytest.mark.parametrize(
    ("sans", "specs", "ok"),
    [
        # XdsSanMatchingTest.EmptySansList / EmptyMatchersList
        ((), [ex("a.example.com"), ex("b.example.com")], False),
        (("a.example.com", "foo.example.com"), [], True),
        # ExactMatchIllegalValues: a SAN or name starting with "." and an empty one never match
        ((".a.example.com",), [ex(""), ex("a.example.com"), ex(".a.example.com")], False),
        (("",), [ex(""), ex("a.example.com"), ex(".a.example.com")], False),
        (("a.example.com",), [ex(""), ex("a.example.com"), ex(".a.example.com")], True),
        # ExactMatchDns
        (("a.example.com",), [ex("a.example.com")], True),
        (("a.example.com",), [ex("b.example.com")], False),
        (("b.example.com.",), [ex("a.example.com.")], False),
        (("b.example.com.",), [ex("b.example.com.")], True),
        # ExactMatchWithFullyQualifiedSan / ...Matcher
        (("a.example.com.",), [ex("a.example.com")], True),
        (("a.example.com.",), [ex("b.example.com")], False),
        (("a.example.com",), [ex("a.example.com.")], True),
        (("a.example.com",), [ex("b.example.com.")], False),
        # ExactMatchDnsCaseInsensitive
        (("A.eXaMpLe.CoM",), [ex("a.example.com")], True),
        (("A.eXaMpLe.CoM",), [ex("a.ExAmPlE.cOm")], True),
        # ExactMatchMultipleSansMultipleMatchers
        (
            ("a.example.com", "foo.example.com", "b.example.com"),
            [ex("abc.example.com"), ex("foo.example.com"), ex("xyz.example.com")],
            True,
        ),
        # ExactMatchWildCard
        (("*.example.com",), [ex("a.example.com")], True),
        (("*.example.com",), [ex("fOo.ExAmPlE.cOm")], True),
        (("*.example.com",), [ex("BaR.eXaMpLe.CoM")], True),
        (("*.example.com",), [ex(".example.com")], False),
        (("*.example.com",), [ex("example.com")], False),
        (("*.example.com",), [ex("foo.bar.com")], False),
        # ExactMatchWildCardDoesNotMatchSingleLabelDomain
        (("*",), [ex("abc")], False),
        (("*",), [ex("abc.com.")], False),
        (("*",), [ex("bar.baz.com")], False),
        (("*.",), [ex("abc")], False),
        (("*.",), [ex("abc.com.")], False),
        (("*.",), [ex("bar.baz.com")], False),
        # ExactMatchAsteriskOnlyPermittedInLeftMostDomainName
        (("*.example.*.com",), [ex("abc.example.xyz.com")], False),
        (("*.exam*ple.com",), [ex("abc.example.com")], False),
        # ExactMatchAsteriskMustBeOnlyCharacterInLeftMostDomainName
        (("*c.example.com",), [ex("abc.example.com")], False),
        # ExactMatchAsteriskMatchingAcrossDomainLabelsNotPermitted
        (("*.com",), [ex("abc.example.com")], False),
        (("*.com",), [ex("foo.bar.baz.com")], False),
        (("*.com",), [ex("abc.com")], True),
        # PrefixMatch / PrefixMatchIgnoreCase
        (("abc.com",), [{"prefix": "abc"}], True),
        (("AbC.CoM",), [{"prefix": "abc"}], False),
        (("xyz.com",), [{"prefix": "abc"}], False),
        (("aBc.cOm",), [{"prefix": "AbC", "ignore_case": True}], True),
        (("abc.com",), [{"prefix": "AbC", "ignore_case": True}], True),
        (("xyz.com",), [{"prefix": "AbC", "ignore_case": True}], False),
        # SuffixMatch / SuffixMatchIgnoreCase
        (("abc.com",), [{"suffix": ".com"}], True),
        (("AbC.CoM",), [{"suffix": ".com"}], False),
        (("abc.xyz",), [{"suffix": ".com"}], False),
        (("abc.com",), [{"suffix": ".CoM", "ignore_case": True}], True),
        (("AbC.cOm",), [{"suffix": ".CoM", "ignore_case": True}], True),
        (("abc.xyz",), [{"suffix": ".CoM", "ignore_case": True}], False),
        # ContainsMatch / ContainsMatchIgnoresCase
        (("abc.com",), [{"contains": "abc"}], True),
        (("xyz.abc.com",), [{"contains": "abc"}], True),
        (("foo.AbC.com",), [{"contains": "abc"}], False),
        (("abc.com",), [{"contains": "AbC", "ignore_case": True}], True),
        (("xyz.abc.com",), [{"contains": "AbC", "ignore_case": True}], True),
        (("foo.aBc.com",), [{"contains": "AbC", "ignore_case": True}], True),
        (("foo.Ab.com",), [{"contains": "AbC", "ignore_case": True}], False),
        # RegexMatch
        (("abc.example.com",), [{"safe_regex": "(abc|xyz).example.com"}], True),
        (("xyz.example.com",), [{"safe_regex": "(abc|xyz).example.com"}], True),
        (("foo.example.com",), [{"safe_regex": "(abc|xyz).example.com"}], False),
    ],
)
def test_dns_san_matching_agrees_with_c_core_xds_san_matching_tests(sans, specs, ok):
    """C-core xds_credentials_test.cc XdsSanMatchingTest.* (SANs given as DNS SANs)."""
    assert accepts(specs, cert(dns=sans)) is ok


# ------------------------------------------------------------------ A29 SAN matching: grpc-go


@pytest.mark.parametrize(
    ("name", "san_entry", "ok"),
    [
        ("aa.example.com", "*a.example.com", False),  # invalid wildcard 1
        ("aa.example.com", "a*.example.com", False),  # invalid wildcard 2
        ("abc.example.com", "a*c.example.com", False),  # invalid wildcard 3
        ("abc.test.example.com", "abc.*.example.com", False),  # wildcard in a middle label
        ("a.example.com", "*", False),  # single component wildcard
        ("a.com", "*.example.com", False),  # short host name
        ("a.notexample.com", "*.example.com", False),  # suffix mismatch
        ("sub.test.example.com", "*.example.com.", False),  # across labels
        ("test.example.com", "test.example.com.", True),  # host without the final dot
        ("test.example.com.", "test.example.com", True),  # pattern without the final dot
        ("TEST.EXAMPLE.COM.", "test.example.com.", True),  # case insensitive
        ("test.example.com", "test.example.com", True),
        ("a.example.com", "*.example.com", True),  # good wildcard
    ],
)
def test_dns_exact_matching_agrees_with_grpc_go_dns_match(name, san_entry, ok):
    """grpc-go handshake_info_test.go TestDNSMatch (dnsMatch(host, pattern))."""
    assert san.dns_exact(san_entry, name) is ok
    assert accepts([ex(name)], cert(dns=[san_entry])) is ok


GO_URIS = ("http://golang.org", "https://github.com/grpc/grpc-go")
GO_EMAILS = ("foobar@example.com", "barbaz@test.com")
GO_IPS = ("192.0.0.1", "2001:db8::68")


@pytest.mark.parametrize(
    "specs",
    [
        [ex("abcd.test.com"), ex("http://golang"), ex("HTTP://GOLANG.ORG")],
        [{"prefix": "i-aint-the-one"}, {"prefix": "192.168.1.1"}, {"prefix": "FOO.BAR"}],
        [{"suffix": "i-aint-the-one"}, {"suffix": "1::68"}, {"suffix": ".COM"}],
        [{"safe_regex": r".*\.examples\.com"}, {"safe_regex": r"192\.[0-9]{1,3}\.1\.1"}],
        [{"contains": "i-aint-the-one"}, {"contains": "2001:db8:1:1::68"}, {"contains": "GRPC"}],
    ],
    ids=["exact", "prefix", "suffix", "regex", "contains"],
)
def test_no_san_of_any_kind_matches_grpc_go_failure_cases(specs):
    """grpc-go handshake_info_test.go TestMatchingSANExists_FailureCases.
    ``exact: HTTP://GOLANG.ORG`` against the URI SAN ``http://golang.org``
    fails (DNS rules are for DNS SANs; C-core would match it, see
    differences-from-c-core.md)."""
    peer = cert(
        dns=("foo.bar.example.com", "bar.baz.test.com", "*.example.com"),
        uri=GO_URIS,
        email=GO_EMAILS,
        ip=GO_IPS,
    )
    assert not accepts(specs, peer)


@pytest.mark.parametrize(
    "specs",
    [
        [],
        [{"prefix": "192.168.1.1"}, ex("https://github.com/grpc/grpc-java"), ex("abc.example.com")],
        [{"exact": "FOOBAR@EXAMPLE.COM", "ignore_case": True}],
        [{"suffix": ".co.in"}, {"prefix": "192.168.1.1"}, {"prefix": "baz.test"}],
        [{"prefix": "BAZ.test", "ignore_case": True}],
        [
            {"safe_regex": r"192\.[0-9]{1,3}\.1\.1"},
            {"suffix": "192.168.1.1"},
            {"suffix": "@test.com"},
        ],
        [{"suffix": "@test.COM", "ignore_case": True}],
        [
            {"contains": "https://github.com/grpc/grpc-java"},
            {"safe_regex": r"192\.[0-9]{1,3}\.1\.1"},
            {"safe_regex": r".*\.test\.com"},
        ],
        [
            ex("https://github.com/grpc/grpc-java"),
            {"contains": "2001:68::db8"},
            {"contains": "192.0.0"},
        ],
        [{"contains": "GRPC", "ignore_case": True}],
    ],
    ids=[
        "no matchers",
        "exact dns wildcard",
        "exact ignore case (email)",
        "prefix",
        "prefix ignore case",
        "suffix (email)",
        "suffix ignore case",
        "regex",
        "contains (IP)",
        "contains ignore case (URI)",
    ],
)
def test_one_matching_san_is_enough_grpc_go_success_cases(specs):
    """grpc-go handshake_info_test.go TestMatchingSANExists_Success: DNS,
    email, IP and URI SANs all count (A29)."""
    peer = cert(dns=("baz.test.com", "*.example.com"), uri=GO_URIS, email=GO_EMAILS, ip=GO_IPS)
    assert accepts(specs, peer)


# ------------------------------------------------------------------ A29 SAN matching: grpc-java

JAVA_SERVER1 = cert(
    dns=("*.test.google.fr", "waterzooi.test.google.be", "*.test.youtube.com"),
    ip=("192.168.1.3",),
)


@pytest.mark.parametrize(
    ("specs", "ok"),
    [
        ([ex("waterzooi.test.google.be")], True),  # oneSanInPeerCertsVerifies
        # oneSanInPeerCertsVerifies_differentCase_expectException: grpc-java
        # fails; DNS names compare in any case in C-core (ExactMatchDnsCaseInsensitive)
        # and A29's DNS rules, which pyxds follows.
        ([ex("waterZooi.test.Google.be")], True),
        ([{"exact": "Waterzooi.Test.google.be", "ignore_case": True}], True),
        ([{"prefix": "waterzooi."}], True),  # oneSanInPeerCerts_prefix
        ([{"prefix": "waterZooi."}], False),
        ([{"prefix": "WaterZooi.", "ignore_case": True}], True),
        ([{"suffix": ".google.be"}], True),  # oneSanInPeerCerts_suffix
        ([{"suffix": ".gooGle.bE"}], False),
        ([{"suffix": ".GooGle.BE", "ignore_case": True}], True),
        ([{"contains": "zooi.test.google"}], True),  # oneSanInPeerCerts_substring
        ([{"contains": "zooi.Test.gooGle"}], False),
        ([{"contains": "zooI.Test.Google", "ignore_case": True}], True),
        ([{"safe_regex": r"water[[:alpha:]]{1}ooi\.test\.google\.be"}], True),  # safeRegex
        ([{"safe_regex": r"no-match-string|\*\.test\.youtube\.com"}], True),  # safeRegex1
        ([{"safe_regex": r"([[:digit:]]{1,3}\.){3}[[:digit:]]{1,3}"}], True),  # _ipAddress
        ([{"safe_regex": r"water[[:alpha:]]{2}ooi\.test\.google\.be"}], False),  # _noMatch
        ([ex("x.foo.com"), ex("waterzooi.test.google.be")], True),  # MultipleVerifySans
        ([ex("x.foo.com")], False),  # oneSanInPeerCertsNotFoundException
        ([ex("x.foo.com"), {"suffix": "test.youTube.Com", "ignore_case": True}], True),
        ([ex("x.foo.com"), {"contains": "est.Google.f", "ignore_case": True}], True),
        ([ex("sub.abc.test.youtube.com")], False),  # wildcardSanInPeerCertsSubdomainMismatch
        ([ex("x.foo.com"), ex("192.168.1.3")], True),  # oneIpAddressInPeerCertsVerifies
        ([ex("x.foo.com"), ex("192.168.2.3")], False),  # oneIpAddressInPeerCertsMismatch
    ],
)
def test_san_matching_agrees_with_grpc_java_trust_manager_cases(specs, ok):
    """grpc-java XdsX509TrustManagerTest (server1.pem's SANs)."""
    assert accepts(specs, JAVA_SERVER1) is ok


def test_a_peer_without_certificate_or_sans_fails_and_no_matchers_accept_anything():
    """grpc-java XdsX509TrustManagerTest missingPeerCerts, emptyArrayPeerCerts,
    noSansInPeerCerts, nullCertContextTest, emptySanListContextTest."""
    assert not accepts([ex("foo.com")], None)
    assert not accepts([ex("foo.com")], {})
    assert not accepts([ex("foo.com")], {"subject": ((("commonName", "foo.com"),),)})
    assert accepts([], None)
    assert accepts([], cert(dns=["anything"]))


def test_ipv6_san_is_compared_in_canonical_text():
    """A29: an IP SAN is matched in its canonical form (RFC 5952)."""
    peer = cert(ip=["2001:DB8:0:0:0:0:0:68"])
    assert accepts([ex("2001:db8::68")], peer)
    assert accepts([{"suffix": "db8::68"}], peer)
    assert not accepts([ex("2001:DB8::68")], peer)  # exact is case-sensitive for IPs


@pytest.mark.parametrize(
    ("specs", "sans"),
    [
        ([{"prefix": "key", "ignore_case": True}], cert(uri=["\u212aey://x"])),
        ([{"exact": "key@example.com", "ignore_case": True}], cert(email=["\u212aey@example.com"])),
        ([{"contains": "\u212a", "ignore_case": True}], cert(uri=["spiffe://k"])),
        ([ex("key.example.com")], cert(dns=["\u212aey.example.com"])),
    ],
)
def test_ignore_case_and_dns_case_folding_are_ascii_only_as_c_core(specs, sans):
    """C-core's StringMatcher (case_sensitive=false) and
    VerifySubjectAlternativeName fold with absl::AsciiStrToLower /
    EqualsIgnoreCase: U+212A KELVIN SIGN is not "k" on either side (Python's
    str.lower() makes it one)."""
    assert not accepts(specs, sans)


def test_ascii_case_folding_still_matches_dns_and_ignore_case():
    assert accepts([ex("KEY.example.com")], cert(dns=["key.EXAMPLE.com"]))
    assert accepts([{"prefix": "KEY", "ignore_case": True}], cert(uri=["key://x"]))


def test_empty_prefix_suffix_contains_matchers_are_accepted_as_c_core():
    """grpc-go unmarshal_cds_test.go empty-{prefix,suffix,contains}-in-matching-SAN
    NACKs these; C-core's StringMatcherParse accepts them (an empty prefix
    matches every non-empty SAN), and pyxds does as C-core."""
    for kind in ("prefix", "suffix", "contains"):
        (m,) = matchers({kind: ""})
        assert san.check([m], cert(dns=["a.example"]))
        assert not san.check([m], cert(dns=[""]))


# ------------------------------------------------------------------ A87 SPIFFE IDs (C-core)

TD_CHARS = "MUST contain only lowercase letters, numbers, dots, dashes, and underscores"
PATH_CHARS = "MUST contain only letters, numbers, dots, dashes, and underscores"


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("", "SPIFFE ID cannot be parsed from empty URI"),  # EmptyFails
        ("a" * 2049, "URI length is 2049, maximum allowed for SPIFFE ID is 2048"),  # TooLongFails
        ("ab#de", "SPIFFE ID cannot contain query fragments"),  # ContainsHashtagFails
        ("ab?de", "SPIFFE ID cannot contain query parameters"),  # ContainsQuestionMarkFails
        ("www://foo/bar", "SPIFFE ID must start with spiffe://"),  # DoesNotStartWithSpiffeFails
        ("spiffe:/foo/bar/", "SPIFFE ID must start with spiffe://"),  # ShortSchemePrefixFails
        (
            "\u017fPiffe://trustdomain/path",  # SchemeInvalidCharacterFails: C-core names the byte
            "SPIFFE ID URI cannot contain non-ascii characters. Contains 0xc5",
        ),
        ("spiffe://foo/bar/", "SPIFFE ID cannot end with a /"),  # EndWithSlashFails
        ("spiffe://", "SPIFFE ID cannot end with a /"),  # NoTrustDomainFails
        ("spiffe:///path", "The trust domain cannot be empty"),  # NoTrustDomainWithPathFails
        ("spiffe://" + "a" * 256, "Trust domain maximum length is 255 characters"),
        (
            "spiffe://domain@userinfo",  # TrustDomainWithUserInfoFails
            f"Trust domain contains invalid character '@'. {TD_CHARS}",
        ),
        ("spiffe://foo$bar", f"Trust domain contains invalid character '$'. {TD_CHARS}"),
        ("spiffe://BadDdomain", f"Trust domain contains invalid character 'B'. {TD_CHARS}"),
        (
            "spiffe://example/path/./foo",  # PathContainsRelativeModifier1Fails
            "Path segment cannot be a relative modifier (. or ..)",
        ),
        (
            "spiffe://example/path/../foo",  # PathContainsRelativeModifier2Fails
            "Path segment cannot be a relative modifier (. or ..)",
        ),
        (
            "spiffe://example/path/foo.bar/foo@bar",  # PathSegmentBadCharacterFails
            f"Path segment contains invalid character '@'. {PATH_CHARS}",
        ),
        (
            "spiffe://foo\u00b5bar/path",  # TrustDomainContainsNonASCIIFails
            "SPIFFE ID URI cannot contain non-ascii characters. Contains 0xc2",
        ),
        (
            "spiffe://foo%21bar/path",  # TrustDomainPercentEncodingFails
            f"Trust domain contains invalid character '%'. {TD_CHARS}",
        ),
        ("spiffe://foo/", "SPIFFE ID cannot end with a /"),  # TrustDomainTrailingSlashFails
        (
            "spiffe://foo:1234/path",  # PortInTrustDomainFails
            f"Trust domain contains invalid character ':'. {TD_CHARS}",
        ),
        ("spiffe://foo/bar?query", "SPIFFE ID cannot contain query parameters"),
        (
            "spiffe://foo/p\ath",  # EscapedCharacterInPathFails
            f"Path segment contains invalid character '\a'. {PATH_CHARS}",
        ),
        ("spiffe://foo/pa#h", "SPIFFE ID cannot contain query fragments"),  # FragmentInPathFails
        ("spiffe://foo/bar//baz", "Path segment cannot be empty"),  # MultipleSlashesInPathFails
        (
            "spiffe://foo.bar/foo\u00b5bar",  # ContainsNonASCIIPathFails
            "SPIFFE ID URI cannot contain non-ascii characters. Contains 0xc2",
        ),
    ],
)
def test_spiffe_id_errors_are_c_cores_word_for_word(uri, reason):
    """C-core spiffe_utils_test.cc SpiffeId.*Fails."""
    with pytest.raises(ValueError) as err:
        parse_spiffe_id(uri)
    assert str(err.value) == reason


def test_spiffe_id_length_is_counted_in_utf8_bytes_as_c_core():
    """C-core checks the length (bytes of the URI) before its characters:
    1100 two-byte characters are 2200 bytes, too long."""
    with pytest.raises(ValueError, match="URI length is 2200, maximum allowed"):
        parse_spiffe_id("\u00b5" * 1100)


@pytest.mark.parametrize(
    ("uri", "domain", "path"),
    [
        ("spiffe://example.com", "example.com", ""),  # NoPathSuccess
        ("spiffe://example.com/us", "example.com", "/us"),  # BasicSuccess
        ("sPiffe://example.com/us", "example.com", "/us"),  # WeirdCapitalizationSuccess
        (
            "spiffe://example.com/country/us/state/FL/city/Miami",  # LongPathSuccess
            "example.com",
            "/country/us/state/FL/city/Miami",
        ),
        (
            "spiffe://abcdefghijklmnopqrstuvwxyz1234567890.-_/"  # AcceptedCharactersSuccess
            "abcdefghijklmnopqrstuvwxyz1234567890.-_",
            "abcdefghijklmnopqrstuvwxyz1234567890.-_",
            "/abcdefghijklmnopqrstuvwxyz1234567890.-_",
        ),
        ("spiffe://trustdomain/.a..", "trustdomain", "/.a.."),  # NonRelativePathDotsSuccess
        ("spiffe://trustdomain/...", "trustdomain", "/..."),  # TripleDotsSuccess
    ],
)
def test_spiffe_ids_c_core_accepts(uri, domain, path):
    """C-core spiffe_utils_test.cc SpiffeId.*Success."""
    assert parse_spiffe_id(uri) == SpiffeId(domain, path)


JAVA_BAD_IDS = [
    "spiffe:///",
    "spiffe://example!com",
    "spiffe://example\u044f.com/workload-1",
    "spiffe://example.com/us/florida/miami\u044f",
    "spiffe:/trustdomain/path",
    "spiffe:///path",
    "spiffe://trust%20domain/path",
    "spiffe://user@trustdomain/path",
    "spiffe:// /",
    "",
    "http://trustdomain/path",
    "//trustdomain/path",
    "://trustdomain/path",
    "piffe://trustdomain/path",
    "://",
    "://trustdomain",
    "spiff",
    "spiffe",
    "spiffe:////",
    "spiffe://trust.domain/../path",
    "spiffe://pi.eu." + "pi.eu" * 50,  # a trust domain over 255 characters
    "spiffe://mydomain%21com/" + "qwert" * 405,  # over 2048 characters
    "spiffe://example.com//",
    "spiffe://example.com/us//miami",
    "spiffe://example.com/us/.",
    "spiffe://example.com/us!",
    "spiffe://eXample.com",
]


@pytest.mark.parametrize("uri", JAVA_BAD_IDS)
def test_spiffe_ids_grpc_java_refuses_are_refused(uri):
    """grpc-java SpiffeUtilTest ParseFailureTest and ExceptionMessageTest
    (the words are C-core's, checked above)."""
    with pytest.raises(ValueError):
        parse_spiffe_id(uri)


@pytest.mark.parametrize(
    ("uri", "domain", "path"),
    [
        (
            "spIFfe://qa-staging.final_check.example.com/us",
            "qa-staging.final_check.example.com",
            "/us",
        ),
        (
            "SPIFFE://example.com/Czech.Republic/region0.1/city_of-Prague",
            "example.com",
            "/Czech.Republic/region0.1/city_of-Prague",
        ),
        ("spiffe://trust-domain-name/path", "trust-domain-name", "/path"),
        (
            "spiffe://k8s-west.example.com/ns/staging/sa/default",
            "k8s-west.example.com",
            "/ns/staging/sa/default",
        ),
        (
            "spiffe://example.com/9eebccd2-12bf-40a6-b262-65fe0487d453",
            "example.com",
            "/9eebccd2-12bf-40a6-b262-65fe0487d453",
        ),
        ("spiffe://trustdomain/abc0123.-_", "trustdomain", "/abc0123.-_"),
        ("spiffe://trustdomain0123456789/path", "trustdomain0123456789", "/path"),
    ],
)
def test_spiffe_ids_grpc_java_accepts_are_accepted(uri, domain, path):
    """grpc-java SpiffeUtilTest ParseSuccessTest."""
    assert parse_spiffe_id(uri) == SpiffeId(domain, path)


# ------------------------------------------------------------------ A87 bundle maps


@pytest.fixture(scope="module")
def ca():
    return CertAuthority("conformance spiffe")


def _bundle(ca, **key_fields):
    return spiffe_bundle_map({"example.com": [ca], "test.example.com": [ca]}, **key_fields)


def _error(doc) -> str:
    with pytest.raises(ValueError) as err:
        parse_bundle_map(doc if isinstance(doc, str) else json.dumps(doc))
    return str(err.value)


def test_bundle_map_errors_are_c_cores_word_for_word(ca):
    """C-core spiffe_utils_test.cc SpiffeBundle.*Fails (the test files'
    shapes rebuilt around a generated CA)."""
    # EmptyKeysFails / EmptyStringKeyFails: the trust domain "" is invalid
    doc = {"trust_domains": {"": {"spiffe_sequence": 12035488, "keys": []}}}
    assert _error(doc) == (
        'errors validating JSON: [field:trust_domains[""] error:invalid '
        "trust domain: INVALID_ARGUMENT: Trust domain cannot be empty]"
    )
    # InvalidTrustDomainFails
    doc = {"trust_domains": {"invalid#character": {"keys": []}}}
    assert _error(doc) == (
        'errors validating JSON: [field:trust_domains["invalid#character"] '
        "error:invalid trust domain: INVALID_ARGUMENT: Trust domain contains "
        "invalid character '#'. MUST contain only lowercase letters, "
        "numbers, dots, dashes, and underscores]"
    )
    # MalformedJsonFails: a JSON array, not an object
    assert _error('["test.google.com", "test.google.com.au"]') == (
        "errors validating JSON: [field: error:is not an object]"
    )
    # WrongKtyFails
    doc = _bundle(ca, kty="DSA")
    del doc["trust_domains"]["test.example.com"]
    assert _error(doc) == (
        'errors validating JSON: [field:trust_domains["example.com"].keys[0].kty '
        'error:value must be one of "EC", "RSA", got "DSA"]'
    )
    # WrongKidFails: "kid" in place of "kty"
    doc = _bundle(ca, kid="Some value", kty=None)
    del doc["trust_domains"]["test.example.com"]
    assert _error(doc) == (
        'errors validating JSON: [field:trust_domains["example.com"].keys[0].kty '
        "error:field not present]"
    )
    # MultiCertsFails
    doc = spiffe_bundle_map({"google.com": [ca]})
    key = doc["trust_domains"]["google.com"]["keys"][0]
    key["x5c"].append(key["x5c"][0])
    assert _error(doc) == (
        'errors validating JSON: [field:trust_domains["google.com"].keys[0].x5c '
        "error:array length must be 1, got 2]"
    )
    # WrongRootFails: "trustDomains"
    doc = {"trustDomains": _bundle(ca)["trust_domains"]}
    assert _error(doc) == "errors validating JSON: [field:trust_domains error:field not present]"
    # WrongUseFails
    doc = _bundle(ca, use="NOT-x509-svid")
    del doc["trust_domains"]["test.example.com"]
    assert _error(doc) == (
        'errors validating JSON: [field:trust_domains["example.com"].keys[0].use '
        'error:value must be "x509-svid", got "NOT-x509-svid"]'
    )


def test_a_bundle_map_with_a_duplicate_key_is_rejected(ca):
    """grpc-java SpiffeUtilTest loadTrustBundleFromFileFailureTest
    (spiffebundle_duplicates.json: "Duplicate key found: google.com");
    C-core's JSON reader refuses duplicate keys too ('duplicate key "..." at
    index N'), so the whole map is refused, never the last entry kept."""
    one = json.dumps(spiffe_bundle_map({"google.com": [ca]})["trust_domains"]["google.com"])
    text = '{"trust_domains": {"google.com": ' + one + ', "google.com": ' + one + "}}"
    assert 'duplicate key "google.com"' in _error(text)
    text = '{"trust_domains": {"google.com": ' + one + '}, "trust_domains": {}}'
    assert 'duplicate key "trust_domains"' in _error(text)


def test_keys_with_a_kid_are_read_as_c_core():
    """grpc-java SpiffeUtilTest refuses a key with "kid" ("'kid' parameter
    must not be set"); C-core's loader does not read "kid" (A87 names
    use/kty/x5c only), and pyxds does as C-core."""
    authority = CertAuthority("kid")
    doc = spiffe_bundle_map({"google.com": [authority]}, kid="some value")
    assert parse_bundle_map(json.dumps(doc)).roots("google.com") == (authority.der,)


def test_a_corrupted_certificate_rejects_the_map_naming_its_field(ca):
    """C-core SpiffeBundle.CorruptedCertFails (C-core's own words are
    OpenSSL's "Invalid PEM."; the field named is the same)."""
    doc = spiffe_bundle_map({"example.com": [ca]})
    good = doc["trust_domains"]["example.com"]["keys"][0]["x5c"][0]
    doc["trust_domains"]["example.com"]["keys"][0]["x5c"] = [good[:40] + good[60:]]
    assert 'field:trust_domains["example.com"].keys[0].x5c[0] error:' in _error(doc)


def test_multiple_trust_domains_and_multiple_roots_are_read(ca):
    """C-core SpiffeBundle.MultipleTrustDomainsSuccess, MultipleRootsSuccess;
    grpc-go spiffe_test.go TestKnownSPIFFEBundle."""
    other = CertAuthority("conformance spiffe 2")
    doc = spiffe_bundle_map({"example.com": [ca, other], "test.example.com": [other]})
    bundle_map = parse_bundle_map(json.dumps(doc))
    assert bundle_map.roots("example.com") == (ca.der, other.der)
    assert bundle_map.roots("test.example.com") == (other.der,)
    assert base64.b64decode(doc["trust_domains"]["example.com"]["keys"][0]["x5c"][0]) == ca.der


def test_a_fractional_spiffe_sequence_is_ignored_as_c_core(ca):
    """grpc-go spiffe_test.go rejects spiffebundle_wrong_seq_type.json
    (``spiffe_sequence: 12035488.5``); C-core's loader does not read
    ``spiffe_sequence`` (A87 names only ``keys``), and pyxds does as C-core."""
    doc = _bundle(ca)
    doc["trust_domains"]["example.com"]["spiffe_sequence"] = 12035488.5
    assert parse_bundle_map(json.dumps(doc)).roots("example.com") == (ca.der,)


@pytest.mark.parametrize(
    ("peer", "reason"),
    [
        (cert(uri=["spiffe://a/x", "spiffe://a/y"]), "more than one SAN URI found"),
        (cert(dns=["a.example"]), "no SPIFFE ID found in leaf certificate"),
        (cert(uri=["non-spiffe.bad"]), "SPIFFE ID must start with spiffe://"),
        (None, "no SPIFFE ID found in leaf certificate"),
    ],
    ids=["two URIs", "no URI", "not a SPIFFE ID", "no certificate"],
)
def test_the_peers_spiffe_id_is_its_single_uri_san(peer, reason):
    """grpc-go spiffe_test.go TestIDFromCert / TestGetRootsFromSPIFFEBundleMap
    (multiple URIs, no URIs, invalid SPIFFE ID, nil cert)."""
    with pytest.raises(ValueError, match=re.escape(reason)):
        peer_spiffe_id(peer)


def test_roots_are_chosen_by_the_peers_trust_domain():
    """grpc-java XdsX509TrustManagerTest checkServerTrustedSslEngineSpiffeTrustMap,
    ..._missing_trust_domain, ..._missing_spiffe_id; grpc-go
    TestGetRootsFromSPIFFEBundleMap "no bundle for peer cert spiffeID"."""
    from pyxds.security.spiffe import SpiffeBundleMap

    chosen: list[str] = []
    contexts = {"example.com": object()}

    def domain_context(domain):
        chosen.append(domain)
        try:
            return contexts[domain]
        except KeyError:
            raise KeyError(f"No spiffe bundle found for trust domain {domain}") from None

    tls = UpstreamTlsConfig(ca=ProviderRef("mesh"))
    spiffe = SpiffeBundleMap({"example.com": ()})
    peer = cert(uri=["spiffe://example.com/workload"])
    assert check_peer(tls, None, spiffe, domain_context, "h2", peer) is contexts["example.com"]
    assert chosen == ["example.com"]
    failed = check_peer(
        tls, None, spiffe, domain_context, "h2", cert(uri=["spiffe://unknown.com/w"])
    )
    assert (
        failed == "SPIFFE verification failed: No spiffe bundle found for trust domain unknown.com"
    )
    failed = check_peer(tls, None, spiffe, domain_context, "h2", cert(dns=["example.com"]))
    assert failed is not None and failed.startswith("SPIFFE verification failed")


# ------------------------------------------------------------------ A101 SNI


def _peer_check(tls, sni, peer):
    return check_peer(tls, sni, None, lambda d: None, "h2", peer)


def test_sni_found_only_in_a_uri_san_does_not_validate():
    """grpc-go handshake_info_test.go TestAutoHostSNI_DNS_SANValidation_Failures:
    SAN validation against the SNI uses DNS SANs only."""
    tls = UpstreamTlsConfig(ca=ProviderRef("mesh"), auto_sni_san_validation=True)
    peer = cert(dns=["unrelated.example.com"], uri=["http://wrong.sni.domain"])
    assert _peer_check(tls, "wrong.sni.domain", peer) == SNI_MISMATCH


def test_san_validation_without_an_sni_falls_back_to_the_san_matchers():
    """A101: "If auto_sni_san_validation is true but no SNI was sent, then
    validation will use any SAN matchers specified in the validation context
    instead."  grpc-go test/xds/xds_client_sni_test.go
    TestClientSideXDS_FallbackSANMatchers.  C-core 1.85 refuses every peer
    here (differences-from-c-core.md)."""
    tls = UpstreamTlsConfig(
        ca=ProviderRef("mesh"),
        auto_sni_san_validation=True,
        san_matchers=matchers(ex("server.example")),
    )
    assert _peer_check(tls, None, cert(dns=["server.example"])) is None
    assert _peer_check(tls, "", cert(dns=["server.example"])) is None
    assert _peer_check(tls, None, cert(dns=["other.example"])) == SAN_MISMATCH
    no_matchers = UpstreamTlsConfig(ca=ProviderRef("mesh"), auto_sni_san_validation=True)
    assert _peer_check(no_matchers, None, cert(dns=["anything.example"])) is None
    # with an SNI, the SNI replaces the matchers
    assert _peer_check(tls, "other.example", cert(dns=["other.example"])) is None
    assert _peer_check(tls, "third.example", cert(dns=["server.example"])) == SNI_MISMATCH


# ------------------------------------------------------------------ A29 UpstreamTlsContext


def _parse(ctx: tls_pb2.UpstreamTlsContext, providers=PROVIDERS):
    errs = Errors()
    return parse_upstream_tls_context(ctx.SerializeToString(), errs, providers), errs.text()


def test_match_subject_alt_names_are_parsed_kind_value_and_case():
    """C-core xds_common_types_test.cc CommonTlsConfigTest.MatchSubjectAltNames,
    MatchSubjectAltNamesCaseInsensitive."""
    got = matchers(
        ex("exact"),
        {"prefix": "prefix"},
        {"suffix": "suffix"},
        {"contains": "contains"},
        {"safe_regex": "regex"},
    )
    assert [(m.kind, m.value, m.ignore_case) for m in got] == [
        ("exact", "exact", False),
        ("prefix", "prefix", False),
        ("suffix", "suffix", False),
        ("contains", "contains", False),
        ("safe_regex", "regex", False),
    ]
    got = matchers(
        {"exact": "exact", "ignore_case": True},
        {"prefix": "prefix", "ignore_case": True},
        {"suffix": "suffix", "ignore_case": True},
        {"contains": "contains", "ignore_case": True},
    )
    assert [m.ignore_case for m in got] == [True] * 4


def test_invalid_san_matchers_are_all_named():
    """C-core CommonTlsConfigTest.MatchSubjectAltNamesInvalid: a regex with
    ignore_case and a matcher without a pattern, both reported."""
    ctx = b.upstream_tls_context("mesh")
    vc = ctx.common_tls_context.validation_context
    bad = vc.match_subject_alt_names.add()
    bad.safe_regex.regex = "regex"
    bad.ignore_case = True
    vc.match_subject_alt_names.add()
    config, error = _parse(ctx)
    assert config is None
    assert "validation_context.match_subject_alt_names[0].ignore_case: not supported for regex" in (
        error
    )
    assert "validation_context.match_subject_alt_names[1]: invalid string matcher" in error


def test_every_unsupported_validation_field_is_named():
    """C-core CommonTlsConfigTest.ValidationContextUnsupportedFields; grpc-go
    unmarshal_cds_test.go unsupported-field-* cases."""
    ctx = b.upstream_tls_context("mesh")
    vc = ctx.common_tls_context.validation_context
    vc.verify_certificate_spki.append("foo")
    vc.verify_certificate_hash.append("bar")
    vc.require_signed_certificate_timestamp.value = True
    vc.crl.SetInParent()
    vc.custom_validator_config.SetInParent()
    config, error = _parse(ctx)
    assert config is None
    for name in (
        "crl",
        "custom_validator_config",
        "require_signed_certificate_timestamp",
        "verify_certificate_hash",
        "verify_certificate_spki",
    ):
        assert f"validation_context.{name}: feature unsupported" in error


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c.tls_certificates.add(), "tls_certificates"),
        (
            lambda c: c.tls_certificate_sds_secret_configs.add(),
            "tls_certificate_sds_secret_configs",
        ),
        (lambda c: c.tls_params.SetInParent(), "tls_params"),
        (lambda c: c.custom_handshaker.SetInParent(), "custom_handshaker"),
        (
            lambda c: c.validation_context_sds_secret_config.SetInParent(),
            "validation_context_sds_secret_config",
        ),
    ],
)
def test_unsupported_common_tls_context_fields_are_nacked(mutate, field):
    """C-core CommonTlsConfigTest.TlsCertificatesUnuspported,
    TlsCertificatesSdsConfigUnuspported, TlsParamsUnuspported,
    CustomHandshakerUnuspported, ValidationSdsConfigUnsupported."""
    ctx = b.upstream_tls_context("mesh")
    mutate(ctx.common_tls_context)
    config, error = _parse(ctx)
    assert config is None
    assert f"common_tls_context.{field}: feature unsupported" in error


def test_a_ca_provider_takes_precedence_over_system_root_certs():
    """C-core CommonTlsConfigTest.CaCertProviderTakesPrecedenceOverSystemRootCerts."""
    ctx = b.upstream_tls_context("mesh")
    ctx.common_tls_context.validation_context.system_root_certs.SetInParent()
    config, error = _parse(ctx)
    assert error == ""
    assert config.ca is not None and config.ca.instance_name == "mesh"
    assert not config.system_root_certs


def test_identity_provider_without_a_ca_is_nacked_and_its_name_is_kept():
    """C-core CommonTlsConfigTest.TlsCertProvider (the identity is read) and
    TlsConfigTest.CaCertProviderUnset (a client needs a CA)."""
    ctx = b.upstream_tls_context(None, "mesh")
    config, error = _parse(ctx)
    assert config is None
    assert error.endswith("common_tls_context: no CA certs configured")
    ctx = b.upstream_tls_context("mesh", "mesh")
    ctx.common_tls_context.tls_certificate_provider_instance.certificate_name = "cert_name"
    config, _ = _parse(ctx)
    assert config.identity.instance_name == "mesh"
    assert config.identity.certificate_name == "cert_name"


def test_unknown_provider_instance_is_nacked_in_c_cores_words():
    """C-core TlsConfigTest.UnknownCertificateProviderInstance."""
    ctx = b.upstream_tls_context("fake")
    _, error = _parse(ctx)
    assert error == (
        "transport_socket.typed_config.value["
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext]"
        ".common_tls_context.validation_context.ca_certificate_provider_instance"
        ".instance_name: unrecognized certificate provider instance name: fake"
    )


def _cluster_error(c: cluster_pb2.Cluster) -> str:
    _, resource, error = decode_cluster(c.SerializeToString())
    assert resource is None and error, "expected a NACK"
    return error


def _eds_cluster() -> cluster_pb2.Cluster:
    c = cluster_pb2.Cluster(name="foo", type=cluster_pb2.Cluster.EDS)
    c.eds_cluster_config.eds_config.self.SetInParent()
    return c


def test_unknown_transport_socket_type_is_nacked_in_c_cores_words():
    """C-core TlsConfigTest.UnknownTransportSocketType; grpc-go
    transport-socket-unsupported-typeURL."""
    c = _eds_cluster()
    c.transport_socket.typed_config.Pack(cluster_pb2.Cluster())
    assert (
        "transport_socket.typed_config.value[envoy.config.cluster.v3.Cluster].type_url: "
        "unsupported transport socket type"
    ) in _cluster_error(c)


def test_upstream_tls_context_in_a_typed_struct_is_nacked_in_c_cores_words():
    """C-core TlsConfigTest.UpstreamTlsContextInTypedStruct."""
    c = _eds_cluster()
    ts = typed_struct_pb2.TypedStruct(
        type_url="types.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        value=struct_pb2.Struct(),
    )
    c.transport_socket.typed_config.Pack(ts)
    assert (
        "transport_socket.typed_config.value[xds.type.v3.TypedStruct].value["
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext]: "
        "can't decode UpstreamTlsContext"
    ) in _cluster_error(c)


def test_transport_socket_matches_are_ignored_as_c_core():
    """A29 "CDS for Client Side Security": transport_socket_matches are not
    supported.  grpc-go unmarshal_cds_test.go transport-socket-matches NACKs
    such a cluster; C-core's parser does not read the field, and pyxds does
    as C-core (the cluster is plaintext)."""
    c = _eds_cluster()
    c.transport_socket_matches.add(name="transport-socket-match-1")
    _, resource, error = decode_cluster(c.SerializeToString())
    assert error is None and resource.security is None


def test_a_cluster_transport_socket_name_is_not_checked_as_c_core():
    """grpc-go unmarshal_cds_test.go transport-socket-unsupported-name NACKs
    a cluster whose transport_socket is named "unsupported-foo"; A29 names
    the rule for LDS only, C-core reads only the type on clusters, and
    pyxds does as C-core."""
    c = _eds_cluster()
    c.transport_socket.name = "unsupported-foo"
    c.transport_socket.typed_config.Pack(b.upstream_tls_context("mesh"))
    _, resource, error = decode_cluster(c.SerializeToString())
    assert error is None and resource.security.ca.instance_name == "mesh"


# ------------------------------------------------------------------ A29 DownstreamTlsContext

DOWNSTREAM = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
DEFAULT_TLS = f"default_filter_chain.transport_socket.typed_config.value[{DOWNSTREAM}]"
SERVER_PROVIDERS = {"provider1": {"plugin_name": "file_watcher", "config": {}}}


def _server_listener(tls=None, transport_any=None):
    from pyxds.server import inbound as ib

    chain = ib.filter_chain(tls=tls)
    if transport_any is not None:
        chain.transport_socket.name = "envoy.transport_sockets.tls"
        chain.transport_socket.typed_config.CopyFrom(transport_any)
    return ib.server_listener("foo", "127.0.0.1:443", (), chain)


def _decode_server(lis):
    from pyxds.xds.resources.listener import decode_listener

    _, resource, error = decode_listener(lis.SerializeToString(), SERVER_PROVIDERS)
    return resource, error


def _server_tls(identity="provider1", ca="provider1", require=None):
    from pyxds.server import inbound as ib

    return ib.downstream_tls(identity, ca, require, identity_cert="cert_name", ca_cert="ca_cert")


def test_downstream_tls_contexts_c_core_accepts():
    """C-core xds_listener_resource_type_test.cc TcpListenerTest.DownstreamTlsContext,
    DownstreamTlsContextWithCaCertProviderInstance, ClientCertificateRequired."""
    for ca, require in ((None, None), ("provider1", None), ("provider1", True)):
        resource, error = _decode_server(_server_listener(_server_tls(ca=ca, require=require)))
        assert error is None, error
        tls = resource.tcp_listener.default_filter_chain.tls
        assert tls.identity.instance_name == "provider1"
        assert tls.identity.certificate_name == "cert_name"
        assert (tls.ca.instance_name if tls.ca else None) == ca
        assert tls.require_client_certificate is bool(require)


def test_a_ca_provider_with_system_root_certs_is_accepted_on_a_server():
    """grpc-go filter_chain_test.go "validation context with certificate
    provider and system root certs": the CA provider wins (C-core
    CommonTlsConfigTest.CaCertProviderTakesPrecedenceOverSystemRootCerts)."""
    ctx = _server_tls(ca=None, require=True)
    vc = ctx.common_tls_context.validation_context
    vc.ca_certificate_provider_instance.instance_name = "provider1"
    vc.system_root_certs.SetInParent()
    resource, error = _decode_server(_server_listener(ctx))
    assert error is None, error
    assert resource.tcp_listener.default_filter_chain.tls.ca.instance_name == "provider1"


def _server_error(lis) -> str:
    resource, error = _decode_server(lis)
    assert resource is None and error, "expected a NACK"
    return error


def test_downstream_tls_errors_are_c_cores_word_for_word():
    """C-core TcpListenerTest.UnknownCertificateProviderInstance,
    MatchSubjectAltNames, NoTlsCertificateProvider,
    RequireClientCertWithoutCaCertProvider, UnsupportedFields; grpc-go
    filter_chain_test.go "missing CommonTlsContext", "require_sni-set-to-true",
    "unsupported-ocsp_staple_policy", "no root certificate provider with
    require_client_cert", "no_identity_certificate_provider"."""
    ctx = _server_tls(identity="fake", ca=None)
    assert (
        f"{DEFAULT_TLS}.common_tls_context.tls_certificate_provider_instance.instance_name: "
        "unrecognized certificate provider instance name: fake"
    ) in _server_error(_server_listener(ctx))
    ctx = _server_tls(ca=None)
    ctx.common_tls_context.validation_context.match_subject_alt_names.add(exact="exact")
    assert (
        f"{DEFAULT_TLS}.common_tls_context: match_subject_alt_names not supported on servers"
    ) in _server_error(_server_listener(ctx))
    assert (
        f"{DEFAULT_TLS}: TLS configuration provided but no tls_certificate_provider_instance found"
    ) in _server_error(_server_listener(tls_pb2.DownstreamTlsContext()))
    assert (
        f"{DEFAULT_TLS}.require_client_certificate: client certificate required but no "
        "certificate provider instance specified for validation"
    ) in _server_error(_server_listener(_server_tls(ca=None, require=True)))
    ctx = _server_tls(ca=None)
    ctx.require_sni.value = True
    ctx.ocsp_staple_policy = tls_pb2.DownstreamTlsContext.STRICT_STAPLING
    error = _server_error(_server_listener(ctx))
    assert f"{DEFAULT_TLS}.ocsp_staple_policy: value must be LENIENT_STAPLING" in error
    assert f"{DEFAULT_TLS}.require_sni: field unsupported" in error


def test_downstream_transport_socket_type_errors_are_c_cores():
    """C-core TcpListenerTest.UnknownTransportSocketType,
    UnparseableDownstreamTlsContext, DownstreamTlsContextInTypedStruct;
    grpc-go "unexpected transport socket URL", "badly marshaled transport socket"."""
    from google.protobuf import any_pb2

    from pyxds.server import inbound as ib

    lis_any = any_pb2.Any()
    lis_any.Pack(ib.server_listener("x", "127.0.0.1:1"))
    assert (
        "default_filter_chain.transport_socket.typed_config.value["
        "envoy.config.listener.v3.Listener].type_url: unsupported transport socket type"
    ) in _server_error(_server_listener(transport_any=lis_any))
    bad = any_pb2.Any(type_url=f"type.googleapis.com/{DOWNSTREAM}", value=b"\0")
    assert f"{DEFAULT_TLS}: can't decode DownstreamTlsContext" in _server_error(
        _server_listener(transport_any=bad)
    )
    ts_any = any_pb2.Any()
    ts_any.Pack(typed_struct_pb2.TypedStruct(type_url=f"types.googleapis.com/{DOWNSTREAM}"))
    assert (
        "default_filter_chain.transport_socket.typed_config.value[xds.type.v3.TypedStruct]"
        f".value[{DOWNSTREAM}]: can't decode DownstreamTlsContext"
    ) in _server_error(_server_listener(transport_any=ts_any))
