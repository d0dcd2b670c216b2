"""The local address of a connection to a wildcard listening port, from
grpcio's channelz (C-core's own socket table; enabled unless the server's
options set ``grpc.enable_channelz`` to 0).

grpcio shows a servicer the peer address only.  When a Listener's filter
chains or RBAC rules depend on the local IP of a connection to ``0.0.0.0``
or ``[::]``, :func:`local_ip_of` finds the server socket of that peer on
that port and reads its local address.  It costs a few channelz queries,
made once per peer address by the gate's cache, never on the common path.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
from typing import Any

from pyxds.serving.filter_chains import IpAddress, unmapped

__all__ = ["local_ip_of"]

_log = logging.getLogger(__name__)
_PAGE = 100


def _json(text: Any) -> dict[str, Any]:
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def local_ip_of(peer: str, port: int) -> IpAddress | None:
    """The local IP of the server connection from ``peer`` (grpcio's
    ``context.peer()`` text) on listening ``port``; None if not found."""
    try:
        from grpc._cython import cygrpc  # type: ignore[attr-defined]  # private: not in the stubs
    except ImportError:  # pragma: no cover - grpcio always has it
        return None
    suffix = f":{port}"
    try:
        servers = _json(cygrpc.channelz_get_servers(0)).get("server", [])
        for server in servers:
            listens = [s.get("name", "") for s in server.get("listenSocket", [])]
            if not any(name.endswith(suffix) for name in listens):
                continue
            server_id = int(server["ref"]["serverId"])
            start = 0
            while True:
                page = _json(cygrpc.channelz_get_server_sockets(server_id, start, _PAGE))
                refs = page.get("socketRef", [])
                for ref in refs:
                    if ref.get("name", "").endswith(peer):
                        socket = _json(cygrpc.channelz_get_socket(int(ref["socketId"])))
                        local = socket.get("socket", {}).get("local", {}).get("tcpipAddress", {})
                        raw = local.get("ipAddress")
                        if raw:
                            return unmapped(ipaddress.ip_address(base64.b64decode(raw)))
                if page.get("end", True) or not refs:
                    break
                start = int(refs[-1]["socketId"]) + 1
    except Exception as err:  # channelz off or changed: the address stays unknown
        _log.debug("channelz lookup of %s failed: %s", peer, err)
    return None
