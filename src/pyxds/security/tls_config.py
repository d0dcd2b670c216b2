"""The security config of a cluster: an ``UpstreamTlsContext`` validated as
C-core validates it (gRFC A29 "CDS for Client Side Security",
"CommonTlsContext Processing").

Rules (each violation NACKs the Cluster, the field named, in grpcio 1.85
C-core's words, checked against it case by case):

* ``common_tls_context.tls_params`` and ``custom_handshaker``: "feature
  unsupported".
* Identity: ``tls_certificate_provider_instance`` (or the deprecated
  ``tls_certificate_certificate_provider_instance``); ``tls_certificates``
  or ``tls_certificate_sds_secret_configs`` without it: "feature
  unsupported".
* Validation context: ``validation_context`` or
  ``combined_validation_context.default_validation_context`` (the deprecated
  ``validation_context_certificate_provider_instance`` forms name the CA
  provider too); ``validation_context_sds_secret_config``: "feature
  unsupported" (inside ``combined_validation_context`` it is ignored, as
  C-core).  Inside the context ``verify_certificate_spki``,
  ``verify_certificate_hash``, ``require_signed_certificate_timestamp``
  (when true), ``crl``, ``custom_validator_config``: "feature unsupported".
  ``match_subject_alt_names``: StringMatchers ("invalid string matcher"
  without a pattern; safe_regex through RE2, "Invalid regex string specified
  in matcher"; ``ignore_case`` with a regex "not supported for regex
  matcher").
* The CA: ``ca_certificate_provider_instance`` (or ``system_root_certs``,
  A82); none is "no CA certs configured" (reported with any other error).
* Every provider instance name must exist in the bootstrap's
  ``certificate_providers`` (when the decoder knows the bootstrap).
* A101 (unless ``GRPC_EXPERIMENTAL_XDS_SNI`` is set to something other than
  true): ``sni`` (longer than 255 characters: "must be shorter than 255
  characters"), ``auto_host_sni``, ``auto_sni_san_validation``; see
  :func:`server_name` for the SNI a connection sends.
* Ignored: ``allow_renegotiation``, ``max_session_keys``,
  ``alpn_protocols``, ``trusted_ca``, ``watched_directory``,
  ``allow_expired_certificate``, ``trust_chain_verification``.

The result is a frozen :class:`UpstreamTlsConfig` carried inside the
:class:`~pyxds.xds.resources.types.Cluster`, so a cluster and its security
config always change together (A74).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any

from pyxds._values import dataclass
from pyxds.security import experiments

if TYPE_CHECKING:  # the validators load with the xDS client, not with the channel
    from pyxds.xds.resources._common import Errors

if TYPE_CHECKING:
    from re2 import _Regexp  # google-re2's compiled pattern (typings/re2.pyi)

SECURITY_ATTRIBUTE = "xds_security"
"""Subchannel attribute carrying a cluster's :class:`UpstreamTlsConfig`
(set by xds_cluster_impl, read by the channel's subchannel pool)."""

ADDRESS_NAME_ATTRIBUTE = "address_name"
"""Endpoint attribute: the endpoint's host name (C-core's
``GRPC_ARG_ADDRESS_NAME``): EDS ``endpoint.hostname``, or ``host:port`` of a
LOGICAL_DNS cluster; set by the cds policy, read for A101's
``auto_host_sni``."""

MAX_SNI_LENGTH = 255

_UNSUPPORTED = "feature unsupported"  # C-core's words

UPSTREAM_TLS_CONTEXT = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


@dataclass(frozen=True)
class ProviderRef:
    """A certificate provider instance as the cluster names it, resolved
    against the bootstrap: ``plugin_name`` and ``config`` (canonical JSON
    text) are the bootstrap entry (empty when the decoder had no bootstrap)."""

    instance_name: str
    certificate_name: str = ""
    plugin_name: str = ""
    config: str = "{}"


@dataclass(frozen=True)
class SanMatcher:
    """One ``match_subject_alt_names`` StringMatcher (A29 "Server
    Authorization"): ``kind`` is exact, prefix, suffix, contains or
    safe_regex."""

    kind: str
    value: str
    ignore_case: bool = False
    regex: _Regexp | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class UpstreamTlsConfig:
    """A cluster's validated client-side TLS config."""

    ca: ProviderRef | None
    identity: ProviderRef | None = None
    san_matchers: tuple[SanMatcher, ...] = ()
    system_root_certs: bool = False
    sni: str = ""  # A101
    auto_host_sni: bool = False  # A101
    auto_sni_san_validation: bool = False  # A101


def server_name(tls: UpstreamTlsConfig, address_name: str | None) -> str | None:
    """The SNI of a connection to an endpoint (A101, as C-core 1.85):

    1. ``auto_host_sni`` and the endpoint has a host name: that name without
       its port (``host:port``, ``[v6]:port`` or a bare host);
    2. else ``sni`` when not empty;
    3. else none (None).

    An IP address is never sent as SNI (RFC 6066; C-core and Python's ``ssl``
    both leave it out), but it is still the name SAN validation uses.
    """
    if tls.auto_host_sni and address_name:
        return _host_of(address_name)
    return tls.sni or None


def _host_of(name: str) -> str:
    if name.startswith("["):
        end = name.find("]")
        if end > 0:
            return name[1:end]
    if name.count(":") == 1:
        return name.split(":", 1)[0]
    return name


_UNSUPPORTED_VALIDATION = (
    "verify_certificate_spki",
    "verify_certificate_hash",
    "require_signed_certificate_timestamp",
    "crl",
    "custom_validator_config",
)


def parse_upstream_tls_context(
    value: bytes,
    errs: Errors,
    providers: Mapping[str, Any] | None = None,
    path: str = f"transport_socket.typed_config.value[{UPSTREAM_TLS_CONTEXT}]",
) -> UpstreamTlsConfig | None:
    """Validate a serialized ``UpstreamTlsContext``.  ``providers`` is the
    bootstrap's ``certificate_providers`` (None: names are not checked)."""
    from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

    ctx = tls_pb2.UpstreamTlsContext()
    try:
        ctx.ParseFromString(value)
    except Exception:
        errs.add(path, "can't decode UpstreamTlsContext")
        return None
    before = len(errs)
    sni, auto_host_sni, auto_sni_san_validation = "", False, False
    if experiments.sni_enabled():
        sni = ctx.sni
        if len(sni) > MAX_SNI_LENGTH:
            errs.add(f"{path}.sni", "must be shorter than 255 characters")
        auto_host_sni = ctx.auto_host_sni
        auto_sni_san_validation = ctx.auto_sni_san_validation
    p = f"{path}.common_tls_context"
    common = parse_common_tls_context(ctx.common_tls_context, p, providers, errs)
    if not common.ca_named and not common.system_root_certs:
        errs.add(p, "no CA certs configured")
    if len(errs) != before:
        return None
    return UpstreamTlsConfig(
        ca=common.ca,
        identity=common.identity,
        san_matchers=common.san_matchers,
        system_root_certs=common.system_root_certs,
        sni=sni,
        auto_host_sni=auto_host_sni,
        auto_sni_san_validation=auto_sni_san_validation,
    )


@dataclass(frozen=True)
class CommonTls:
    """What a ``CommonTlsContext`` says, validated (shared by the client's
    UpstreamTlsContext and the server's DownstreamTlsContext, as C-core's
    CommonTlsContextParse): ``ca_named`` is True when a CA provider instance
    is named, known to the bootstrap or not."""

    identity: ProviderRef | None
    ca: ProviderRef | None
    ca_named: bool
    system_root_certs: bool
    san_matchers: tuple[SanMatcher, ...]


def parse_common_tls_context(
    common: Any, p: str, providers: Mapping[str, Any] | None, errs: Errors
) -> CommonTls:
    """Validate a ``CommonTlsContext`` message at field path ``p``."""
    if common.HasField("tls_params"):
        errs.add(f"{p}.tls_params", _UNSUPPORTED)
    if common.HasField("custom_handshaker"):
        errs.add(f"{p}.custom_handshaker", _UNSUPPORTED)

    identity = None
    if common.HasField("tls_certificate_provider_instance"):
        inst = common.tls_certificate_provider_instance
        identity = _ref(
            inst.instance_name,
            inst.certificate_name,
            f"{p}.tls_certificate_provider_instance",
            providers,
            errs,
        )
    elif common.HasField("tls_certificate_certificate_provider_instance"):
        inst = common.tls_certificate_certificate_provider_instance
        identity = _ref(
            inst.instance_name,
            inst.certificate_name,
            f"{p}.tls_certificate_certificate_provider_instance",
            providers,
            errs,
        )
    else:
        if len(common.tls_certificates):
            errs.add(f"{p}.tls_certificates", _UNSUPPORTED)
        if len(common.tls_certificate_sds_secret_configs):
            errs.add(f"{p}.tls_certificate_sds_secret_configs", _UNSUPPORTED)

    ca = None
    ca_named = False  # a CA provider instance is named, known or not
    system_roots = False
    matchers: tuple[SanMatcher, ...] = ()
    vc = None
    vpath = ""
    which = common.WhichOneof("validation_context_type")
    if which == "validation_context":
        vc, vpath = common.validation_context, f"{p}.validation_context"
    elif which == "combined_validation_context":
        combined = common.combined_validation_context
        cp = f"{p}.combined_validation_context"
        if combined.HasField("validation_context_certificate_provider_instance"):
            ca_named = True
            inst = combined.validation_context_certificate_provider_instance
            ca = _ref(
                inst.instance_name,
                inst.certificate_name,
                f"{cp}.validation_context_certificate_provider_instance",
                providers,
                errs,
            )
        if combined.HasField("default_validation_context"):
            vc, vpath = combined.default_validation_context, f"{cp}.default_validation_context"
    elif which == "validation_context_sds_secret_config":
        errs.add(f"{p}.validation_context_sds_secret_config", _UNSUPPORTED)
    elif which == "validation_context_certificate_provider_instance":
        ca_named = True
        inst = common.validation_context_certificate_provider_instance
        ca = _ref(
            inst.instance_name,
            inst.certificate_name,
            f"{p}.validation_context_certificate_provider_instance",
            providers,
            errs,
        )

    if vc is not None:
        for name in _UNSUPPORTED_VALIDATION:
            if name.startswith("verify"):
                present = len(getattr(vc, name)) > 0
            elif name == "require_signed_certificate_timestamp":
                present = vc.require_signed_certificate_timestamp.value  # a BoolValue
            else:
                present = vc.HasField(name)
            if present:
                errs.add(f"{vpath}.{name}", _UNSUPPORTED)
        if vc.HasField("ca_certificate_provider_instance"):
            ca_named = True
            inst = vc.ca_certificate_provider_instance
            ca = _ref(
                inst.instance_name,
                inst.certificate_name,
                f"{vpath}.ca_certificate_provider_instance",
                providers,
                errs,
            )
        elif vc.HasField("system_root_certs"):
            system_roots = True
        matchers = tuple(
            m
            for i, sm in enumerate(vc.match_subject_alt_names)
            if (m := _matcher(sm, f"{vpath}.match_subject_alt_names[{i}]", errs)) is not None
        )
    return CommonTls(identity, ca, ca_named, system_roots, matchers)


def _ref(
    instance: str,
    cert_name: str,
    path: str,
    providers: Mapping[str, Any] | None,
    errs: Errors,
) -> ProviderRef | None:
    if providers is None:
        return ProviderRef(instance, cert_name)
    entry = providers.get(instance)
    if entry is None:
        errs.add(
            f"{path}.instance_name", f"unrecognized certificate provider instance name: {instance}"
        )
        return None
    config = entry.get("config") or {}
    if hasattr(config, "to_json"):
        config = config.to_json()
    return ProviderRef(
        instance,
        cert_name,
        str(entry.get("plugin_name", "")),
        json.dumps(config, sort_keys=True, default=str),
    )


def _matcher(sm: Any, path: str, errs: Errors) -> SanMatcher | None:
    kind = sm.WhichOneof("match_pattern")
    ic = sm.ignore_case
    if kind in ("exact", "prefix", "suffix", "contains"):
        return SanMatcher(kind, getattr(sm, kind), ic)
    if kind == "safe_regex":
        if ic:
            errs.add(f"{path}.ignore_case", "not supported for regex matcher")
            return None
        from pyxds.xds.resources._common import Errors, compile_regex

        pattern = sm.safe_regex.regex
        problems = Errors()
        rx = compile_regex(pattern, "", problems)
        if rx is None:
            detail = problems[0].split(": ", 1)[-1] if problems else pattern
            errs.add(path, f"Invalid regex string specified in matcher: {detail}")
            return None
        return SanMatcher("safe_regex", pattern, regex=rx)
    errs.add(path, "invalid string matcher")
    return None
