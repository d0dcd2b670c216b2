"""A server filter chain's ``DownstreamTlsContext``, validated as C-core
validates it (gRFC A29 "Server Side", ``DownstreamTlsContextParse``).

Rules (each violation NACKs the Listener, in C-core's words):

* ``transport_socket.typed_config`` must be a ``DownstreamTlsContext``
  ("unsupported transport socket type") that parses ("can't decode
  DownstreamTlsContext").
* ``common_tls_context`` is checked as for clients
  (:func:`pyxds.security.tls_config.parse_common_tls_context`: unsupported
  fields, unknown provider instance names), and: ``system_root_certs`` is
  refused ("system_root_certs not supported"), so are
  ``match_subject_alt_names`` ("match_subject_alt_names not supported on
  servers").
* An identity provider instance is required ("TLS configuration provided
  but no tls_certificate_provider_instance found").
* ``require_client_certificate: true`` needs a CA provider instance
  ("client certificate required but no certificate provider instance
  specified for validation").
* ``require_sni: true``: "field unsupported"; ``ocsp_staple_policy`` other
  than ``LENIENT_STAPLING``: "value must be LENIENT_STAPLING".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyxds.security.tls_config import parse_common_tls_context
from pyxds.xds.resources._common import (
    TYPED_STRUCT_TYPES,
    Errors,
    type_name,
    typed_struct_type,
)
from pyxds.xds.resources.server_types import DownstreamTlsConfig

__all__ = ["DOWNSTREAM_TLS_CONTEXT", "parse_downstream_transport_socket"]

DOWNSTREAM_TLS_CONTEXT = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"


def parse_downstream_transport_socket(
    ts: Any, path: str, providers: Mapping[str, Any] | None, errs: Errors
) -> DownstreamTlsConfig | None:
    """Validate a filter chain's ``transport_socket`` (at field ``path``)."""
    from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

    p = f"{path}.typed_config"
    if not ts.HasField("typed_config"):
        errs.add(p, "field not present")
        return None
    tname = type_name(ts.typed_config.type_url)
    p = f"{p}.value[{tname}]"
    in_struct = tname in TYPED_STRUCT_TYPES
    if in_struct:  # named inside; it holds JSON, not the context's bytes
        inner = typed_struct_type(ts.typed_config.value)
        if inner is None:
            errs.add(p, "could not parse")
            return None
        tname = inner
        p = f"{p}.value[{tname}]"
    if tname != DOWNSTREAM_TLS_CONTEXT:
        errs.add(f"{p}.type_url", "unsupported transport socket type")
        return None
    ctx = tls_pb2.DownstreamTlsContext()
    try:
        if in_struct:
            raise ValueError("a TypedStruct")
        ctx.ParseFromString(ts.typed_config.value)
    except Exception:
        errs.add(p, "can't decode DownstreamTlsContext")
        return None
    before = len(errs)
    identity = ca = None
    if ctx.HasField("common_tls_context"):
        cp = f"{p}.common_tls_context"
        common = parse_common_tls_context(ctx.common_tls_context, cp, providers, errs)
        identity, ca = common.identity, common.ca
        if common.system_root_certs:
            errs.add(cp, "system_root_certs not supported")
        if common.san_matchers:
            errs.add(cp, "match_subject_alt_names not supported on servers")
    # An instance named but unknown to the bootstrap is already an error; an
    # empty name is no instance at all (C-core checks the name, not the field).
    if not _identity_named(ctx.common_tls_context):
        errs.add(p, "TLS configuration provided but no tls_certificate_provider_instance found")
    require = False
    if ctx.HasField("require_client_certificate"):
        require = ctx.require_client_certificate.value
        if require and not _ca_named(ctx.common_tls_context):
            errs.add(
                f"{p}.require_client_certificate",
                "client certificate required but no certificate provider instance"
                " specified for validation",
            )
    if ctx.require_sni.value:
        errs.add(f"{p}.require_sni", "field unsupported")
    if ctx.ocsp_staple_policy != tls_pb2.DownstreamTlsContext.LENIENT_STAPLING:
        errs.add(f"{p}.ocsp_staple_policy", "value must be LENIENT_STAPLING")
    if len(errs) != before or identity is None:
        return None
    return DownstreamTlsConfig(
        identity, ca if ca is not None and ca.instance_name else None, require
    )


def _identity_named(common: Any) -> bool:
    for name in (
        "tls_certificate_provider_instance",
        "tls_certificate_certificate_provider_instance",
    ):
        if common.HasField(name) and getattr(common, name).instance_name:
            return True
    return False


def _ca_named(common: Any) -> bool:
    which = common.WhichOneof("validation_context_type")
    if which == "validation_context":
        vc = common.validation_context
        return vc.HasField("ca_certificate_provider_instance") and bool(
            vc.ca_certificate_provider_instance.instance_name
        )
    if which == "combined_validation_context":
        combined = common.combined_validation_context
        if combined.HasField("validation_context_certificate_provider_instance"):
            return bool(combined.validation_context_certificate_provider_instance.instance_name)
        vc = combined.default_validation_context
        return vc.HasField("ca_certificate_provider_instance") and bool(
            vc.ca_certificate_provider_instance.instance_name
        )
    if which == "validation_context_certificate_provider_instance":
        return bool(common.validation_context_certificate_provider_instance.instance_name)
    return False
