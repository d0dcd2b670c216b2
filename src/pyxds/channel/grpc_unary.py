"""grpcio's blocking unary-unary call without the bookkeeping its common
outcome does not use (issue 18 item 2: cost per RPC).

Theory of operation
-------------------

Every attempt of a pyxds RPC is a call on a subchannel's grpcio channel.
For the commonest call, a blocking unary-unary ``__call__`` /
``with_call``, grpcio's Python layer (``grpc/_channel.py``,
``_UnaryUnaryMultiCallable._blocking``) spends about as many instructions
as C-core's whole call (callgrind, grpcio 1.85, calling thread: 190k per
call through the multicallable, 114k for the same C-core call made as
below): it builds an ``_RPCState`` (a ``threading.Condition``, a set of
due operations) and walks the six completed operations in Python before
it looks at the status.

:class:`LeanUnaryUnary` stands in for one grpcio unary-unary
multicallable (same call signatures).  A call:

1. does what grpcio's ``_blocking`` does up to the end of the C-core
   call, in its order and with grpcio's own helpers and values: the
   deadline from ``timeout`` (wall clock, as grpcio), the request
   serialized (``_common.serialize``; a failure raises grpcio's
   ``_InactiveRpcError`` "Exception serializing request!"), the initial
   metadata flags of ``wait_for_ready``, the metadata, the six operations,
   ``segregated_call`` with the same arguments (the deadline capped by a
   server call's own, ``get_deadline_from_context``), ``next_event()``.
   Whatever raises on the way (a closed channel, malformed metadata, a
   timeout that is not a number) is what grpcio raises;
2. when the call ended OK with a response that deserialized
   (``_common.deserialize``), ``__call__`` returns it: what grpcio's
   ``_handle_event`` and ``_end_unary_response_blocking`` return for that
   outcome;
3. for every other outcome, and for ``with_call`` (whose call object is
   built from the RPC's state), the same completed event goes through
   grpcio's own ``_RPCState``, ``_handle_event`` and
   ``_end_unary_response_blocking``: each status, a deadline, a response
   that does not deserialize (the deserializer is not run twice: its first
   result is handed over) raise grpcio's own exception objects, with
   grpcio's codes, details, metadata and debug strings.

Calls it does not take (it hands them to the grpcio multicallable
itself): call credentials, compression, and any call while grpcio's
observability plugin is registered (grpcio records each call's latency
then); ``future()``.

Enabled only on a grpcio whose functions it mirrors are the ones it was
checked against (:data:`VERIFIED`: a fingerprint of their compiled code,
else of their source text; a grpcio that changed any of them gets its
plain multicallables), and checked by differential tests against grpcio's
own channel for every outcome (tests/e2e/test_conformance_unary_lean.py).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Protocol, cast

import grpc

__all__ = [
    "VERIFIED",
    "LeanUnaryUnary",
    "available",
    "code_fingerprint",
    "fingerprint",
    "lean",
    "source_fingerprint",
    "sources",
]

#: fingerprints of the grpcio functions checked: of their code
#: (:func:`fingerprint`, one per CPython minor version), and of their source
#: text (:func:`sources`, any Python); written by scripts/fingerprint_grpcio.py
VERIFIED = {
    # their code (:func:`fingerprint`) on CPython 3.11, 3.12, 3.13
    "43fdc664cbb4df0e738c5c7f568206258c3a3588eaff1a6121cc93969689e389": "grpcio 1.85.3",
    "7634af59b8205acb0946c42c9dec683eba83754c280362827c835d0526ae9290": "grpcio 1.85.3",
    "372ea3ae29fe28a4dfc898e79f0889d8bd9d15b979849183c2712be3260c7c10": "grpcio 1.85.3",
    # their source text (:func:`sources`), any Python
    "383d65d5257174a427b5480bbeb2b3208e1508091914fc510138734106e71ae6": "grpcio 1.85.3",
}

#: the line number of a ``co_lines()`` entry
_LINE = itemgetter(2)


def _mirrored() -> list[Any]:
    """The grpcio functions whose behaviour :class:`LeanUnaryUnary` repeats
    or relies on."""
    _channel: Any = importlib.import_module("grpc._channel")
    _common: Any = importlib.import_module("grpc._common")
    _compression: Any = importlib.import_module("grpc._compression")
    _observability: Any = importlib.import_module("grpc._observability")
    mc = _channel._UnaryUnaryMultiCallable
    return [
        _channel.Channel.unary_unary,
        mc.__init__,
        mc._prepare,
        mc._blocking,
        mc.__call__,
        mc.with_call,
        _channel._start_unary_request,
        _channel._deadline,
        _channel._determine_deadline,
        _channel._end_unary_response_blocking,
        _channel._InitialMetadataFlags.__new__,
        _channel._InitialMetadataFlags.with_wait_for_ready,
        _channel._RPCState.__init__,
        _channel._handle_event,
        _channel._abort,
        _compression.augment_metadata,
        _common._transform,
        _common.serialize,
        _common.deserialize,
        _observability.maybe_record_rpc_latency,
    ]


def fingerprint() -> str:
    """The digest of the mirrored grpcio functions' code (:func:`code_fingerprint`)."""
    return code_fingerprint(_mirrored())


def sources() -> str:
    """SHA-256 of the mirrored grpcio functions' source lines."""
    return source_fingerprint(_mirrored())


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def _digest(algorithm: str) -> _Digest:
    """A hash object (``"sha256"``, ``"sha512"``): CPython's built-in
    implementation when it has one (``_sha2``, 3.12+; ``_sha256``,
    ``_sha512``, 3.11), else hashlib's.  The digest is the same; loading
    ``hashlib`` (OpenSSL's digest list, blake2) cost ~1.2 ms more on a fresh
    program's first RPC, which is the only place a fingerprint is taken
    (issue 18, start-up).  ``random`` (loaded with grpcio) has loaded the
    SHA-512 one already: loading ``_sha256`` was ~0.8 M instructions more."""
    for name in ("_sha2", f"_{algorithm}") if sys.version_info >= (3, 12) else (f"_{algorithm}",):
        try:
            digest: _Digest = getattr(importlib.import_module(name), algorithm)()
        except (ImportError, AttributeError):
            continue
        return digest
    import hashlib

    return cast(_Digest, getattr(hashlib, algorithm)())


def source_fingerprint(functions: list[Any]) -> str:
    """SHA-256 of the source lines of ``functions`` (Python functions): each
    function's lines, first to last, joined by newlines.  Read as bytes and
    the last line found without a Python frame per line entry: the same
    digest as over decoded text for a file with ``\n`` line ends (grpcio's),
    at ~4 M instructions, was ~5 M on a fresh program's first RPC (issue 18,
    start-up)."""
    digest = _digest("sha256")
    files: dict[str, list[bytes]] = {}
    for fn in functions:
        code = fn.__code__
        lines = files.get(code.co_filename)
        if lines is None:
            with open(code.co_filename, "rb") as f:
                lines = files[code.co_filename] = f.read().split(b"\n")
        last = max(filter(None, map(_LINE, code.co_lines())))  # lines count from 1
        digest.update(b"\n".join(lines[code.co_firstlineno - 1 : last]))
    return digest.hexdigest()


def _canonical(value: Any) -> Any:
    """``value`` (a code constant or a default) as plain values whose
    ``repr`` is the same in every process: a code object by its parts
    (:func:`_code_parts`), a frozenset sorted, another object (a sentinel)
    by its type's name."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is tuple:
        return tuple(map(_canonical, value))
    if kind is _CODE:
        return _code_parts(value)
    if kind is frozenset:
        return ("frozenset", sorted(map(repr, map(_canonical, value))))
    return ("object", kind.__module__, kind.__qualname__)


def _code_parts(code: Any, doc: str | None = None) -> tuple[bytes, bytes, str]:
    """What a code object runs, without where it is (file, line numbers):
    its bytecode, its exception table, and a text of its names (identifiers:
    joined by spaces), argument counts, flags and constants (nested code in
    turn; ``doc``, its function's docstring, left out: it was two thirds of
    the text and runs nothing).  Joined rather than one ``repr`` of it all:
    ~0.7 M instructions less for grpcio's mirrored functions."""
    consts = code.co_consts
    if doc is not None and consts and consts[0] is doc:
        consts = consts[1:]
    text = "\0".join(
        (
            " ".join(code.co_names),
            " ".join(code.co_varnames),
            " ".join(code.co_freevars),
            " ".join(code.co_cellvars),
            f"{code.co_argcount} {code.co_posonlyargcount} {code.co_kwonlyargcount}",
            str(code.co_flags),
            repr(tuple(map(_canonical, consts))),
        )
    )
    return code.co_code, code.co_exceptiontable, text


_CODE = type(_canonical.__code__)
#: constants whose repr is the same in every process
_PLAIN = frozenset({str, bytes, int, float, complex, bool, type(None), type(...)})


def code_fingerprint(functions: list[Any]) -> str:
    """SHA-512 (its first 256 bits, in hex) of what ``functions`` (Python
    functions) run: each one's code (:func:`_code_parts`) and defaults.  It
    changes with any change to what they do, not with their place in their
    file; it is one CPython minor version's (bytecode); it reads no file:
    ~0.5 M instructions where :func:`source_fingerprint` took ~4 M on a
    fresh program's first RPC (issue 18, start-up)."""
    digest = _digest("sha512")
    for fn in functions:
        code, table, rest = _code_parts(fn.__code__, fn.__doc__)
        digest.update(code)
        digest.update(table)
        kwdefaults = tuple((fn.__kwdefaults__ or {}).items())
        text = f"{len(code)} {len(table)}\0{rest}\0{_canonical(fn.__defaults__)!r}"
        digest.update(f"{text}\0{_canonical(kwdefaults)!r}\1".encode())
    return digest.hexdigest()[:64]


def checked(
    fingerprints: Sequence[Callable[[], str]],
    verified: Mapping[str, str],
    bind: Callable[[], None],
) -> bool:
    """Whether the grpcio functions a lean call mirrors are ones it was
    checked against (one of ``fingerprints``, taken in turn, in
    ``verified``: the cheap one first); ``bind`` then binds the private
    names it uses.  Any error (another layout of grpcio) is a no: the
    caller uses grpcio's own multicallables."""
    try:
        ok = any(fingerprint() in verified for fingerprint in fingerprints)
        if ok:
            bind()
    except Exception:
        ok = False
    return ok


class GrpcioCheck:
    """Whether this grpcio is one a lean path was checked against, found
    once per process: call it for the answer.  The first caller runs
    ``check`` (:func:`checked`, a digest of grpcio's sources); a second
    caller meanwhile waits for that answer instead of taking the digest
    again (the xDS resolver takes it ahead on its load-ahead thread, and
    the first call may ask meanwhile).  A no is logged at debug under
    ``owner``'s logger, ``fallback`` saying what is used instead."""

    __slots__ = ("answer", "_check", "_owner", "_fallback", "_lock")

    def __init__(self, check: Callable[[], bool], owner: str, fallback: str) -> None:
        #: None until checked
        self.answer: bool | None = None
        self._check = check
        self._owner = owner
        self._fallback = fallback
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        answer = self.answer
        if answer is None:
            with self._lock:
                answer = self.answer
                if answer is None:
                    answer = self.answer = self._check()
                    if not answer:
                        logging.getLogger(self._owner).debug(
                            "pyxds: grpcio %s: %s", grpc.__version__, self._fallback
                        )
        return answer

    def reset(self) -> None:
        """Forget the answer: the next caller checks again (tests)."""
        with self._lock:
            self.answer = None


#: whether this grpcio is one :class:`LeanUnaryUnary` was checked against
#: (its private names are bound into this module then)
available = GrpcioCheck(
    lambda: checked((fingerprint, sources), VERIFIED, _bind), __name__, "plain unary multicallables"
)


def lean(mc: Any) -> Any:
    """``mc`` (a grpcio multicallable) as a :class:`LeanUnaryUnary` when it
    is a sync unary-unary one and this grpcio was checked; else ``mc``."""
    if type(mc).__module__ != "grpc._channel" or not available():
        return mc
    if type(mc) is not _UnaryUnaryMultiCallable:
        return mc
    return LeanUnaryUnary(mc)


def lean_on(
    channel: grpc.Channel,
    method: str,
    serializer: Callable[[Any], bytes] | None,
    deserializer: Callable[[bytes], Any] | None,
) -> Any:
    """``channel.unary_unary(method, serializer, deserializer)`` (not
    registered), as a :class:`LeanUnaryUnary` that makes that grpcio
    multicallable only when a call it does not take needs it: a
    subchannel's transport caches one per method, and grpcio's (its
    managed-call closure, its dict, the encoded target) was ~650 bytes per
    endpoint (issue 18, memory per endpoint).  What it takes from the
    multicallable is what ``Channel.unary_unary`` and its ``__init__`` give
    an unregistered one (both fingerprinted).  Anything but a sync grpcio
    channel on a checked grpcio gets the multicallable itself, via
    :func:`lean`."""
    if type(channel).__module__ != "grpc._channel" or not available():
        return lean(channel.unary_unary(method, serializer, deserializer))
    return LeanUnaryUnary(None, (channel, method, serializer, deserializer))


class LeanUnaryUnary:
    """One grpcio unary-unary multicallable, called the lean way (see the
    module docstring).  Made from the multicallable, or (:func:`lean_on`)
    from its channel and method, the multicallable then made on first need."""

    __slots__ = (
        "_mc",
        "_source",
        "_call_on",
        "_method",
        "_context",
        "_handle",
        "_serializer",
        "_deserializer",
        "_names",
    )

    def __init__(self, mc: Any, source: tuple[Any, str, Any, Any] | None = None) -> None:
        #: the grpcio multicallable (None until needed, when made from ``source``)
        self._mc = mc
        #: (channel, method, serializer, deserializer) it is made from
        self._source = source
        #: (method, target) as grpcio's state names them (decoded once)
        self._names: tuple[str, str] | None = None
        if mc is None:
            assert source is not None
            # what Channel.unary_unary and _UnaryUnaryMultiCallable.__init__
            # give an unregistered multicallable
            channel, method, serializer, deserializer = source
            self._call_on = channel._channel.segregated_call
            self._method: bytes = _encode(method)
            self._context = _build_census_context()
            self._handle = None
            self._serializer: Callable[[Any], bytes] | None = serializer
            self._deserializer: Callable[[bytes], Any] | None = deserializer
            return
        self._call_on = mc._channel.segregated_call
        self._method = mc._method
        self._context = mc._context
        self._handle = mc._registered_call_handle
        self._serializer = mc._request_serializer
        self._deserializer = mc._response_deserializer

    def _plain(self) -> Any:
        """grpcio's multicallable (made now if it was not)."""
        mc = self._mc
        if mc is None:
            channel, method, serializer, deserializer = self._source  # type: ignore[misc]
            mc = self._mc = channel.unary_unary(method, serializer, deserializer)
        return mc

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        if credentials is not None or compression is not None or _plugin_registered():
            return self._plain()(
                request, timeout, metadata, credentials, wait_for_ready, compression
            )
        return self._blocking(request, timeout, metadata, wait_for_ready, False)

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
        credentials: grpc.CallCredentials | None = None,
        wait_for_ready: bool | None = None,
        compression: grpc.Compression | None = None,
    ) -> Any:
        if credentials is not None or compression is not None or _plugin_registered():
            return self._plain().with_call(
                request, timeout, metadata, credentials, wait_for_ready, compression
            )
        return self._blocking(request, timeout, metadata, wait_for_ready, True)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._plain().future(*args, **kwargs)

    def _blocking(
        self,
        request: Any,
        timeout: float | None,
        metadata: Sequence[tuple[str, str | bytes]] | None,
        wait_for_ready: bool | None,
        with_call: bool,
    ) -> Any:
        # 1. grpcio's _blocking, in its order (module docstring)
        deadline = None if timeout is None else time.time() + timeout
        serialized = _serialize(request, self._serializer)
        flags = _FLAGS[None if wait_for_ready is None else bool(wait_for_ready)]
        augmented = tuple(metadata) if metadata else None  # augment_metadata, no compression
        if serialized is None:
            raise _InactiveRpcError(_RPCState((), (), (), _INTERNAL, _SERIALIZE_FAILED))
        parent = _parent_deadline()
        if parent is not None:
            deadline = parent if deadline is None else min(parent, deadline)
        message_op = _ReceiveMessage(0)
        status_op = _ReceiveStatus(0)
        operations = (
            _SendInitialMetadata(augmented, flags),
            _SendMessage(serialized, 0),
            _SendClose(0),
            _ReceiveInitialMetadata(0),
            message_op,
            status_op,
        )
        call = self._call_on(
            _PROPAGATE_DEFAULTS,
            self._method,
            None,
            deadline,
            metadata,
            None,
            ((operations, None),),
            self._context,
            self._handle,
        )
        event = call.next_event()
        # 2. OK with a response: the response
        deserializer = self._deserializer
        if status_op.code() == _CYGRPC_OK:
            message = message_op.message()
            if message is not None:
                response = _deserialize(message, deserializer)
                if response is not None and not with_call:
                    return response
                deserializer = _Deserialized(response)  # run once only
        # 3. anything else: grpcio's own state, outcome and objects
        state = _RPCState(_UNARY_UNARY_INITIAL_DUE, None, None, None, None)
        names = self._names
        if names is None:
            mc = self._plain()
            names = self._names = (_decode(mc._method), _decode(mc._target))
        state.method, state.target = names
        _handle_event(event, state, deserializer)
        return _end_unary_response_blocking(state, call, with_call, None)


class _Deserialized:
    """A deserializer that answers what the call's one deserialization gave
    (None: it failed, or gave None: grpcio's "Exception deserializing
    response!")."""

    __slots__ = ("_response",)

    def __init__(self, response: Any) -> None:
        self._response = response

    def __call__(self, _message: bytes) -> Any:
        return self._response


def _plugin_registered() -> bool:
    return _observability._OBSERVABILITY_PLUGIN is not None


# grpcio's private names, bound by _bind() once this grpcio is known good
_RPCState: Any
_InactiveRpcError: Any
_handle_event: Any
_end_unary_response_blocking: Any
_UNARY_UNARY_INITIAL_DUE: Any
_FLAGS: Any
_serialize: Any
_deserialize: Any
_decode: Any
_parent_deadline: Any
_PROPAGATE_DEFAULTS: Any
_CYGRPC_OK: Any
_SendInitialMetadata: Any
_SendMessage: Any
_SendClose: Any
_ReceiveInitialMetadata: Any
_ReceiveMessage: Any
_ReceiveStatus: Any
_observability: Any
_UnaryUnaryMultiCallable: Any
_encode: Any
_build_census_context: Any


def _bind() -> None:
    """Bind grpcio's private names this module uses (raises on a grpcio
    that lacks one)."""
    global _RPCState, _InactiveRpcError, _handle_event, _end_unary_response_blocking
    global _UNARY_UNARY_INITIAL_DUE, _FLAGS, _serialize, _deserialize, _decode
    global _parent_deadline, _PROPAGATE_DEFAULTS, _CYGRPC_OK, _SendInitialMetadata
    global _SendMessage, _SendClose, _ReceiveInitialMetadata, _ReceiveMessage
    global _ReceiveStatus, _observability, _UnaryUnaryMultiCallable, _encode
    global _build_census_context
    channel: Any = importlib.import_module("grpc._channel")
    common: Any = importlib.import_module("grpc._common")
    cygrpc: Any = importlib.import_module("grpc._cython.cygrpc")
    _RPCState = channel._RPCState
    _InactiveRpcError = channel._InactiveRpcError
    _handle_event = channel._handle_event
    _end_unary_response_blocking = channel._end_unary_response_blocking
    _UNARY_UNARY_INITIAL_DUE = channel._UNARY_UNARY_INITIAL_DUE
    flags = channel._InitialMetadataFlags()
    _FLAGS = {v: int(flags.with_wait_for_ready(v)) for v in (None, False, True)}
    _serialize = common.serialize
    _deserialize = common.deserialize
    _decode = common.decode
    _parent_deadline = cygrpc.get_deadline_from_context
    _PROPAGATE_DEFAULTS = cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS
    _CYGRPC_OK = cygrpc.StatusCode.ok
    _SendInitialMetadata = cygrpc.SendInitialMetadataOperation
    _SendMessage = cygrpc.SendMessageOperation
    _SendClose = cygrpc.SendCloseFromClientOperation
    _ReceiveInitialMetadata = cygrpc.ReceiveInitialMetadataOperation
    _ReceiveMessage = cygrpc.ReceiveMessageOperation
    _ReceiveStatus = cygrpc.ReceiveStatusOnClientOperation
    _observability = importlib.import_module("grpc._observability")
    _UnaryUnaryMultiCallable = channel._UnaryUnaryMultiCallable
    _encode = common.encode
    _build_census_context = cygrpc.build_census_context


_INTERNAL = grpc.StatusCode.INTERNAL
_SERIALIZE_FAILED = "Exception serializing request!"
