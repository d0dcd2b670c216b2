"""One ADS stream (State of the World, v3) as seen by the management server.

Rules (the xDS protocol's SotW variant, as gRPC clients speak it, A27):

* Each request names one ``type_url`` and carries the client's *whole*
  subscription for that type: its ``resource_names`` replace the previous ones.
* Wildcard: the name ``"*"`` subscribes to every resource of the type. For LDS
  and CDS an empty ``resource_names`` also means wildcard when it is the first
  request of that type on the stream, and stays wildcard while the client keeps
  sending empty lists (legacy wildcard); an empty list after explicit names
  unsubscribes from everything.
* A response holds every subscribed resource that exists (for every type, so
  LDS/CDS responses are complete SotW sets); unknown names are not sent. Each
  response has the type's current version and a fresh nonce. A non-wildcard
  subscription none of whose names exists gets no response until one exists
  (an empty response is sent only to withdraw resources sent before).
* A request with ``response_nonce`` answers that response: ACK without
  ``error_detail``, NACK with it. Both are recorded.
* Stale nonce: once a response of a type was sent on the stream, a request of
  that type whose ``response_nonce`` is not the latest such response's nonce is
  ignored (recorded, never answered, subscription unchanged), as
  go-control-plane does: the client has not seen the newest response yet, and
  its answer to that one carries its whole subscription again.
* The server sends a type again only when what it would send differs from what
  it last sent on this stream: other names, other bytes for one of them, or
  (for a snapshot with an explicit version) another version. A change to a
  resource the stream did not subscribe to sends nothing, and an ACK or NACK of
  the current version gets no response.
* Nothing is sent for a type until a snapshot applies to the node.
* Malformed streams: a first request without ``node`` or a request without
  ``type_url`` ends the stream with INVALID_ARGUMENT (see :meth:`check`); a
  ``type_url`` the server does not serve is recorded and ignored.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable

from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from pyxds._values import dataclass
from pyxds.server.records import AckRecord, NackRecord, RequestRecord
from pyxds.server.snapshot import NodeState
from pyxds.server.types import FIELD_OF_TYPE, WILDCARD, WILDCARD_TYPES

_stream_ids = itertools.count(1)
_MAX_REMEMBERED_NONCES = 64


@dataclass
class _Subscription:
    """One type's subscription on one stream and what was last sent for it."""

    wildcard: bool = False
    legacy_wildcard: bool = False
    names: frozenset[str] = frozenset()
    #: (explicit version or None, ((name, bytes), ...)) of the last response sent.
    sent_key: tuple[str | None, tuple[tuple[str, bytes], ...]] | None = None
    last_nonce: str = ""


class AdsStreamState:
    """The server side of one ADS stream, without I/O.

    ``lookup(node_id)`` returns the NodeState the node is served (or None),
    ``next_nonce()`` a fresh nonce, ``record(r)`` takes Request/Ack/Nack records.
    ``ignore_resource_names`` imitates servers that answer every subscription
    with every resource of the type (A27: clients must ignore the extras).
    """

    def __init__(
        self,
        lookup: Callable[[str | None], NodeState | None],
        next_nonce: Callable[[], str],
        record: Callable[[object], None],
        ignore_resource_names: bool = False,
    ) -> None:
        self.stream_id = next(_stream_ids)
        self.node_id: str | None = None
        self._lookup = lookup
        self._next_nonce = next_nonce
        self._record = record
        self._send_everything = ignore_resource_names
        self._subs: dict[str, _Subscription] = {}
        self._nonces: OrderedDict[str, tuple[str, str]] = OrderedDict()

    # -- events -------------------------------------------------------------

    def identify(self, request: discovery_pb2.DiscoveryRequest) -> str:
        """Take the node id from the stream's first request (later ones may omit the node)."""
        if self.node_id is None:
            self.node_id = request.node.id if request.HasField("node") else ""
        return self.node_id

    def check(self, request: discovery_pb2.DiscoveryRequest) -> str | None:
        """Why ``request`` is malformed (the stream ends with INVALID_ARGUMENT), or None."""
        if self.node_id is None and not request.HasField("node"):
            return "the first DiscoveryRequest of an ADS stream must carry the node"
        if not request.type_url:
            return "DiscoveryRequest.type_url is required on an ADS stream"
        return None

    def on_request(
        self, request: discovery_pb2.DiscoveryRequest
    ) -> list[discovery_pb2.DiscoveryResponse]:
        """Handle a client request; returns the responses to send (0 or 1)."""
        has_node = request.HasField("node")
        self.identify(request)
        type_url = request.type_url
        names = tuple(request.resource_names)
        error = request.error_detail.message if request.HasField("error_detail") else None
        self._record(
            RequestRecord(
                node_id=self.node_id or "",
                type_url=type_url,
                version_info=request.version_info,
                nonce=request.response_nonce,
                resource_names=names,
                error_message=error,
                stream_id=self.stream_id,
                has_node=has_node,
            )
        )
        if request.response_nonce or error is not None:
            self._record_answer(request, names, error)
        if type_url not in FIELD_OF_TYPE:
            return []  # not a type this server serves
        sub = self._subs.get(type_url)
        if sub is not None and sub.last_nonce and request.response_nonce != sub.last_nonce:
            return []  # stale nonce: ignored (module doc)
        first = sub is None
        if sub is None:
            sub = self._subs[type_url] = _Subscription()
        explicit = frozenset(n for n in names if n != WILDCARD)
        if WILDCARD in names:
            sub.wildcard, sub.legacy_wildcard = True, False
        elif not names and type_url in WILDCARD_TYPES and (first or sub.legacy_wildcard):
            sub.wildcard = sub.legacy_wildcard = True
        else:
            sub.wildcard = sub.legacy_wildcard = False
        sub.names = explicit
        response = self._maybe_response(type_url, sub)
        return [response] if response is not None else []

    def on_snapshot_change(self) -> list[discovery_pb2.DiscoveryResponse]:
        """The node's snapshot may have changed; returns the responses to send."""
        out: list[discovery_pb2.DiscoveryResponse] = []
        for type_url, sub in self._subs.items():
            response = self._maybe_response(type_url, sub)
            if response is not None:
                out.append(response)
        return out

    # -- internals ------------------------------------------------------------

    def _record_answer(
        self,
        request: discovery_pb2.DiscoveryRequest,
        names: tuple[str, ...],
        error: str | None,
    ) -> None:
        nonce = request.response_nonce
        known = self._nonces.get(nonce)
        type_url = request.type_url
        if error is None:
            self._record(
                AckRecord(
                    node_id=self.node_id or "",
                    type_url=type_url,
                    version_info=request.version_info,
                    nonce=nonce,
                    resource_names=names,
                    stream_id=self.stream_id,
                )
            )
        else:
            self._record(
                NackRecord(
                    node_id=self.node_id or "",
                    type_url=type_url,
                    version_info=request.version_info,
                    nonce=nonce,
                    error_message=error,
                    resource_names=names,
                    rejected_version=None if known is None else known[1],
                    stream_id=self.stream_id,
                )
            )

    def _maybe_response(
        self, type_url: str, sub: _Subscription
    ) -> discovery_pb2.DiscoveryResponse | None:
        state = self._lookup(self.node_id)
        if state is None:
            return None
        served = state.types[type_url]
        wildcard = sub.wildcard or self._send_everything
        if wildcard:
            send = tuple(served.resources)
        else:
            send = tuple(n for n in served.resources if n in sub.names)
        if not send and not wildcard and (sub.sent_key is None or not sub.sent_key[1]):
            return None  # nothing subscribed exists and nothing is to be withdrawn
        items = tuple((n, served.resources[n]) for n in send)
        key = (served.version if served.explicit else None, items)
        if key == sub.sent_key:
            return None
        nonce = self._next_nonce()
        response = discovery_pb2.DiscoveryResponse(
            version_info=served.version,
            type_url=type_url,
            nonce=nonce,
            resources=[any_pb2.Any(type_url=type_url, value=served.resources[n]) for n in send],
        )
        sub.sent_key = key
        sub.last_nonce = nonce
        self._nonces[nonce] = (type_url, served.version)
        while len(self._nonces) > _MAX_REMEMBERED_NONCES:
            self._nonces.popitem(last=False)
        return response
