"""A script that never closes its pyxds channels exits as promptly as one
using grpcio's own channels: no hang, no traceback, no log line.

Each case is a real program run in a subprocess, written the way the README
shows the API (make a channel, call, let the script end), over each target
kind (``ipv4:``, ``dns:`` / bare ``host:port``, ``xds:///``), sync and aio,
with an RPC that succeeded, one that failed, and one still queued with
``wait_for_ready``.

What is timed, and why so (a loaded, shared machine must not fail it):

* The exit's first part is where pyxds can hold a process up: the
  interpreter joins every non-daemon thread (a thread pyxds left behind
  would be waited for here), then runs the atexit hooks (pyxds closes the
  channels left open).  The program prints ``time.monotonic()`` as its last
  line and again from an atexit hook that runs after pyxds's; the wall time
  between the two (CLOCK_MONOTONIC is one clock for every process on Linux)
  is bounded by ``EXIT_LIMIT``.  It is a few ms of CPU with no wait, so
  load hardly moves it (at most 0.07 s at load 9).
* The rest is the interpreter's finalization (modules torn down, grpcio's
  C-core shut down; pyxds's daemon threads stop at their next GIL take).
  Its wall time follows the machine's load, not pyxds: ~0.04 s of CPU took
  up to 1.4 s of wall time at load 9 while other programs' threads ran.  So
  its CPU time is bounded (``EXIT_CPU_LIMIT``: the process's CPU from the
  kernel's rusage minus what it had used at its last line; a busy loop in
  any thread shows here), and a hang by ``RUN_LIMIT`` (the program's
  whole run, start-up included; the hang was forever).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from channel_fixtures import SERVICE, TARGET, Backend, route, snapshot
from ports import HeldPort

from pyxds.server import ManagementServer

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")
RUN_LIMIT = 60.0  # seconds a program may run at all, start-up included (the hang was forever)
EXIT_LIMIT = 1.0  # seconds from the last line to the end of pyxds's atexit hook
EXIT_CPU_LIMIT = 0.5  # CPU seconds of the whole exit (measured: 0.02-0.08 s)

PROLOGUE = """
import atexit, faulthandler, os, resource, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a hung program stands
import grpc
# registered before pyxds is imported, so it runs after pyxds's own hook
# (and ends the watch EPILOGUE starts)
atexit.register(lambda: faulthandler.cancel_dump_traceback_later())
atexit.register(lambda: os.write(1, f"HOOKS-DONE {time.monotonic()}\\n".encode()))
"""

EPILOGUE = """
_usage = resource.getrusage(resource.RUSAGE_SELF)
print("LAST", time.monotonic(), _usage.ru_utime + _usage.ru_stime, flush=True)
if EXIT_WATCH is not None:  # an exit held up past it prints where every thread stands
    faulthandler.dump_traceback_later(EXIT_WATCH)
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


def run_script(
    body: str, target: str, world: dict[str, str], exit_limit: float | None = EXIT_LIMIT
) -> tuple[float, str, str]:
    """Run the program; (seconds from its last line to the end of its atexit
    hooks, stdout, stderr), once it exited 0 within ``RUN_LIMIT`` having
    spent under ``EXIT_CPU_LIMIT`` CPU seconds after its last line and, with
    ``exit_limit``, under that many seconds from its last line to the end of
    its atexit hooks (module doc).  Every failure shows the program's output;
    a held-up exit's shows where each thread stood at ``exit_limit``."""
    program = (
        textwrap.dedent(PROLOGUE)
        + f"TARGET = {target!r}\nWHO = '/{SERVICE}/Who'\nFAIL = '/{SERVICE}/Fail'\n"
        + f"EXIT_WATCH = {exit_limit!r}\n"
        + textwrap.dedent(body)
        + textwrap.dedent(EPILOGUE)
    )
    env = {
        **os.environ,
        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "GRPC_XDS_BOOTSTRAP": world["bootstrap"],
    }
    env.pop("GRPC_XDS_BOOTSTRAP_CONFIG", None)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", program], stdout=out, stderr=err, env=env)
        # reaped here, not by Popen: wait4 gives the exited process's CPU time
        deadline = time.monotonic() + RUN_LIMIT
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() >= deadline:
                proc.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
                proc.kill()
                proc.wait()
                err.seek(0)
                pytest.fail(
                    f"the program still ran after {RUN_LIMIT} s; its threads:\n{err.read()}"
                )
            time.sleep(0.01)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    said = f"exit status {proc.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert proc.returncode == 0, said
    last = [line.split() for line in stdout.splitlines() if line.startswith("LAST ")]
    hooks = [line.split() for line in stdout.splitlines() if line.startswith("HOOKS-DONE ")]
    assert last and hooks, said
    last_line_at, cpu_at_last = float(last[-1][1]), float(last[-1][2])
    exit_cpu = usage.ru_utime + usage.ru_stime - cpu_at_last
    assert exit_cpu < EXIT_CPU_LIMIT, f"exiting took {exit_cpu:.2f} CPU seconds; {said}"
    delay = float(hooks[-1][1]) - last_line_at
    if exit_limit is not None:
        assert delay < exit_limit, f"exit held up {delay:.2f} s after the last line; {said}"
    return delay, stdout, stderr


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
    _, _, stderr = run_script(body, _target(kind, outcome, world), world)
    assert stderr.strip() == "", stderr


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
        _, _, stderr = run_script(header + textwrap.dedent(body), TARGET, world)
        assert stderr.strip() == "", stderr


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
    _, _, stderr = run_script(body, f"ipv4:{world['backend']}", world)
    assert stderr.strip() == "", stderr


def test_a_subscriber_of_a_channel_never_closed_sees_it_shut_down_at_exit_quietly(world):
    """The exit hook's close delivers SHUTDOWN to a ``subscribe`` callback,
    on every Python: 3.12 starts no thread in atexit hooks, where the
    delivery's thread failed to start (a logged traceback, no SHUTDOWN)."""
    body = """
import atexit, threading
seen = []
shut = threading.Event()
def report():  # registered before pyxds's exit hook: runs after it
    shut.wait(5)
    print("STATES", ",".join(state.name for state in seen), flush=True)
atexit.register(report)
import pyxds
channel = pyxds.insecure_channel(TARGET)
def on_state(state):
    seen.append(state)
    if state is grpc.ChannelConnectivity.SHUTDOWN:
        shut.set()
channel.subscribe(on_state)
assert channel.unary_unary(WHO)(b"", timeout=5) == b"exit-a"
"""
    delay, stdout, stderr = run_script(textwrap.dedent(body), TARGET, world)
    assert stderr.strip() == "", stderr
    (states,) = [line.split()[1] for line in stdout.splitlines() if line.startswith("STATES ")]
    assert states.split(",")[-2:] == ["READY", "SHUTDOWN"]
    assert delay < EXIT_LIMIT, f"exit held up {delay:.2f} s after the last line"


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
        _, _, stderr = run_script(header + textwrap.dedent(QUIET_CLOSE), TARGET, world)
    finally:
        if verbosity is not None:
            os.environ["GRPC_VERBOSITY"] = verbosity
    assert stderr.strip() == "", stderr


def test_an_asyncio_program_that_closes_its_channel_and_its_loop_prints_nothing(world):
    """``asyncio.run`` ends the application's loop after ``await close()``,
    while pyxds's xDS stream loop lives on: grpc.aio's poller hands that loop
    the closed loop's last events, which raised "Event loop is closed" from
    the xDS loop's callback (a traceback printed in 4 of 4 runs of this
    program before).  Eight loops in turn, concurrent RPCs, the process
    alive after."""
    body = """
import asyncio, time, pyxds.aio
async def main():
    channel = pyxds.aio.insecure_channel(TARGET)
    who = channel.unary_unary(WHO)
    async def worker():
        for _ in range(100):
            assert await who(b"", timeout=5) == b"exit-a"
    await asyncio.gather(*[worker() for _ in range(4)])
    await channel.close()
for _ in range(8):
    asyncio.run(main())
    time.sleep(0.2)
time.sleep(1.0)
"""
    _, _, stderr = run_script(body, TARGET, world, exit_limit=None)
    assert stderr.strip() == "", stderr


def test_a_program_reading_out_of_band_load_reports_exits_at_once_and_quietly(world):
    """A sync channel whose weighted_round_robin reads each backend's ORCA
    out-of-band stream (A51: grpc.aio calls on pyxds's stream loop, over a
    second connection per backend) and a script that never closes it."""
    from orca_backends import HEAVY, LIGHT, OrcaBackend
    from orca_backends import SERVICE as ORCA_SERVICE

    backends = [OrcaBackend("oob-heavy", HEAVY), OrcaBackend("oob-light", LIGHT)]
    body = f"""
import json, pyxds
config = {{"loadBalancingConfig": [{{"weighted_round_robin": {{
    "enableOobLoadReport": True, "oobReportingPeriod": "0.1s", "blackoutPeriod": "0s"}}}}]}}
channel = pyxds.insecure_channel(TARGET, options=[("grpc.service_config", json.dumps(config))])
who = channel.unary_unary("/{ORCA_SERVICE}/Who")
for _ in range(20):
    who(b"", timeout=5, wait_for_ready=True)
time.sleep(0.3)  # the out-of-band streams open and report
"""
    try:
        target = "ipv4:" + ",".join(b.address for b in backends)
        _, _, stderr = run_script(body, target, world)
    finally:
        for backend in backends:
            backend.stop()
    assert stderr.strip() == "", stderr
