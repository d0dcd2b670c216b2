"""grpcio's own channels (C-core) with the application's channel options,
in a subprocess (C-core reads its xDS bootstrap once per process), for the
connection-level differentials (keepalive, idleness, authority, user agent,
message limits): the same options and scenario through a pyxds channel and
through C-core, the same observable outcome asserted.

Also :class:`PeerBackend`: a grpcio server whose replies show what reached
it per RPC (``:authority``, ``user-agent``, the client's port), and which
can send large replies.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from concurrent import futures
from typing import Any

import grpc
from channel_fixtures import CoreXdsClient
from ports import EXCLUSIVE

PEER_SERVICE = "pyxds.test.Peer"
#: unary: replies JSON {"authority", "user_agent", "peer"} of the RPC
WHO_AM_I = f"/{PEER_SERVICE}/WhoAmI"
#: unary: replies int(request) bytes
BIG = f"/{PEER_SERVICE}/Big"
#: unary: sleeps float(request) seconds, replies the peer
SLEEP = f"/{PEER_SERVICE}/Sleep"


class PeerBackend:
    """A grpcio server on 127.0.0.1 serving :data:`WHO_AM_I`, :data:`BIG`
    and :data:`SLEEP`; ``options``: its grpcio server options (A9's
    connection management); :attr:`peers`: the client address of every RPC
    (one per connection used); :attr:`authorities`: the ``:authority`` of
    every :data:`WHO_AM_I`; ``failing``: :data:`WHO_AM_I` fails UNAVAILABLE."""

    def __init__(
        self,
        name: str = "peer",
        options: list[tuple[str, Any]] | None = None,
        credentials: grpc.ServerCredentials | None = None,
        failing: bool = False,
    ) -> None:
        self.name = name
        self.peers: list[str] = []
        self.authorities: list[str] = []

        def who(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.peers.append(context.peer())
            host = context._rpc_event.call_details.host  # type: ignore[attr-defined]
            self.authorities.append((host or b"").decode())
            if failing:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"{name} fails")
            md = dict(context.invocation_metadata())
            return json.dumps(
                {
                    "name": name,
                    "authority": (host or b"").decode(),
                    "user_agent": md.get("user-agent"),
                }
            ).encode()

        def big(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.peers.append(context.peer())
            return b"x" * int(request or b"0")

        def sleep(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.peers.append(context.peer())
            time.sleep(float(request or b"0"))
            return name.encode()

        handler = grpc.method_handlers_generic_handler(
            PEER_SERVICE,
            {
                "WhoAmI": grpc.unary_unary_rpc_method_handler(who),
                "Big": grpc.unary_unary_rpc_method_handler(big),
                "Sleep": grpc.unary_unary_rpc_method_handler(sleep),
            },
        )
        self._executor = futures.ThreadPoolExecutor(8, thread_name_prefix="backend-")
        self.server = grpc.server(self._executor, options=[EXCLUSIVE, *(options or [])])
        self.server.add_generic_rpc_handlers([handler])
        if credentials is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(None).wait(5)
        self._executor.shutdown(wait=False)


def outcome(channel: Any, method: str, request: bytes = b"", timeout: float = 10.0) -> dict:
    """One wait_for_ready unary call: {"ok": reply text} or {"code", "details"},
    with "elapsed" (seconds)."""
    start = time.monotonic()
    try:
        reply = channel.unary_unary(method)(request, timeout=timeout, wait_for_ready=True)
        out: dict = {"ok": base64.b64encode(reply).decode()}
    except grpc.RpcError as err:
        out = {"code": err.code().name, "details": err.details() or ""}
    out["elapsed"] = time.monotonic() - start
    return out


def concurrent_outcomes(
    channel: Any, method: str, request: bytes = b"", n: int = 1, timeout: float = 10.0
) -> list[dict]:
    """``n`` :func:`outcome` calls at once (a thread each), in order."""
    results: list[dict] = [{} for _ in range(n)]

    def one(i: int) -> None:
        results[i] = outcome(channel, method, request, timeout)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 30)
    return results


def load(
    channel: Any, method: str, request: bytes, threads: int, seconds: float, timeout: float
) -> dict[str, int]:
    """``threads`` callers each calling ``method`` (not wait_for_ready) in a
    loop for ``seconds``: how many RPCs ended how ("ok" or "CODE: details")."""
    counts: dict[str, int] = {}
    lock = threading.Lock()
    end = time.monotonic() + seconds
    call = channel.unary_unary(method)

    def caller() -> None:
        while time.monotonic() < end:
            try:
                call(request, timeout=timeout)
                key = "ok"
            except grpc.RpcError as err:
                key = f"{err.code().name}: {err.details()}"
            with lock:
                counts[key] = counts.get(key, 0) + 1

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(seconds + timeout + 30)
    return counts


def decoded(result: dict) -> Any:
    """The reply of a successful :func:`outcome` (JSON when it is), else the result."""
    if "ok" not in result:
        return result
    raw = base64.b64decode(result["ok"])
    try:
        return json.loads(raw)
    except ValueError:
        return raw


_SCRIPT = r"""
import json, sys
import grpc
sys.path.insert(0, sys.argv[1])
from core_channel import concurrent_outcomes, load

channels = {}
states = {}

def track(key, channel):
    def on_state(state):
        states[key] = state.name
    channel.subscribe(on_state)

for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    if op == "open":
        options = [tuple(x) for x in cmd["options"]]
        if cmd.get("ca"):
            creds = grpc.ssl_channel_credentials(root_certificates=cmd["ca"].encode())
            channel = grpc.secure_channel(cmd["target"], creds, options)
        elif cmd.get("xds"):
            import grpc.experimental
            creds = grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials())
            channel = grpc.secure_channel(cmd["target"], creds, options)
        else:
            channel = grpc.insecure_channel(cmd["target"], options)
        channels[cmd["key"]] = channel
        track(cmd["key"], channel)
        answer = "ok"
    elif op == "calls":
        answer = concurrent_outcomes(channels[cmd["key"]], cmd["method"],
                                     cmd.get("request", "").encode(), cmd["n"], cmd["timeout"])
    elif op == "load":
        answer = load(channels[cmd["key"]], cmd["method"], cmd["request"].encode(),
                      cmd["threads"], cmd["seconds"], cmd["timeout"])
    elif op == "state":
        answer = states.get(cmd["key"])
    elif op == "close":
        channels.pop(cmd["key"]).close()
        answer = "ok"
    print(json.dumps(answer), flush=True)
"""


class CoreChannels(CoreXdsClient):
    """grpcio channels in a subprocess, opened with the application's options
    (``GRPC_XDS_BOOTSTRAP_CONFIG`` from ``bootstrap`` for ``xds:`` targets)."""

    def __init__(self, bootstrap: dict, env: dict | None = None) -> None:
        """``env``: extra environment variables of the process."""
        here = os.path.dirname(os.path.abspath(__file__))
        super().__init__(bootstrap, env=env, script=_SCRIPT, args=(here,))

    def open(
        self,
        key: str,
        target: str,
        options: list[tuple[str, Any]],
        ca: bytes | None = None,
        xds: bool = False,
    ) -> None:
        """A channel ``key``: ``grpc.insecure_channel(target, options)``, or
        TLS trusting ``ca``, or with xDS credentials (insecure fallback)."""
        cmd: dict[str, Any] = {"op": "open", "key": key, "target": target, "options": options}
        if ca is not None:
            cmd["ca"] = ca.decode()
        if xds:
            cmd["xds"] = True
        self._ask(cmd, 30)

    def calls(
        self, key: str, method: str, request: bytes = b"", n: int = 1, timeout: float = 10.0
    ) -> list[dict]:
        """``n`` concurrent :func:`outcome` calls on channel ``key``."""
        cmd = {
            "op": "calls",
            "key": key,
            "method": method,
            "request": request.decode(),
            "n": n,
            "timeout": timeout,
        }
        return list(self._ask(cmd, timeout + 30))

    def load(
        self, key: str, method: str, request: bytes, threads: int, seconds: float, timeout: float
    ) -> dict[str, int]:
        """:func:`load` on channel ``key``."""
        cmd = {
            "op": "load",
            "key": key,
            "method": method,
            "request": request.decode(),
            "threads": threads,
            "seconds": seconds,
            "timeout": timeout,
        }
        return dict(self._ask(cmd, seconds + timeout + 60))

    def state(self, key: str) -> str | None:
        """Channel ``key``'s last connectivity state (a subscription's)."""
        answer = self._ask({"op": "state", "key": key}, 30)
        return None if answer is None else str(answer)
