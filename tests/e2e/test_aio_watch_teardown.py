"""grpcio 1.85 strands the watch of a cancelled ``wait_for_state_change``
when its channel, closed, was the process's last ``grpc.aio`` channel
(docs/traps.md): grpcio keeps one ``CallbackWrapper`` (and C-core its
watch) per such wait for the life of the process.  A ``pyxds.aio`` channel
to a plain target has no other ``grpc.aio`` channel (no xDS stream), and
retires one subchannel transport per failed connection attempt: its watch
must end by the channel's close, not by a cancel.

The same channel must also hold grpcio's asyncio engine while it is open
(pyxds.channel.aio_engine): with no ``grpc.aio`` channel alive between two
attempts, grpcio shut its engine down (its poller thread joined) and the
next attempt built it again, once per failed attempt.

All run in a fresh process (in pytest's, another test's ``grpc.aio``
channel may still be alive), against a closed port, or against backends
the process serves itself."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

_SCRIPT = r"""
import asyncio, gc, json, socket, threading, time
import grpc
import pyxds.aio
from pyxds.testing.aio_counts import count_attempts, count_engines, stranded_watches as wrappers

pollers = count_engines()  # grpcio's poller threads started (one per engine built)
attempts = count_attempts()  # the pyxds.aio channel's connection attempts

def pollers_alive():
    return sum(1 for t in pollers if t.is_alive())

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
    pollers.clear()
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
    started = len(pollers)
    await channel.close()
    await asyncio.sleep(0.2)
    for _ in range(250):  # the engine let go once the channel closed: 5 s at most
        gc.collect()
        if not pollers_alive():
            break
        await asyncio.sleep(0.02)
    return {"stranded": wrappers() - before, "attempts": attempts[0],
            "engines_built": started, "engines_alive_after_close": pollers_alive()}

async def holding(channel, served):
    call = channel.unary_unary("/t.S/M")(b"hi", timeout=5)
    assert await call == b"hi"
    served.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        return  # (lets go of the call as the loop's end cancels it)

async def served_then_closed(target, keep):
    # the README's shape: call, close, and asyncio.run returns at once
    # (``keep``: the call object still referred to at the close, which keeps
    # C-core's channel, and its watches, alive until the coroutine returns,
    # or until the loop's end cancels the task that holds it)
    channel = pyxds.aio.insecure_channel(target)
    if keep == "task":
        served = asyncio.Event()
        asyncio.get_running_loop().create_task(holding(channel, served))
        await served.wait()
    else:
        call = channel.unary_unary("/t.S/M")(b"hi", timeout=5)
        assert await call == b"hi"
        if not keep:
            del call
    await channel.close()

async def served_and_returned(target):
    # the call returned from asyncio.run: still referred to as the loop ends
    channel = pyxds.aio.insecure_channel(target)
    call = channel.unary_unary("/t.S/M")(b"hi", timeout=5)
    assert await call == b"hi"
    await channel.close()
    return call

def closed_programs(runs, kept_runs):
    from concurrent import futures
    from pyxds.channel import subchannel
    server = grpc.server(futures.ThreadPoolExecutor(2))  # sync: no grpc.aio channel
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {"M": echo}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    before = wrappers()
    for run in range(runs):
        keep = (None, "return", "task")[run % 3]
        asyncio.run(served_then_closed(f"ipv4:127.0.0.1:{port}", keep))
    for _ in range(250):  # the engine let go (5 s at most): what is left is stranded
        gc.collect()
        if not pollers_alive():
            break
        threading.Event().wait(0.02)
    stranded = wrappers() - before
    # a wait for the SHUTDOWN at the loop's end would take all of this
    subchannel.SHUTDOWN_READ_WAIT = 5.0
    kept, seconds = [], []
    for run in range(kept_runs):
        started = time.monotonic()
        kept.append(asyncio.run(served_and_returned(f"ipv4:127.0.0.1:{port}")))
        seconds.append(time.monotonic() - started)
    del kept
    server.stop(None)
    return {"stranded": stranded, "kept_seconds": seconds}

print(json.dumps({"grpcio": asyncio.run(plain_grpcio()), "pyxds": asyncio.run(pyxds_attempts()),
                  "closed_programs": closed_programs(12, 3)}))
"""


def _run(script: str, *args: str) -> tuple[dict[str, Any], str]:
    """What ``script``, run in a fresh process, printed last (JSON), and its stderr."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.fixture(scope="module")
def refusing_run() -> dict[str, Any]:
    """The script's counts (one fresh process for the module's tests)."""
    return _run(_SCRIPT)[0]


def test_a_pyxds_aio_channel_to_a_refusing_address_strands_no_grpcio_watch(refusing_run):
    grpcio_strands = refusing_run["grpcio"]
    assert grpcio_strands == 1, "grpcio (1.85) strands a cancelled watch of its last channel"
    assert refusing_run["pyxds"]["stranded"] == 0, refusing_run


def test_a_program_that_closes_its_aio_channel_and_returns_strands_no_grpcio_watch(refusing_run):
    # asyncio.run's end cancels every task, then closes the loop: a closed
    # subchannel's watch lets its grpcio wait read the SHUTDOWN first (the
    # old code stranded 5-8 watches in 12 such programs, the SHUTDOWN's
    # completion coming for a closed loop), also when the call is let go by
    # a task the loop's end cancels with the watch (LET_GO_TURNS)
    assert refusing_run["closed_programs"]["stranded"] == 0, refusing_run


def test_a_program_that_returns_its_call_from_asyncio_run_ends_without_waiting(refusing_run):
    # the call keeps C-core's channel past the loop's end, so its SHUTDOWN
    # cannot come: the closed subchannel's watch does not wait for it (the
    # old code waited SHUTDOWN_READ_WAIT, 5 s here, in each such program)
    seconds = refusing_run["closed_programs"]["kept_seconds"]
    assert len(seconds) == 3 and max(seconds) < 2.5, refusing_run


def test_a_pyxds_aio_channel_holds_grpcios_engine_across_failed_attempts_until_closed(
    refusing_run,
):
    got = refusing_run["pyxds"]
    assert got["attempts"] >= 5, got  # else the count below proves nothing
    # the first attempt built it (the plain channel before let it go); the
    # old code built one per attempt (one per attempt that left none alive)
    assert got["engines_built"] == 1, got
    assert got["engines_alive_after_close"] == 0, got


#: backends of the program below
_ENDPOINTS = 30

_CLOSES_ITS_LOOP = r"""
import asyncio, json, sys, time
from concurrent import futures
import grpc
import pyxds.aio
from pyxds.testing.aio_counts import stranded_watches

n = int(sys.argv[1])
server = grpc.server(futures.ThreadPoolExecutor(4))  # sync: no grpc.aio channel
echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {"M": echo}),))
ports = [server.add_insecure_port("127.0.0.1:0") for _ in range(n)]
server.start()
target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
round_robin = {"loadBalancingConfig": [{"round_robin": {}}]}
kept = []

async def main():
    # another grpc.aio channel keeps grpcio's engine up past the loop's close
    # (as in a program with more channels): a completion of a closed
    # subchannel's watch then reaches a closed loop, whose tasks are dropped
    kept.append(grpc.aio.insecure_channel("127.0.0.1:1"))
    channel = pyxds.aio.insecure_channel(target, service_config=round_robin)
    call = channel.unary_unary("/t.S/M")
    for _ in range(2 * n):  # every endpoint connected and served
        assert await call(b"hi", timeout=10) == b"hi"
    await channel.close()
    return sum(1 for task in asyncio.all_tasks() if task is not asyncio.current_task())

loop = asyncio.new_event_loop()
pending = loop.run_until_complete(main())
loop.close()  # not asyncio.run: nothing cancels or awaits what is left
del loop
server.stop(None)
for _ in range(25):  # what grpcio still delivers comes (0.5 s at most)
    if not stranded_watches():
        break
    time.sleep(0.02)
# a pending task freed by now said "Task was destroyed but it is pending!"
stranded = stranded_watches()
print(json.dumps({"pending_after_close": pending, "stranded": stranded}))
"""


@pytest.fixture(scope="module")
def closes_its_loop() -> tuple[dict[str, Any], str]:
    """What the program printed, and its stderr."""
    return _run(_CLOSES_ITS_LOOP, str(_ENDPOINTS))


def test_a_program_that_closes_its_own_loop_after_the_channels_close_finds_no_task_of_it(
    closes_its_loop,
):
    # the old close returned with one connectivity watch task pending per
    # endpoint (2-6 ms more), each reported at its loop's close, or its
    # grpcio watch stranded when no other grpc.aio channel was left
    got, stderr = closes_its_loop
    assert "Task was destroyed" not in stderr, stderr
    assert got == {"pending_after_close": 0, "stranded": 0}, (got, stderr)
