"""grpcio 1.85 strands the watch of a cancelled ``wait_for_state_change``
when its channel, closed, was the process's last ``grpc.aio`` channel
(docs/traps.md): grpcio keeps one ``CallbackWrapper`` (and C-core its
watch) per such wait for the life of the process.  A ``pyxds.aio`` channel
to a plain target has no other ``grpc.aio`` channel (no xDS stream), and
retires one subchannel transport per failed connection attempt: its watch
must end by the channel's close, not by a cancel.

Both run in a fresh process (in pytest's, another test's ``grpc.aio``
channel may still be alive), against a closed port."""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = r"""
import asyncio, gc, json, socket
import grpc
import pyxds.aio

def wrappers():
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "CallbackWrapper")

def refusing():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"ipv4:127.0.0.1:{port}"

async def plain_grpcio():
    # a wait cancelled, then its channel closed and let go: the last one
    channel = grpc.aio.insecure_channel(refusing())
    state = channel.get_state(try_to_connect=True)
    for _ in range(250):  # 5 s at most
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            break
        await channel.wait_for_state_change(state)
        state = channel.get_state()
    wait = asyncio.ensure_future(channel.wait_for_state_change(state))  # on TF: pending
    await asyncio.sleep(0.05)
    wait.cancel()
    await channel.close()
    del channel, wait
    await asyncio.sleep(0.2)
    return wrappers()

async def pyxds_attempts():
    before = wrappers()
    options = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.max_reconnect_backoff_ms", 40)]
    channel = pyxds.aio.insecure_channel(refusing(), options=options)
    call = channel.unary_unary("/t.S/M")
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.6  # ~10 attempts, one transport retired each
    while loop.time() < end:
        try:
            await call(b"", timeout=0.1, wait_for_ready=True)
        except grpc.RpcError:
            pass
    await channel.close()
    await asyncio.sleep(0.2)
    return wrappers() - before

print(json.dumps({"grpcio": asyncio.run(plain_grpcio()), "pyxds": asyncio.run(pyxds_attempts())}))
"""


def test_a_pyxds_aio_channel_to_a_refusing_address_strands_no_grpcio_watch():
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["grpcio"] == 1, "grpcio (1.85) strands a cancelled watch of its last channel"
    assert got["pyxds"] == 0, got
