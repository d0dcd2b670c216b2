"""xDS client security, sans-IO parts (gRFC A29): UpstreamTlsContext
validation as C-core, SAN matching, the file_watcher provider on an injected
clock, xDS credentials detection, and the security config reaching the
subchannels through xds_cluster_impl."""

from __future__ import annotations

import grpc
import grpc.experimental
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from test_cds_support import attributes, build, eds_cluster, eds_entry, loc, locality, xds_config
from test_xds_cluster_impl import endpoints_of, impl_json, unique

from pyxds.lb import ResolverUpdate
from pyxds.security import san
from pyxds.security.credentials import xds_channel_credentials, xds_info
from pyxds.security.providers import FileWatcherProvider
from pyxds.security.tls_config import (
    SECURITY_ATTRIBUTE,
    ProviderRef,
    SanMatcher,
    UpstreamTlsConfig,
    parse_upstream_tls_context,
)
from pyxds.server import builders as b
from pyxds.testing import FakeHelper
from pyxds.xds.resources._common import Errors
from pyxds.xds.resources.cluster import decode_cluster

PROVIDERS = {"mesh": {"plugin_name": "file_watcher", "config": {"ca_certificate_file": "/ca"}}}


def parse(ctx: tls_pb2.UpstreamTlsContext, providers=PROVIDERS):
    errs = Errors()
    return parse_upstream_tls_context(ctx.SerializeToString(), errs, providers), errs.text()


def ctx_with(**matchers) -> tls_pb2.UpstreamTlsContext:
    return b.upstream_tls_context("mesh", "mesh", [matchers] if matchers else [])


# ------------------------------------------------------------------ validation


def test_valid_context_resolves_the_provider_instances_from_the_bootstrap():
    config, error = parse(ctx_with(exact="spiffe://a"))
    assert error == ""
    assert config.ca.instance_name == "mesh" and config.ca.plugin_name == "file_watcher"
    assert config.identity.instance_name == "mesh"
    assert config.san_matchers == (SanMatcher("exact", "spiffe://a"),)
    assert parse(ctx_with(exact="spiffe://a")) == (config, "")  # structural equality


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c.common_tls_context.tls_params.SetInParent(), "common_tls_context.tls_params"),
        (
            lambda c: c.common_tls_context.custom_handshaker.SetInParent(),
            "common_tls_context.custom_handshaker",
        ),
        (
            lambda c: c.common_tls_context.validation_context.verify_certificate_spki.append("x"),
            "validation_context.verify_certificate_spki",
        ),
        (
            lambda c: c.common_tls_context.validation_context.verify_certificate_hash.append("x"),
            "validation_context.verify_certificate_hash",
        ),
        (
            lambda c: setattr(
                c.common_tls_context.validation_context.require_signed_certificate_timestamp,
                "value",
                True,
            ),
            "validation_context.require_signed_certificate_timestamp",
        ),
        (
            lambda c: c.common_tls_context.validation_context.crl.SetInParent(),
            "validation_context.crl",
        ),
        (
            lambda c: c.common_tls_context.validation_context.custom_validator_config.SetInParent(),
            "validation_context.custom_validator_config",
        ),
    ],
)
def test_fields_whose_absence_would_weaken_security_are_nacked(mutate, field):
    ctx = ctx_with()
    mutate(ctx)
    config, error = parse(ctx)
    assert config is None
    assert f"{field}: feature unsupported" in error


def test_identity_other_than_a_provider_instance_is_nacked():
    ctx = b.upstream_tls_context("mesh")
    ctx.common_tls_context.tls_certificates.add()
    assert "common_tls_context.tls_certificates: feature unsupported" in parse(ctx)[1]
    ctx = b.upstream_tls_context("mesh")
    ctx.common_tls_context.tls_certificate_sds_secret_configs.add()
    assert "tls_certificate_sds_secret_configs: feature unsupported" in parse(ctx)[1]


def test_missing_ca_is_nacked():
    config, error = parse(b.upstream_tls_context(None, "mesh"))
    assert config is None
    assert "common_tls_context: no CA certs configured" in error
    ctx = tls_pb2.UpstreamTlsContext()
    ctx.common_tls_context.validation_context_sds_secret_config.SetInParent()
    error = parse(ctx)[1]
    assert "common_tls_context: no CA certs configured" in error  # beside other errors
    assert "common_tls_context.validation_context_sds_secret_config: feature unsupported" in error


def test_false_signed_certificate_timestamp_requirement_is_accepted():
    """C-core NACKs require_signed_certificate_timestamp only when true."""
    ctx = ctx_with()
    ctx.common_tls_context.validation_context.require_signed_certificate_timestamp.SetInParent()
    assert parse(ctx)[1] == ""


def test_unknown_instance_name_is_nacked_naming_the_field():
    config, error = parse(b.upstream_tls_context("mesh", "nowhere"))
    assert config is None
    assert (
        "common_tls_context.tls_certificate_provider_instance.instance_name: unrecognized "
        "certificate provider instance name: nowhere" in error
    )
    assert "ca_certificate_provider_instance" in parse(b.upstream_tls_context("x"))[1]


def test_regex_with_ignore_case_and_bad_regex_are_nacked():
    assert (
        "ignore_case: not supported for regex matcher"
        in (parse(ctx_with(safe_regex="a.*", ignore_case=True))[1])
    )
    assert (
        "match_subject_alt_names[0]: Invalid regex string specified in matcher: missing ): a("
        in parse(ctx_with(safe_regex="a("))[1]
    )
    ctx = ctx_with()
    ctx.common_tls_context.validation_context.match_subject_alt_names.add()
    assert "match_subject_alt_names[0]: invalid string matcher" in parse(ctx)[1]


def test_ignored_fields_do_not_change_the_config():
    ctx = ctx_with(exact="x")
    ctx.allow_renegotiation = True
    ctx.max_session_keys.value = 3
    ctx.common_tls_context.alpn_protocols.append("h2")
    assert parse(ctx)[0] == parse(ctx_with(exact="x"))[0]


def test_combined_validation_context_is_read():
    ctx = tls_pb2.UpstreamTlsContext()
    combined = ctx.common_tls_context.combined_validation_context
    combined.default_validation_context.ca_certificate_provider_instance.instance_name = "mesh"
    combined.default_validation_context.match_subject_alt_names.add(prefix="spiffe://")
    config, error = parse(ctx)
    assert error == "" and config.ca.instance_name == "mesh" and config.identity is None
    combined.validation_context_sds_secret_config.SetInParent()
    assert parse(ctx) == (config, "")  # ignored there, as C-core


def test_cds_carries_the_security_config_and_nacks_unknown_instances():
    c = b.cluster("c", upstream_tls=ctx_with(exact="x"))
    data = c.SerializeToString()
    _, cluster, error = decode_cluster(data, PROVIDERS)
    assert error is None and cluster.security.san_matchers == (SanMatcher("exact", "x"),)
    _, cluster, error = decode_cluster(data, {})
    assert cluster is None and "unrecognized certificate provider instance name: mesh" in error
    plain = cluster_pb2.Cluster.FromString(b.cluster("p").SerializeToString())
    assert decode_cluster(plain.SerializeToString(), {})[1].security is None


# ------------------------------------------------------------------ SAN matching


def peer(*sans):
    return {"subjectAltName": sans}


@pytest.mark.parametrize(
    ("matcher", "sans", "ok"),
    [
        (SanMatcher("exact", "a.example.com"), (("DNS", "A.Example.COM"),), True),
        (SanMatcher("exact", "a.example.com"), (("DNS", "*.example.com"),), True),
        (SanMatcher("exact", "a.b.example.com"), (("DNS", "*.example.com"),), False),
        (SanMatcher("exact", "example.com"), (("DNS", "*.example.com"),), False),
        (SanMatcher("exact", "a.example.com."), (("DNS", "a.example.com"),), True),
        (SanMatcher("exact", "spiffe://a/b"), (("URI", "spiffe://a/b"),), True),
        (SanMatcher("exact", "SPIFFE://a/b"), (("URI", "spiffe://a/b"),), False),
        (SanMatcher("exact", "SPIFFE://a/b", True), (("URI", "spiffe://a/b"),), True),
        (SanMatcher("prefix", "spiffe://"), (("URI", "spiffe://a"),), True),
        (SanMatcher("suffix", "@example.com"), (("email", "x@example.com"),), True),
        (SanMatcher("contains", "/ns/"), (("URI", "spiffe://t/ns/x"),), True),
        (SanMatcher("exact", "2001:db8::1"), (("IP Address", "2001:DB8:0:0:0:0:0:1\n"),), True),
        (SanMatcher("exact", "10.0.0.1"), (("IP Address", "10.0.0.1"),), True),
        (SanMatcher("exact", ""), (("DNS", ""),), False),
        (SanMatcher("prefix", "x"), (("DirName", "x"),), False),
        (SanMatcher("prefix", "x"), (), False),
    ],
)
def test_san_matching_follows_a29(matcher, sans, ok):
    assert san.check([matcher], peer(*sans)) is ok


def test_san_regex_is_a_full_re2_match():
    import re2

    m = SanMatcher("safe_regex", "spiffe://t/.*", regex=re2.compile("spiffe://t/.*"))
    assert san.check([m], peer(("URI", "spiffe://t/x")))
    assert not san.check([m], peer(("URI", "xspiffe://t/x")))


def test_no_matchers_always_pass_and_no_certificate_fails():
    assert san.check([], None)
    assert not san.check([SanMatcher("prefix", "")], None)
    assert san.check([SanMatcher("exact", "nope"), SanMatcher("prefix", "a")], peer(("DNS", "ab")))


# ------------------------------------------------------------------ file_watcher


def test_file_watcher_rereads_only_after_the_refresh_interval(tmp_path):
    now = [0.0]
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"ONE")
    provider = FileWatcherProvider(
        {"ca_certificate_file": str(ca), "refresh_interval": "10s"}, clock=lambda: now[0]
    )
    first = provider.certificates()
    assert first.ca_pem == b"ONE" and first.ca_error is None
    ca.write_bytes(b"TWO")
    now[0] = 9.9
    assert provider.certificates() is first
    now[0] = 10.0
    second = provider.certificates()
    assert second.ca_pem == b"TWO" and second.version != first.version
    now[0] = 20.0
    assert provider.certificates() is second  # unchanged content: same snapshot


def test_file_watcher_read_error_names_the_file_and_reason(tmp_path):
    missing = tmp_path / "nope.pem"
    provider = FileWatcherProvider(
        {
            "ca_certificate_file": str(missing),
            "certificate_file": str(missing),
            "private_key_file": str(missing),
        }
    )
    certs = provider.certificates()
    assert certs.ca_pem is None
    assert certs.ca_error == f"ca_certificate_file {missing}: No such file or directory"
    assert certs.identity_error.startswith(f"certificate_file {missing}:")


def test_provider_instances_are_shared_per_plugin_and_config():
    from pyxds.security.providers import CertificateError, get_provider

    a = get_provider("file_watcher", '{"ca_certificate_file": "/shared-a"}')
    assert get_provider("file_watcher", '{"ca_certificate_file": "/shared-a"}') is a
    assert get_provider("file_watcher", '{"ca_certificate_file": "/shared-b"}') is not a
    with pytest.raises(CertificateError, match="unknown certificate provider plugin"):
        get_provider("fancy", "{}")


def test_file_watcher_default_interval_is_c_cores_ten_minutes():
    assert FileWatcherProvider({"ca_certificate_file": "/x"}).refresh_interval == 600.0


# ------------------------------------------------------------------ credentials


def test_grpcio_xds_credentials_are_recognised_with_their_fallback():
    insecure = grpc.experimental.insecure_channel_credentials()
    assert xds_info(grpc.xds_channel_credentials(insecure)).fallback is None
    ssl_fallback = xds_info(grpc.xds_channel_credentials(grpc.ssl_channel_credentials()))
    assert isinstance(ssl_fallback.fallback, grpc.ChannelCredentials)
    assert type(ssl_fallback.fallback._credentials).__name__ == "SSLChannelCredentials"
    assert xds_info(grpc.ssl_channel_credentials()) is None
    assert xds_info(None) is None


def test_pyxds_spelling_is_grpcios_object_with_the_fallback_kept():
    fallback = grpc.ssl_channel_credentials()
    creds = xds_channel_credentials(fallback)
    assert type(creds._credentials).__name__ == "XDSChannelCredentials"
    assert xds_info(creds).fallback is fallback
    insecure = xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    assert xds_info(insecure).fallback is None


# ------------------------------------------------------------------ through the LB tree

TLS_A = UpstreamTlsConfig(ca=ProviderRef("mesh", "", "file_watcher", "{}"))
TLS_B = UpstreamTlsConfig(ca=ProviderRef("mesh", "", "file_watcher", "{}"), identity=TLS_A.ca)


def run_impl(helper, policy, config, name, security):
    cluster = eds_cluster(name, security=security)
    lo = locality(loc("a"), ["10.0.0.1:80"])
    xds = xds_config({name: eds_entry(cluster, [lo])})
    assert policy.update(ResolverUpdate(endpoints_of(lo), config, attributes(xds))) is None


def test_cluster_security_reaches_every_subchannel_and_a_change_makes_new_ones():
    name = unique("sec")
    helper = FakeHelper()
    _, policy, config = build(impl_json(name), helper)
    run_impl(helper, policy, config, name, None)
    (plain,) = helper.subchannels
    assert SECURITY_ATTRIBUTE not in plain.attributes
    run_impl(helper, policy, config, name, TLS_A)
    assert plain.shut_down
    live = [s for s in helper.subchannels if not s.shut_down]
    assert [s.attributes[SECURITY_ATTRIBUTE] for s in live] == [TLS_A]
    before = list(helper.subchannels)
    run_impl(helper, policy, config, name, TLS_A)  # same config: a no-op
    assert helper.subchannels == before and not any(s.shut_down for s in live)
    run_impl(helper, policy, config, name, TLS_B)
    live = [s for s in helper.subchannels if not s.shut_down]
    assert [s.attributes[SECURITY_ATTRIBUTE] for s in live] == [TLS_B]


# ------------------------------------------------------------------ the channel's pool


class FakeRelay:
    made: list[FakeRelay] = []

    def __init__(self, backend, tls, sni=None):
        self.backend, self.tls, self.sni = backend, tls, sni
        self.last_error = None
        self.closed = False
        FakeRelay.made.append(self)

    @property
    def address(self):
        return f"unix:/relay/{len(FakeRelay.made)}"

    def close(self):
        self.closed = True

    def info(self):
        return {}


def make_pool(monkeypatch, credentials):
    import random

    from test_channel_support import TransportFactory

    from pyxds.channel.subchannel_pool import SubchannelPool
    from pyxds.security import relay
    from pyxds.serializer import WorkSerializer
    from pyxds.testing import FakeClock

    FakeRelay.made = []
    monkeypatch.setattr(relay, "TlsRelay", FakeRelay)
    transports = TransportFactory()
    pool = SubchannelPool(
        transports, WorkSerializer(), FakeClock(), random.Random(1), credentials=credentials
    )
    return pool, transports


def test_pool_keys_subchannels_by_address_and_security_config(monkeypatch):
    creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    pool, transports = make_pool(monkeypatch, creds)
    a = pool.create("10.0.0.1:80", {SECURITY_ATTRIBUTE: TLS_A})
    a2 = pool.create("10.0.0.1:80", {SECURITY_ATTRIBUTE: TLS_A})
    b_ = pool.create("10.0.0.1:80", {SECURITY_ATTRIBUTE: TLS_B})
    plain = pool.create("10.0.0.1:80", {})
    assert a.core is a2.core
    assert len({a.core, b_.core, plain.core}) == 3
    a.connect()
    plain.connect()
    # The TLS subchannel's grpcio channel goes to its relay, in plaintext.
    (relay_a, _) = FakeRelay.made
    assert [(t.address, t.credentials) for t in transports.made] == [
        (relay_a.address, None),
        ("10.0.0.1:80", None),  # insecure fallback
    ]
    a.shutdown()
    assert not relay_a.closed
    a2.shutdown()
    assert relay_a.closed


def test_relay_failure_reason_is_the_subchannel_status(monkeypatch):
    creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
    pool, transports = make_pool(monkeypatch, creds)
    sub = pool.create("10.0.0.1:80", {SECURITY_ATTRIBUTE: TLS_A})
    seen = []
    sub.watch_state(lambda state, status: seen.append(status))
    sub.connect()
    FakeRelay.made[0].last_error = "SANs from certificate did not match SANs from xDS control plane"
    transports.made[0].report(grpc.ChannelConnectivity.TRANSIENT_FAILURE)
    assert seen[-1].details == (
        "failed to connect to 10.0.0.1:80: SANs from certificate did not match SANs from xDS "
        "control plane"
    )


def test_security_config_is_ignored_without_xds_credentials(monkeypatch):
    fallback = grpc.ssl_channel_credentials()
    pool, transports = make_pool(monkeypatch, fallback)
    sub = pool.create("10.0.0.1:80", {SECURITY_ATTRIBUTE: TLS_A})
    sub.connect()
    assert FakeRelay.made == []
    assert transports.made[0].credentials is fallback


def test_file_watcher_interval_is_whole_seconds_at_least_one_as_c_core():
    def interval(text):
        return FileWatcherProvider(
            {"ca_certificate_file": "/x", "refresh_interval": text}
        ).refresh_interval

    assert interval("0.2s") == 1.0
    assert interval("2.7s") == 2.0
    assert interval("60s") == 60.0


def test_identity_read_while_files_change_is_retried(tmp_path, monkeypatch):
    from pyxds.security import providers

    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_bytes(b"CERT")
    key.write_bytes(b"KEY")
    stamps = iter([(1, 1), (2, 1), (2, 1), (2, 1)])  # changed during the first read
    monkeypatch.setattr(providers, "_mtimes", lambda *paths: next(stamps))
    provider = FileWatcherProvider({"certificate_file": str(cert), "private_key_file": str(key)})
    certs = provider.certificates()
    assert (certs.cert_pem, certs.key_pem, certs.identity_error) == (b"CERT", b"KEY", None)
