"""A script that never closes its pyxds channels exits as promptly as one
using grpcio's own channels: no hang, no traceback, no log line.

Each case is a real program run in a subprocess, written the way the README
shows the API (make a channel, call, let the script end), over each target
kind (``ipv4:``, ``dns:`` / bare ``host:port``, ``xds:///``), sync and aio,
with an RPC that succeeded, one that failed, and one still queued with
``wait_for_ready``.  The program prints ``time.monotonic()`` as its last
act; the test takes the time the process ended (CLOCK_MONOTONIC is shared by
every process on Linux) and bounds the difference.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest
from channel_fixtures import SERVICE, TARGET, Backend, route, snapshot
from ports import HeldPort

from pyxds.server import ManagementServer

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")
RUN_LIMIT = 10.0  # seconds a case may run at all (the hang was forever)
EXIT_LIMIT = 1.0  # seconds from the script's last line to the process's end

PROLOGUE = """
import sys, time
import grpc
"""

SYNC_BODY = {
    "ok": """
import pyxds
channel = pyxds.insecure_channel(TARGET)
assert channel.unary_unary(WHO)(b"", timeout=5) == b"exit-a"
""",
    "failed": """
import pyxds
channel = pyxds.insecure_channel(TARGET)
try:
    channel.unary_unary(FAIL)(b"UNAVAILABLE", timeout=5)
except grpc.RpcError as err:
    assert err.code() is grpc.StatusCode.UNAVAILABLE, err
""",
    "queued": """
import pyxds
channel = pyxds.insecure_channel(TARGET)
pending = channel.unary_unary(WHO).future(b"", timeout=60, wait_for_ready=True)
time.sleep(0.2)
assert not pending.done()
""",
}

AIO_BODY = {
    "ok": """
import asyncio, pyxds.aio
async def main():
    channel = pyxds.aio.insecure_channel(TARGET)
    assert await channel.unary_unary(WHO)(b"", timeout=5) == b"exit-a"
asyncio.run(main())
""",
    "failed": """
import asyncio, pyxds.aio
async def main():
    channel = pyxds.aio.insecure_channel(TARGET)
    try:
        await channel.unary_unary(FAIL)(b"UNAVAILABLE", timeout=5)
    except grpc.aio.AioRpcError as err:
        assert err.code() is grpc.StatusCode.UNAVAILABLE, err
asyncio.run(main())
""",
    "queued": """
import asyncio, pyxds.aio
async def main():
    channel = pyxds.aio.insecure_channel(TARGET)
    call = channel.unary_unary(WHO)(b"", timeout=60, wait_for_ready=True)
    await asyncio.sleep(0.2)
    assert not call.done()
    return call
asyncio.run(main())
""",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A live backend, a dead port, and a control plane serving ``TARGET``
    (a listener nobody serves stands in for a queued xDS RPC)."""
    backend = Backend("exit-a").start()
    server = ManagementServer().start()
    server.set_snapshot(snapshot([route(prefix="", cluster="c")], {"c": [[backend.address]]}))
    dead = HeldPort()  # every connection refused, no other program can take it
    bootstrap = tmp_path_factory.mktemp("exit") / "bootstrap.json"
    bootstrap.write_text(json.dumps(server.bootstrap()))
    yield {"backend": backend.address, "dead": dead.address, "bootstrap": str(bootstrap)}
    dead.release()
    server.stop()
    backend.release()


def _target(kind: str, outcome: str, world: dict[str, str]) -> str:
    address = world["dead"] if outcome == "queued" else world["backend"]
    if kind == "ipv4":
        return f"ipv4:{address}"
    if kind == "dns":
        return address.replace("127.0.0.1", "localhost")
    return "xds:///nobody-serves-this" if outcome == "queued" else TARGET


def run_script(body: str, target: str, world: dict[str, str]) -> tuple[float, str, str]:
    """Run the program; (seconds from its last line to its end, stdout, stderr)."""
    program = textwrap.dedent(PROLOGUE) + (
        f"TARGET = {target!r}\nWHO = '/{SERVICE}/Who'\nFAIL = '/{SERVICE}/Fail'\n"
        + textwrap.dedent(body)
        + "\nprint('LAST', time.monotonic(), flush=True)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "GRPC_XDS_BOOTSTRAP": world["bootstrap"],
    }
    env.pop("GRPC_XDS_BOOTSTRAP_CONFIG", None)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT,
        env=env,
    )
    ended = time.monotonic()
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    last = [line for line in proc.stdout.splitlines() if line.startswith("LAST ")]
    assert last, (proc.stdout, proc.stderr)
    last_line_at = float(last[-1].split()[1])
    assert started <= last_line_at <= ended
    return ended - last_line_at, proc.stdout, proc.stderr


CASES = [
    (api, kind, outcome)
    for api in ("sync", "aio")
    for kind in ("ipv4", "dns", "xds")
    for outcome in ("ok", "failed", "queued")
]


@pytest.mark.parametrize(("api", "kind", "outcome"), CASES)
def test_a_program_that_never_closes_its_channel_exits_at_once_and_quietly(
    world, api, kind, outcome
):
    body = (SYNC_BODY if api == "sync" else AIO_BODY)[outcome]
    delay, _, stderr = run_script(body, _target(kind, outcome, world), world)
    assert stderr.strip() == "", stderr
    assert delay < EXIT_LIMIT, f"exited {delay:.2f} s after its last line"


def test_exit_stays_prompt_over_repeated_runs_with_several_channels(world):
    """The hang was timing-dependent: several channels of each kind, each
    used and abandoned, ten programs in a row."""
    body = """
import pyxds
for target in TARGETS:
    channel = pyxds.insecure_channel(target)
    assert channel.unary_unary(WHO)(b"", timeout=5) == b"exit-a"
lost = pyxds.insecure_channel(DEAD).unary_unary(WHO).future(b"", timeout=60, wait_for_ready=True)
"""
    targets = [_target(kind, "ok", world) for kind in ("ipv4", "dns", "xds")]
    header = f"TARGETS = {targets!r}\nDEAD = 'ipv4:{world['dead']}'\n"
    for _ in range(10):
        delay, _, stderr = run_script(header + textwrap.dedent(body), TARGET, world)
        assert stderr.strip() == "", stderr
        assert delay < EXIT_LIMIT, f"exited {delay:.2f} s after its last line"


def test_a_channel_garbage_collected_mid_run_is_closed_and_the_program_goes_on(world):
    body = """
import gc, pyxds
from pyxds.channel import lifecycle
channel = pyxds.insecure_channel(TARGET)
assert channel.unary_unary(WHO)(b"", timeout=5) == b"exit-a"
core = channel._core
del channel
gc.collect()
deadline = time.monotonic() + 5
while not core.closed and time.monotonic() < deadline:
    time.sleep(0.01)
assert core.closed
again = pyxds.insecure_channel(TARGET)
assert again.unary_unary(WHO)(b"", timeout=5) == b"exit-a"
with pyxds.insecure_channel(TARGET) as managed:
    assert managed.unary_unary(WHO)(b"", timeout=5) == b"exit-a"
"""
    delay, _, stderr = run_script(body, f"ipv4:{world['backend']}", world)
    assert stderr.strip() == "", stderr
    assert delay < EXIT_LIMIT


QUIET_CLOSE = """
import sys
sys.path.insert(0, E2E)
import pyxds
from channel_fixtures import Backend, route, snapshot
from pyxds.server import ManagementServer

backend = Backend("quiet").start()
server = ManagementServer().start()
server.set_snapshot(snapshot([route(prefix="", cluster="c")], {"c": [[backend.address]]}))
for _ in range(3):
    channel = pyxds.insecure_channel("xds:///" + LISTENER, bootstrap=server.bootstrap())
    assert channel.unary_unary(WHO)(b"", timeout=5) == b"quiet"
    lost = pyxds.insecure_channel("xds:///nobody-serves-this", bootstrap=server.bootstrap())
    pending = lost.unary_unary(WHO).future(b"", timeout=30, wait_for_ready=True)
    channel.close()
    lost.close()
    assert pending.exception() is not None
backend.stop()
server.stop()
"""


def test_closing_channels_then_stopping_the_servers_prints_nothing(world):
    """Our own shutdown order (channels closed, then the control plane and
    the backend stopped) logs nothing: no GOAWAY from a connection close()
    left open, no "xDS call failed" for a stream we cancelled ourselves."""
    from channel_fixtures import LISTENER

    header = f"E2E = {str(pathlib.Path(__file__).parent)!r}\nLISTENER = {LISTENER!r}\n"
    verbosity = os.environ.pop("GRPC_VERBOSITY", None)  # C-core's default: INFO lines show
    try:
        delay, _, stderr = run_script(header + textwrap.dedent(QUIET_CLOSE), TARGET, world)
    finally:
        if verbosity is not None:
            os.environ["GRPC_VERBOSITY"] = verbosity
    assert stderr.strip() == "", stderr
    assert delay < EXIT_LIMIT
