"""A tiny Route Lookup Service (grpc/lookup/v1 ``RouteLookupService``) for tests.

Routes that use RLS (an xDS ``cluster_specifier_plugin`` with a
``RouteLookupClusterSpecifier``, see :func:`pyxds.server.builders.rls_plugin`)
send each RPC's key to this server and go to the target it answers.  The
answers come from a table keyed by the request's key map::

    from pyxds.server import RouteLookupServer

    with RouteLookupServer() as rls:
        rls.set({"user": "alice"}, ["cluster-a"])
        rls.set({"user": "bob"}, ["cluster-b"], header_data="bob-data")
        rls.set_default(["cluster-default"])       # any other key (else NOT_FOUND)
        rls.set({"user": "mallory"}, code=grpc.StatusCode.PERMISSION_DENIED)
        rls.set({"user": "slow"}, ["cluster-a"], delay=2.0)
        config = builders.route_lookup_config(rls.target, [...])

Every request is recorded (``rls.requests``: key map, reason, stale header
data, target type, metadata) so a test can see what the client asked and
why.  An answer can also be bytes that are not a RouteLookupResponse
(``raw=``) or an empty target list, to test clients against a broken server.
The server listens on 127.0.0.1 (a random port unless given), without
``SO_REUSEPORT``: a port that another server holds raises
:class:`~pyxds.server.PortInUseError` instead of being shared with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from concurrent import futures
from dataclasses import field
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.server.server import PortInUseError, _unbindable

__all__ = ["RouteLookupServer", "LookupAnswer", "LookupRecord"]

_SERVICE = "grpc.lookup.v1.RouteLookupService"


@dataclass(frozen=True)
class LookupAnswer:
    """What the server answers for one key map: ``targets`` and
    ``header_data``; or the status ``code`` (with ``details``); or ``raw``
    bytes as the response message.  ``delay`` seconds first."""

    targets: tuple[str, ...] = ()
    header_data: str = ""
    code: grpc.StatusCode | None = None
    details: str = ""
    delay: float = 0.0
    raw: bytes | None = None


@dataclass(frozen=True)
class LookupRecord:
    """One RouteLookup request the server received."""

    key_map: dict[str, str]
    reason: str  # "REASON_MISS", "REASON_STALE", ...
    stale_header_data: str
    target_type: str
    metadata: dict[str, str] = field(default_factory=dict)


def _key(key_map: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(key_map.items()))


class RouteLookupServer:
    """A RouteLookupService on ``host:port`` answering from a table (module doc)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_workers: int = 8) -> None:
        self.host = host
        self.port = port
        self._max_workers = max_workers
        self._lock = threading.Lock()
        self._table: dict[tuple[tuple[str, str], ...], LookupAnswer] = {}
        self._default: LookupAnswer | None = None
        self._requests: list[LookupRecord] = []
        self._server: grpc.Server | None = None

    # -- the table ---------------------------------------------------------------
    def set(
        self,
        key_map: Mapping[str, str],
        targets: Iterable[str] | str = (),
        header_data: str = "",
        *,
        code: grpc.StatusCode | None = None,
        details: str = "",
        delay: float = 0.0,
        raw: bytes | None = None,
    ) -> None:
        """Answer requests whose key map is exactly ``key_map``."""
        answer = self._answer(targets, header_data, code, details, delay, raw)
        with self._lock:
            self._table[_key(key_map)] = answer

    def set_default(
        self,
        targets: Iterable[str] | str = (),
        header_data: str = "",
        *,
        code: grpc.StatusCode | None = None,
        details: str = "",
        delay: float = 0.0,
        raw: bytes | None = None,
    ) -> None:
        """Answer requests whose key map has no entry (without a default:
        NOT_FOUND "no route for key map {...}")."""
        with self._lock:
            self._default = self._answer(targets, header_data, code, details, delay, raw)

    def remove(self, key_map: Mapping[str, str]) -> None:
        with self._lock:
            self._table.pop(_key(key_map), None)

    def clear(self) -> None:
        """Forget every entry, the default and the recorded requests."""
        with self._lock:
            self._table.clear()
            self._default = None
            self._requests.clear()

    @staticmethod
    def _answer(
        targets: Iterable[str] | str,
        header_data: str,
        code: grpc.StatusCode | None,
        details: str,
        delay: float,
        raw: bytes | None,
    ) -> LookupAnswer:
        if isinstance(targets, str):
            targets = (targets,)
        if code is grpc.StatusCode.OK:
            code = None
        return LookupAnswer(tuple(targets), header_data, code, details, max(0.0, delay), raw)

    @property
    def requests(self) -> list[LookupRecord]:
        """Every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, key_map: Mapping[str, str]) -> list[LookupRecord]:
        return [r for r in self.requests if r.key_map == dict(key_map)]

    # -- serving -----------------------------------------------------------------
    @property
    def target(self) -> str:
        """The gRPC target of this server (for ``lookup_service``)."""
        return f"{self.host}:{self.port}"

    def start(self) -> RouteLookupServer:
        if self._server is not None:
            return self
        executor = futures.ThreadPoolExecutor(self._max_workers, "pyxds-rls")
        # without SO_REUSEPORT (grpcio's default is on): a taken port is an
        # error, never a port silently shared with another program's server
        server = grpc.server(executor, options=[("grpc.so_reuseport", 0)])
        handler = grpc.unary_unary_rpc_method_handler(
            self._lookup,
            request_deserializer=_request_type().FromString,
            response_serializer=_serialize,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE, {"RouteLookup": handler}),)
        )
        problem = _unbindable(self.host, self.port)
        port = 0
        if problem is None:
            try:
                port = server.add_insecure_port(f"{self.host}:{self.port}")
            except RuntimeError:  # grpcio >= 1.6x raises where older ones returned 0
                problem = "the address is in use or not available"
        if not port:
            executor.shutdown(wait=False)
            raise PortInUseError(
                f"RouteLookupServer: cannot listen on {self.host}:{self.port}:"
                f" {problem or 'cannot bind'}"
            )
        self.port = port
        server.start()
        self._server = server
        return self

    def stop(self, grace: float | None = None) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(timeout=10)

    def __enter__(self) -> RouteLookupServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _lookup(self, request: Any, context: grpc.ServicerContext) -> Any:
        key_map = dict(request.key_map)
        reason = _request_type().Reason.Name(request.reason)
        metadata: dict[str, str] = {}
        for k, v in context.invocation_metadata() or ():
            metadata[k] = v if isinstance(v, str) else repr(v)
        record = LookupRecord(
            key_map, reason, request.stale_header_data, request.target_type, metadata
        )
        with self._lock:
            self._requests.append(record)
            answer = self._table.get(_key(key_map), self._default)
        if answer is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no route for key map {key_map}")
        assert answer is not None
        if answer.delay:
            deadline = time.monotonic() + answer.delay
            while context.is_active() and time.monotonic() < deadline:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        if answer.code is not None:
            context.abort(answer.code, answer.details)
        if answer.raw is not None:
            return answer.raw
        return _response_type()(targets=list(answer.targets), header_data=answer.header_data)


def _request_type() -> Any:
    from pyxds.protos import rls_pb2

    return rls_pb2.RouteLookupRequest


def _response_type() -> Any:
    from pyxds.protos import rls_pb2

    return rls_pb2.RouteLookupResponse


def _serialize(response: Any) -> bytes:
    if isinstance(response, bytes | bytearray):
        return bytes(response)
    data: bytes = response.SerializeToString()
    return data
