"""When the lean blocking unary call (pyxds/channel/grpc_unary.py) is used:
only on a grpcio whose mirrored functions are the ones it was checked
against, and only for grpcio's sync unary-unary multicallables.  (Its
behaviour against grpcio: tests/e2e/test_conformance_unary_lean.py.)"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import os
import pathlib
import subprocess
import sys
import threading

import grpc
import grpc.aio
import pytest

from pyxds.channel import grpc_unary

#: this grpcio's version is one the lean path was checked against (a newer
#: grpcio is not a failure: pyxds keeps grpcio's own multicallables there)
CHECKED_GRPCIO = f"grpcio {grpc.__version__}" in grpc_unary.VERIFIED.values()
needs_checked_grpcio = pytest.mark.skipif(
    not CHECKED_GRPCIO, reason=f"grpcio {grpc.__version__} is not a checked one"
)
SRC = str(pathlib.Path(grpc_unary.__file__).parents[2])  # src/, for a child program


@pytest.fixture
def fresh():
    """The check taken again in the test, and again after it (a test's
    answer is not kept)."""
    grpc_unary.available.reset()
    yield
    grpc_unary.available.reset()


@needs_checked_grpcio
def test_this_grpcio_is_a_checked_one(fresh):
    assert grpc_unary.fingerprint() in grpc_unary.VERIFIED
    assert grpc_unary.available()


@pytest.mark.parametrize(
    ("algorithm", "fingerprint"),
    [("sha256", "source_fingerprint"), ("sha512", "code_fingerprint")],
)
def test_the_fingerprint_is_the_same_without_a_built_in_implementation(
    monkeypatch, algorithm, fingerprint
):
    """CPython's built-in SHA-256 and SHA-512 (loaded instead of hashlib, at
    start-up) and hashlib's give the same fingerprint."""
    functions = grpc_unary._mirrored()
    take = getattr(grpc_unary, fingerprint)
    assert type(grpc_unary._digest(algorithm)).__module__ in ("_sha2", f"_{algorithm}")
    built_in = take(functions)
    for name in ("_sha2", f"_{algorithm}"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    assert type(grpc_unary._digest(algorithm)) is type(getattr(hashlib, algorithm)())
    assert take(functions) == built_in
    assert len(built_in) == 64


#: per module: a module-level grpcio function it mirrors, and an edit to its
#: source that changes what it does
EDITS = {
    "grpc_unary": ("serialize", "Exception serializing message!", "Exception serializing!"),
    "grpc_aio_unary": ("serialize", "Exception serializing message!", "Exception serializing!"),
    "grpc_aio_twin": ("_augment_channel_arguments", "tuple(base_options)", "list(base_options)"),
}


def _copy_in(tmp_path, fn, lead: str = "", edit: tuple[str, str] | None = None):
    """``fn`` defined again from its module's source, in a file of its own
    under ``tmp_path`` (``lead`` lines before it, ``edit`` made to it):
    grpcio's function as another grpcio release would have it.  The whole
    module: how a call compiles depends on its imports (CPython 3.11
    calls an imported module's function without ``LOAD_METHOD``)."""
    module = inspect.getmodule(fn)
    source = inspect.getsource(module)
    if edit is not None:
        assert source.count(edit[0]) == 1
        source = source.replace(*edit)
    path = tmp_path / f"copy_of_{fn.__name__}.py"
    path.write_text(lead + source)
    namespace = {"__name__": "copy_of_grpcio", "__package__": module.__package__}
    exec(compile(path.read_text(), str(path), "exec", dont_inherit=True), namespace)
    return namespace[fn.__name__]


def _mirrored_with(module, name: str, replacement) -> list:
    functions = module._mirrored()
    (index,) = [i for i, fn in enumerate(functions) if fn.__qualname__ == name]
    functions[index] = replacement
    return functions


@needs_checked_grpcio
def test_a_changed_grpcio_function_turns_the_lean_path_off(fresh_checker, monkeypatch, tmp_path):
    """Another grpcio whose mirrored function does something else (here: one
    constant or one name changed in its source) matches neither
    fingerprint: the lean path is off, grpcio's own objects are used."""
    module = fresh_checker
    name, old, new = EDITS[module.__name__.rsplit(".", 1)[1]]
    real = next(fn for fn in module._mirrored() if fn.__qualname__ == name)
    checked = module.fingerprint()
    changed = _mirrored_with(module, name, _copy_in(tmp_path, real, edit=(old, new)))
    monkeypatch.setattr(module, "_mirrored", lambda: changed)
    assert module.fingerprint() != checked
    assert module.fingerprint() not in module.VERIFIED
    assert module.sources() not in module.VERIFIED
    assert module.available() is False


@needs_checked_grpcio
def test_a_grpcio_function_moved_in_its_file_keeps_the_code_fingerprint(
    fresh_checker, monkeypatch, tmp_path
):
    """The code fingerprint is of what the functions run, not where they
    are: the same function further down another file (grpcio's edits
    elsewhere in it) has the same fingerprint, and the source text is not
    read."""
    module = fresh_checker
    name = EDITS[module.__name__.rsplit(".", 1)[1]][0]
    real = next(fn for fn in module._mirrored() if fn.__qualname__ == name)
    moved = _mirrored_with(module, name, _copy_in(tmp_path, real, lead="\n" * 40))
    checked = module.fingerprint()
    monkeypatch.setattr(module, "_mirrored", lambda: moved)
    assert module.fingerprint() == checked
    assert moved[[fn.__qualname__ for fn in moved].index(name)].__code__.co_firstlineno > 40
    assert module.fingerprint() in module.VERIFIED

    def unread() -> str:
        raise AssertionError("the source text was read")

    monkeypatch.setattr(module, "sources", unread)
    assert module.available() is True


@needs_checked_grpcio
def test_a_python_without_a_recorded_code_fingerprint_checks_the_source_text(
    fresh_checker, monkeypatch
):
    """On a CPython whose bytecode was not recorded (another minor version)
    the source text's fingerprint decides, as before code fingerprints."""
    module = fresh_checker
    monkeypatch.setattr(module, "fingerprint", lambda: "0" * 64)
    monkeypatch.setattr(module, "_bind", lambda: None)
    assert module.sources() in module.VERIFIED
    assert module.available() is True


_PROBE = """
import sys
from pyxds.channel.grpc_unary import code_fingerprint
SENTINEL = object()
def probe(x, marker=SENTINEL, *, kinds=frozenset({"alpha", "beta", "gamma", "delta"})):
    return x in {"one", "two", "three", "four", 5.5, b"six"} and marker is not None
print(code_fingerprint([probe]))
"""


def test_the_code_fingerprint_is_the_same_in_every_process():
    """Set constants and defaults (iterated in an order that moves with the
    string hash seed) and sentinel defaults (their repr has an address) are
    written the same way in each process."""
    digests = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": SRC}
        run = subprocess.run(
            [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr
        digests.add(run.stdout.strip())
    assert len(digests) == 1


@pytest.fixture(params=["grpc_unary", "grpc_aio_unary", "grpc_aio_twin"])
def fresh_checker(request):
    """Each module whose lean path checks grpcio once, its check taken
    again in the test and after it."""
    module = importlib.import_module(f"pyxds.channel.{request.param}")
    module.available.reset()
    yield module
    module.available.reset()


def test_a_second_caller_during_the_check_waits_for_its_answer(fresh_checker, monkeypatch):
    """The xDS resolver takes the check ahead on its load-ahead thread, and
    the first call may ask meanwhile: it waits for that answer instead of
    taking the digest of grpcio's sources a second time."""
    module = fresh_checker
    taken: list[str] = []
    entered, go, arrived = threading.Event(), threading.Event(), threading.Event()

    def held_fingerprint() -> str:
        taken.append(threading.current_thread().name)
        entered.set()
        assert go.wait(10)
        return next(iter(module.VERIFIED))

    lock = module.available._lock

    class Arrivals:
        """The check's lock, noting when the second caller reaches it."""

        def __enter__(self) -> None:
            if threading.current_thread().name == "second":
                arrived.set()
            lock.acquire()

        def __exit__(self, *exc: object) -> None:
            lock.release()

    monkeypatch.setattr(module, "fingerprint", held_fingerprint)
    monkeypatch.setattr(module, "_bind", lambda: None)
    monkeypatch.setattr(module.available, "_lock", Arrivals())
    answers: dict[str, bool] = {}

    def ask() -> None:
        answers[threading.current_thread().name] = module.available()

    threads = [threading.Thread(target=ask, name=name) for name in ("first", "second")]
    threads[0].start()
    assert entered.wait(10)
    threads[1].start()
    assert arrived.wait(10)
    go.set()
    for thread in threads:
        thread.join(10)
    assert answers == {"first": True, "second": True}
    assert taken == ["first"]


def test_a_reset_check_is_taken_again(fresh_checker, monkeypatch):
    module = fresh_checker
    monkeypatch.setattr(module, "VERIFIED", {"0" * 64: "not this one"})
    assert module.available() is False
    assert module.available.answer is False
    module.available.reset()
    assert module.available.answer is None
    monkeypatch.setattr(module, "VERIFIED", {module.fingerprint(): "this one"})
    monkeypatch.setattr(module, "_bind", lambda: None)
    assert module.available() is True


def test_a_grpcio_with_other_sources_keeps_its_own_multicallables(fresh, monkeypatch):
    monkeypatch.setattr(grpc_unary, "VERIFIED", {"0" * 64: "not this one"})
    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        mc = channel.unary_unary("/s/m")
        assert grpc_unary.lean(mc) is mc
        assert not grpc_unary.available()
    finally:
        channel.close()


def test_a_grpcio_missing_a_mirrored_function_keeps_its_own_multicallables(fresh, monkeypatch):
    def missing():
        raise AttributeError("_blocking")

    monkeypatch.setattr(grpc_unary, "_mirrored", missing)
    assert not grpc_unary.available()


@needs_checked_grpcio
def test_only_sync_unary_unary_multicallables_are_made_lean(fresh):
    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        assert isinstance(grpc_unary.lean(channel.unary_unary("/s/m")), grpc_unary.LeanUnaryUnary)
        stream = channel.unary_stream("/s/m")
        assert grpc_unary.lean(stream) is stream
    finally:
        channel.close()


def test_grpc_aio_multicallables_are_left_alone(fresh):
    async def main():
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        try:
            mc = channel.unary_unary("/s/m")
            assert grpc_unary.lean(mc) is mc
        finally:
            await channel.close()

    asyncio.run(main())


@needs_checked_grpcio
def test_a_lean_call_made_from_its_channel_takes_what_grpcio_would_give_it(fresh):
    """lean_on (a transport's cached unary method) reads what grpcio's own
    unregistered multicallable holds, without making one (issue 18: ~650
    bytes per endpoint) until a call it does not take needs it: then once."""
    channel = grpc.insecure_channel("127.0.0.1:1")
    made: list = []
    real = channel.unary_unary

    def counting_unary_unary(*args, **kwargs):
        made.append(args)
        return real(*args, **kwargs)

    channel.unary_unary = counting_unary_unary  # type: ignore[method-assign]
    try:

        def ser(r):
            return b""

        def deser(b):
            return b

        lean = grpc_unary.lean_on(channel, "/s/m", ser, deser)
        eager = grpc_unary.lean(real("/s/m", ser, deser))
        assert isinstance(lean, grpc_unary.LeanUnaryUnary) and made == []
        for name in ("_method", "_context", "_handle", "_serializer", "_deserializer"):
            assert getattr(lean, name) == getattr(eager, name), name
        assert lean._call_on == eager._call_on  # the same C-core channel's
        future = lean.future(b"", timeout=0.01)  # a call it does not take
        with pytest.raises(grpc.RpcError):
            future.result()
        lean.future(b"", timeout=0.01).exception()
        assert made == [("/s/m", ser, deser)]  # made once, then kept
    finally:
        channel.close()


def test_a_lean_call_on_another_channel_is_grpcios_own(fresh):
    class Fake:
        def unary_unary(self, *args):
            return ("plain", args)

    assert grpc_unary.lean_on(Fake(), "/s/m", None, None) == ("plain", ("/s/m", None, None))  # type: ignore[arg-type]
