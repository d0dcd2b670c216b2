"""Many backends in one subprocess: one ``grpc.aio`` server per port on one
event loop (no thread per port), each answering ``/pyxds.test.Echo/Who``
with its own port, so a test can tell which endpoint served an RPC.

``ManyBackends(n)`` starts the process and reads its ports; ``close()``
(or the ``with`` block) stops it.  Run as a script it serves ``argv[1]``
ports until its stdin closes.

``ManyBackends(n, oob=True)``: each server also serves ORCA's
``OpenRcaService`` (pyxds.orca, 0.1 s minimum interval; no per-call
reports), reporting qps 100 and a CPU utilization set by
:meth:`ManyBackends.set_loads` (the even-indexed ports one value, the odd
ones another); :meth:`ManyBackends.oob_streams` counts the streams open
across the process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

WHO = "/pyxds.test.Echo/Who"
_SET_LOADS = "/pyxds.test.Echo/SetLoads"
_OOB_STREAMS = "/pyxds.test.Echo/OobStreams"


class ManyBackends:
    def __init__(self, n: int, oob: bool = False) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(n), *(["--oob"] if oob else [])],
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

    def _control(self, method: str, request: bytes) -> bytes:
        import grpc

        with grpc.insecure_channel(self.addresses[0]) as channel:
            answer: bytes = channel.unary_unary(method)(request, timeout=10)
            return answer

    def set_loads(self, even: float, odd: float) -> None:
        """The CPU utilization the even-indexed and odd-indexed ports report."""
        self._control(_SET_LOADS, f"{even},{odd}".encode())

    def oob_streams(self) -> int:
        """OpenRcaService streams open in the backend process, now."""
        return int(self._control(_OOB_STREAMS, b""))

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


async def _serve(n: int, oob: bool) -> None:
    import grpc

    from pyxds.orca import OrcaService, ServerMetricRecorder

    recorders: list[ServerMetricRecorder] = []
    open_streams = [0]

    class CountingOrca(OrcaService):
        async def stream_core_metrics_async(self, request: Any, context: Any) -> Any:
            open_streams[0] += 1
            try:
                async for report in super().stream_core_metrics_async(request, context):
                    yield report
            finally:
                open_streams[0] -= 1

    async def set_loads(request: bytes, context: Any) -> bytes:
        even, odd = (float(x) for x in request.decode().split(","))
        for i, recorder in enumerate(recorders):
            recorder.set_cpu_utilization(odd if i % 2 else even)
        return b"ok"

    async def oob_streams(request: bytes, context: Any) -> bytes:
        return str(open_streams[0]).encode()

    servers: list[Any] = []
    ports: list[int] = []
    for _ in range(n):
        # no SO_REUSEPORT: port 0 must be a port nobody else listens on
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        box: list[bytes] = []

        async def who(request: bytes, context: Any, box: list[bytes] = box) -> bytes:
            return box[0]

        methods = {"Who": grpc.unary_unary_rpc_method_handler(who)}
        if oob and not servers:
            methods["SetLoads"] = grpc.unary_unary_rpc_method_handler(set_loads)
            methods["OobStreams"] = grpc.unary_unary_rpc_method_handler(oob_streams)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("pyxds.test.Echo", methods),)
        )
        if oob:
            recorder = ServerMetricRecorder()
            recorder.set_cpu_utilization(0.5)
            recorder.set_qps(100.0)
            recorders.append(recorder)
            orca = CountingOrca(recorder, min_report_interval=0.1)
            server.add_generic_rpc_handlers((orca.aio_generic_handler(),))
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
    asyncio.run(_serve(int(sys.argv[1]), "--oob" in sys.argv[2:]))
