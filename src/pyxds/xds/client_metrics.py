"""The XdsClient's A78 metrics (``grpc.xds_client.*``), recorded through
:mod:`pyxds.metrics` and nothing when metrics are off.

Labels: ``grpc.target`` is the channel target the client serves (A71 scope;
"" for a client made directly), ``grpc.xds.server`` the server URI,
``grpc.xds.resource_type`` the type without ``type.googleapis.com/``,
``grpc.xds.authority`` the ``xdstp://`` authority or ``"#old"``, and
``grpc.xds.cache_state`` one of requested, does_not_exist, acked, nacked,
nacked_but_cached (A78) and A88's timeout, received_error,
does_not_exist_but_cached, received_error_but_cached.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from pyxds import metrics
from pyxds._uri import urlsplit

_TYPE_PREFIX = "type.googleapis.com/"


def _scopes(client: Any) -> tuple[str, ...]:
    scope = getattr(client, "scope", None)
    return (scope,) if scope else ("",)


def _server_uri(channel: Any) -> str:
    return str(getattr(channel.server, "server_uri", ""))


def resource_counts(channel: Any, type_url: str, valid: int, invalid: int) -> None:
    """One response's resources: ``resource_updates_valid`` / ``_invalid``."""
    if metrics.RECORDER is None:
        return
    resource_type = type_url.removeprefix(_TYPE_PREFIX)
    for scope in _scopes(channel._client):
        labels = {
            "grpc.target": scope,
            "grpc.xds.server": _server_uri(channel),
            "grpc.xds.resource_type": resource_type,
        }
        if valid:
            metrics.add("grpc.xds_client.resource_updates_valid", valid, labels)
        if invalid:
            metrics.add("grpc.xds_client.resource_updates_invalid", invalid, labels)


def server_failure(channel: Any) -> None:
    """The server went from healthy to unhealthy (A57 connectivity failure)."""
    if metrics.RECORDER is None:
        return
    for scope in _scopes(channel._client):
        metrics.add(
            "grpc.xds_client.server_failure",
            1,
            {"grpc.target": scope, "grpc.xds.server": _server_uri(channel)},
        )


def _connected() -> Iterator[tuple[float, dict[str, str]]]:
    from pyxds.xds.client import XdsClient

    for client, scopes in XdsClient.instances():
        for channel in list(client._servers.values()):
            for scope in scopes or ("",):
                yield (
                    1 if channel.connected else 0,
                    {"grpc.target": scope, "grpc.xds.server": _server_uri(channel)},
                )


#: A78/A88 ``grpc.xds.cache_state`` of an entry that still holds a resource
_CACHED = {
    "nacked": "nacked_but_cached",  # A78
    "does_not_exist": "does_not_exist_but_cached",  # A88: a deletion ignored
    "received_error": "received_error_but_cached",  # A88: a data error ignored
}


def _cache_state(entry: dict[str, Any]) -> str:
    """A78's cache states with A88's: a NACKED, DOES_NOT_EXIST or
    RECEIVED_ERROR entry that keeps its resource is ``..._but_cached``."""
    status = str(entry.get("client_status", "")).lower()
    if "xds_config" in entry:
        return _CACHED.get(status, status)
    return status


def _authority(name: str) -> str:
    return urlsplit(name).netloc if name.startswith("xdstp:") else "#old"


def _resources() -> Iterator[tuple[float, dict[str, str]]]:
    from pyxds.xds.client import XdsClient

    for client, scopes in XdsClient.instances():
        try:
            entries = client.dump().get("generic_xds_configs", [])
        except Exception:  # closed meanwhile
            continue
        counts = Counter(
            (
                _authority(e.get("name", "")),
                _cache_state(e),
                str(e.get("type_url", "")).removeprefix(_TYPE_PREFIX),
            )
            for e in entries
        )
        for scope in scopes or ("",):
            for (authority, state, resource_type), n in sorted(counts.items()):
                yield (
                    n,
                    {
                        "grpc.target": scope,
                        "grpc.xds.authority": authority,
                        "grpc.xds.cache_state": state,
                        "grpc.xds.resource_type": resource_type,
                    },
                )


metrics.observe("grpc.xds_client.connected", _connected)
metrics.observe("grpc.xds_client.resources", _resources)
