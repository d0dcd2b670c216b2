"""Many backends in one subprocess: one ``grpc.aio`` server per port on one
event loop (no thread per port), each answering ``/pyxds.test.Echo/Who``
with its own port, so a test can tell which endpoint served an RPC.

``ManyBackends(n)`` starts the process and reads its ports; ``close()``
(or the ``with`` block) stops it.  Run as a script it serves ``argv[1]``
ports until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

WHO = "/pyxds.test.Echo/Who"


class ManyBackends:
    def __init__(self, n: int) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(10)
            raise RuntimeError("many_backends: the backend process did not start")
        self.ports: list[int] = json.loads(line)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def __enter__(self) -> ManyBackends:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _serve(n: int) -> None:
    import grpc

    servers: list[Any] = []
    ports: list[int] = []
    for _ in range(n):
        # no SO_REUSEPORT: port 0 must be a port nobody else listens on
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        box: list[bytes] = []

        async def who(request: bytes, context: Any, box: list[bytes] = box) -> bytes:
            return box[0]

        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "pyxds.test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(who)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        box.append(str(port).encode())
        await server.start()
        servers.append(server)
        ports.append(port)
    print(json.dumps(ports), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    for server in servers:
        await server.stop(None)


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))
