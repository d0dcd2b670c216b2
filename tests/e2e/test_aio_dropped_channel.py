"""A ``pyxds.aio`` channel the program drops without ``close()`` is closed
as a ``grpc.aio`` one is, side by side with grpc.aio 1.85.

grpc.aio's ``Channel.__del__`` closes its channel at once; a call made on
it runs on to its whole answer (its C-core call holds the connection as
long as the call object lives), and a multicallable holds the channel
(``stub = EchoStub(grpc.aio.insecure_channel(...))`` keeps working).  So
the connection to the backend is gone once nothing of the channel is
referred to any more, and stays while a call or a stub is.

Each case is a real program (``run_script``: it exits promptly, with
nothing on stderr: no "Task was destroyed but it is pending!", no "Event
loop is closed") running the same steps with a grpc.aio channel and then
a pyxds.aio one to one backend, counting that backend's connections
(``connections_to``, every wait bounded).  Fails on 6379b3e: the dropped
pyxds.aio channel kept its connection until the interpreter exited (its
core referred back to it, so it was never collected), and its
``asyncio.run`` never saw it closed.
"""

from __future__ import annotations

import json
import pathlib
import textwrap

import pytest
from channel_fixtures import SERVICE, Backend
from test_exit_without_close import run_script

E2E = str(pathlib.Path(__file__).parent)

PROGRAM = """
import asyncio, gc, json, sys
sys.path.insert(0, E2E)
import grpc.aio, pyxds.aio
from channel_fixtures import connections_to

CHANNELS = {
    "grpc.aio": lambda: grpc.aio.insecure_channel(ADDRESS),
    "pyxds.aio": lambda: pyxds.aio.insecure_channel("ipv4:" + ADDRESS),
}

async def until(predicate, timeout):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True

async def requests(go):  # a client stream still open when its channel goes
    yield b"a"
    await go.wait()
    yield b"b"

START = {  # a call started on a new channel: its pick waits for the connection
    "unary_unary": lambda ch, go: ch.unary_unary(SERVICE + "Sleep")(b"0.2", timeout=5),
    "unary_stream": lambda ch, go: ch.unary_stream(SERVICE + "Stream")(b"3", timeout=5),
    "stream_unary": lambda ch, go: ch.stream_unary(SERVICE + "Collect")(requests(go), timeout=5),
    "stream_stream": lambda ch, go: ch.stream_stream(SERVICE + "Chat")(requests(go), timeout=5),
}

async def read(call):
    if KIND in ("unary_unary", "stream_unary"):
        return [(await call).decode()]
    return [response.decode() async for response in call]

async def dropped(make):
    seen = {"no connection before": await until(lambda: connections_to(ADDRESS) == 0, 5)}
    channel = make()
    go = asyncio.Event()
    call = stub = None
    if KIND in START:
        call = START[KIND](channel, go)
    else:
        who = channel.unary_unary(SERVICE + "Who")
        seen["answer"] = [(await who(b"", timeout=5)).decode()]
        if KIND == "stub":
            stub = who
        del who
    del channel
    gc.collect()
    await asyncio.sleep(0.05)  # a close of the channel the call needs would run here
    go.set()
    if call is not None:
        seen["answer"] = await read(call)
        seen["connections while the ended call is kept"] = connections_to(ADDRESS)
        del call
    if stub is not None:
        seen["stub answers"] = (await stub(b"", timeout=5)).decode()
        seen["connections while the stub is kept"] = connections_to(ADDRESS)
        del stub
    gc.collect()
    seen["connection gone once dropped"] = await until(lambda: connections_to(ADDRESS) == 0, 3)
    return seen

async def used(make):  # left to asyncio.run's end
    channel = make()
    return [(await channel.unary_unary(SERVICE + "Who")(b"", timeout=5)).decode()]

def at_run_end(make):
    seen = {"answer": asyncio.run(used(make))}
    seen["connection gone after asyncio.run"] = asyncio.run(
        until(lambda: connections_to(ADDRESS) == 0, 3)
    )
    return seen

async def in_loop():
    return {name: await dropped(make) for name, make in CHANNELS.items()}

if KIND == "at_run_end":
    SEEN = {name: at_run_end(make) for name, make in CHANNELS.items()}
else:
    SEEN = asyncio.run(in_loop())
print("SEEN", json.dumps(SEEN), flush=True)
"""

WHO_ONLY = {"no connection before": True, "answer": ["drop"], "connection gone once dropped": True}
CALL = {"no connection before": True, "connections while the ended call is kept": 1}
EXPECTED = {
    "no_call": WHO_ONLY,
    "stub": {**WHO_ONLY, "stub answers": "drop", "connections while the stub is kept": 1},
    "unary_unary": {**CALL, "answer": ["drop"], "connection gone once dropped": True},
    "unary_stream": {**CALL, "answer": ["drop"] * 3, "connection gone once dropped": True},
    "stream_unary": {**CALL, "answer": ["drop:2"], "connection gone once dropped": True},
    "stream_stream": {
        **CALL,
        "answer": ["drop:a", "drop:b"],
        "connection gone once dropped": True,
    },
    "at_run_end": {"answer": ["drop"], "connection gone after asyncio.run": True},
}


@pytest.fixture(scope="module")
def backend():
    """The backend only these programs connect to (they count its connections)."""
    b = Backend("drop").start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory, backend):
    bootstrap = tmp_path_factory.mktemp("drop") / "bootstrap.json"
    bootstrap.write_text("{}")  # no xds: target here
    return {"bootstrap": str(bootstrap)}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_a_dropped_aio_channel_is_closed_once_nothing_of_it_is_kept_like_grpc_aio(
    kind, backend, world
):
    """no_call: dropped after an RPC; stub: its multicallable kept, and
    answering; each kind of call: dropped while the call waits for its
    connection (the client streams also with a request still to send), the
    whole answer, the connection kept with the call object; at_run_end:
    left to ``asyncio.run``'s end, closed by it."""
    header = (
        f"E2E = {E2E!r}\nADDRESS = {backend.address!r}\nSERVICE = '/{SERVICE}/'\nKIND = {kind!r}\n"
    )
    _, stdout, stderr = run_script(header + textwrap.dedent(PROGRAM), "", world)
    assert stderr.strip() == "", stderr
    (line,) = [line for line in stdout.splitlines() if line.startswith("SEEN ")]
    seen = json.loads(line[len("SEEN ") :])
    assert seen["pyxds.aio"] == seen["grpc.aio"] == EXPECTED[kind], seen
