"""A ``grpc.aio`` channel on a sync grpcio channel's own connection (gRFC
A51: out-of-band ORCA reports stream on the subchannel's connection).

Theory of operation
-------------------

A sync subchannel's out-of-band ORCA stream cannot be read on its sync
grpcio channel without a thread blocked on it (:mod:`pyxds.channel.orca_oob`),
so it runs as a ``grpc.aio`` call on the xDS stream loop, on a ``grpc.aio``
channel to the same address: the *twin*.  C-core shares one connection
between channels when their subchannels have equal keys: the address and
the channel arguments, compared in C-core's global subchannel pool.  Made
the public way, a twin's arguments differ from its sync channel's in two
places, so each opened a second TCP connection (issue 18: ~29 KB of RSS and
~0.2 ms of client CPU per endpoint, a second socket on the backend):

* grpcio appends its own ``grpc.primary_user_agent`` last
  (``grpc-python/...`` for ``grpc._channel``, ``grpc-python-asyncio/...``
  for ``grpc.aio``), and C-core keeps the last value of a key;
* cygrpc's sync ``Channel`` appends ``("grpc.fork_epoch", epoch)``.

:func:`twin` builds the ``grpc.aio.Channel`` with the very arguments
grpcio gives the sync channel (grpcio's own ``_separate_channel_options``
and ``_augment_options``, plus the fork epoch), doing what
``grpc.aio.Channel.__init__`` does with them (no interceptors).  C-core then
finds the sync channel's subchannel in its global pool, and the stream runs
on that connection, as C-core's own OOB stream does: one connection per
endpoint, whose READY the twin sees at once.  (Channel credentials are part
of the key too: plaintext ones, and an A29 subchannel's plaintext hop to its
TLS relay, compare equal; cygrpc makes a new C-core object of an
application's ``grpc.ssl_channel_credentials`` per channel, which C-core
tells apart, so such a twin gets a connection of its own.)

Such a twin is lean (issue 18: memory per endpoint, ~73 -> ~65 KB against
C-core's ~43 at 1000 WRR+OOB endpoints): a :class:`Twin` is cygrpc's C-core
channel object without the ``grpc.aio.Channel`` around it (its lists and
weak set), and a :class:`UnaryStreamReader` reads its one streaming call
the way grpc.aio's ``UnaryStreamCall`` does (start, reads, status, cancel),
by callbacks on the loop, without the call object, its tasks and
coroutines.  An
unstarted call, made and dropped with the twin, sizes C-core's call arena:
C-core makes a call's first arena block as big as the calls its channel
already ended used (1.5 KB for a new channel, then a block per allocation
that does not fit); after it, the stream's call and its filters' data fit
one block (-1.4 KB per endpoint; nothing is sent: a call reaches the
transport with its first batch).  tests/e2e/test_oob_twin_stream.py
compares the lean reader with grpc.aio's on the same server.

A sync transport therefore uses C-core's global subchannel pool with a key
of its own (:func:`transport_options`: a unique ``pyxds.connection``
argument in place of ``grpc.use_local_subchannel_pool``): two transports
still never share a C-core subchannel and its backoff, and no channel of
the application's (which lacks the key) shares one with pyxds.

Used only on a grpcio whose functions it mirrors are, line for line, the
ones it was checked against (:data:`VERIFIED`, a fingerprint of their
source text; the fork epoch is cygrpc's, checked with the same grpcio
release by tests/e2e/test_wrr_orca_channel.py, which counts the backend's
connections).  The fingerprint is taken with the first twin (a program
without OOB streams never pays it).  On another grpcio the twin is made the
public way, over a second connection (with :data:`ENABLED` off, transports
also keep the local pool).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
import grpc.aio

from pyxds.channel.grpc_unary import GrpcioCheck, checked, code_fingerprint, source_fingerprint
from pyxds.xds.stepped import Stepped

__all__ = [
    "ENABLED",
    "KEY",
    "VERIFIED",
    "Sink",
    "Twin",
    "UnaryStreamReader",
    "available",
    "fingerprint",
    "sources",
    "public_channel",
    "transport_options",
    "twin",
]

#: fingerprints of the grpcio functions checked: of their code
#: (:func:`fingerprint`, one per CPython minor version), and of their source
#: text (:func:`sources`, any Python); written by scripts/fingerprint_grpcio.py
VERIFIED = {
    # their code (:func:`fingerprint`) on CPython 3.11, 3.12, 3.13
    "6890f6108b749de6df6a37ba66ee75c44b2b9e83b69793bfcd522949375eb497": "grpcio 1.85.3",
    "e3caae8025c1796bb4601b1addd43ae6e276421c97cb19056eb346a361c08dd8": "grpcio 1.85.3",
    "f5fa1770ac52a351068bf008c6dbb1e2a09f6a29db143bee25589677afafcd4b": "grpcio 1.85.3",
    # their source text (:func:`sources`), any Python
    "3f20ffc20504c3b4973087a0d505ac756e6bb0fdc51fcc1dfa214802aec51273": "grpcio 1.85.3",
}
#: whether sync transports are keyed so that their twin may share their
#: connection (tests compare both ways)
ENABLED = True
#: the channel argument that keys one transport's C-core subchannel
KEY = "pyxds.connection"
_LOCAL_POOL = "grpc.use_local_subchannel_pool"

_ids = itertools.count(1)
_sync: Any = None
_aio: Any = None
_cygrpc: Any = None
_common: Any = None


def _mirrored() -> list[Any]:
    """The grpcio functions whose behaviour :func:`twin` repeats or relies on."""
    sync: Any = importlib.import_module("grpc._channel")
    aio: Any = importlib.import_module("grpc.aio._channel")
    call: Any = importlib.import_module("grpc.aio._call")
    return [
        grpc.insecure_channel,
        grpc.secure_channel,
        sync.Channel.__init__,
        sync._separate_channel_options,
        sync._augment_options,
        aio.Channel.__init__,
        aio._augment_channel_arguments,
        aio.insecure_channel,
        aio.secure_channel,
        # what Twin and UnaryStreamReader do in place of grpc.aio's channel
        # and UnaryStreamCall (the call, its start, reads, status, cancel,
        # and the channel's close)
        aio.Channel._close,
        aio.Channel.get_state,
        aio.Channel.wait_for_state_change,
        aio.UnaryStreamMultiCallable.__call__,
        call.Call.__init__,
        call.Call._cancel,
        call.Call._raise_for_status,
        call.UnaryStreamCall.__init__,
        call.UnaryStreamCall._send_unary_request,
        call._StreamResponseMixin._read,
        call._StreamResponseMixin.read,
    ]


def fingerprint() -> str:
    """The digest of the mirrored grpcio functions' code (``code_fingerprint``)."""
    return code_fingerprint(_mirrored())


def sources() -> str:
    """SHA-256 of the mirrored grpcio functions' source lines."""
    return source_fingerprint(_mirrored())


def _bind() -> None:
    global _sync, _aio, _cygrpc, _common
    _sync = importlib.import_module("grpc._channel")
    _aio = importlib.import_module("grpc.aio._channel")
    _cygrpc = importlib.import_module("grpc._cython.cygrpc")
    _common = importlib.import_module("grpc._common")
    for name in _CYGRPC_NAMES:  # missing (another layout): not available
        getattr(_cygrpc, name)


#: the cygrpc building blocks :class:`UnaryStreamReader` runs a call with
#: (grpc.aio's own, compiled: outside the fingerprint, bound here)
_CYGRPC_NAMES = (
    "execute_batch",
    "ExecuteBatchError",
    "SendInitialMetadataOperation",
    "SendMessageOperation",
    "SendCloseFromClientOperation",
    "ReceiveInitialMetadataOperation",
    "ReceiveMessageOperation",
    "ReceiveStatusOnClientOperation",
)


#: whether a twin can share its sync channel's connection here (this
#: grpcio was checked; the fingerprint is taken with the first twin, not at
#: start-up)
available = GrpcioCheck(
    lambda: checked((fingerprint, sources), VERIFIED, _bind),
    __name__,
    "OOB streams on a side connection",
)


def transport_options(options: Sequence[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    """A sync transport's grpcio channel options: with :data:`ENABLED`, the
    global subchannel pool keyed by a :data:`KEY` of its own (unique in the
    process) in place of a local pool, so that its twin can share its
    connection and nothing else can; else ``options``."""
    if not ENABLED:
        return tuple(options)
    out = [o for o in options if o[0] != _LOCAL_POOL]
    out.append((KEY, next(_ids)))
    return tuple(out)


def public_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]],
    compression: grpc.Compression | None,
) -> Any:
    """``grpc.aio.insecure_channel`` (no ``credentials``) or
    ``grpc.aio.secure_channel``: a ``grpc.aio`` channel made the public way."""
    if credentials is None:
        return grpc.aio.insecure_channel(target, options, compression)
    return grpc.aio.secure_channel(target, credentials, options, compression)


def twin(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]],
    compression: grpc.Compression | None,
) -> Any:
    """A ``grpc.aio.Channel`` to the destination of ``grpc.insecure_channel``
    / ``grpc.secure_channel`` with the same arguments (``options`` from
    :func:`transport_options`), made on the event loop that will run its
    calls.  On a checked grpcio its C-core arguments are that channel's, so
    it shares that channel's connection; elsewhere it is a ``grpc.aio``
    channel made the public way (a second connection)."""
    if not (ENABLED and any(k == KEY for k, _ in options) and available()):
        return public_channel(target, credentials, options, compression)
    _python, core = _sync._separate_channel_options(options)
    args = (
        *_sync._augment_options(core, compression),
        ("grpc.fork_epoch", _cygrpc.get_fork_epoch()),
    )
    channel = _cygrpc.AioChannel(
        _common.encode(target),
        args,
        None if credentials is None else getattr(credentials, "_credentials"),  # noqa: B009
        _cygrpc.get_working_loop(),
    )
    # A call never started, dropped at once: C-core sizes the first block of
    # a call's arena by the calls this channel already ended (1.5 KB for a
    # new channel, then a block per allocation that does not fit).  This one
    # ends having made the call and its filters' data, so the stream's call
    # makes them in one block (-1.4 KB malloc per endpoint; nothing is sent:
    # a call reaches the transport only with its first batch).
    channel.call(_SIZING_METHOD, None, None, None, 0)
    return Twin(channel)


_SIZING_METHOD = b"/pyxds.twin/Sizing"


class Twin:
    """A twin made on the sync channel's arguments: grpcio's C-core channel
    object (``cygrpc.AioChannel``) without the ``grpc.aio.Channel`` around
    it (issue 18: memory per endpoint; the wrapper's lists and weak set are
    ~1.2 KB, and it is only ever used for one stream at a time).  Its calls
    are read by :class:`UnaryStreamReader`; :meth:`close` is
    ``grpc.aio.Channel.close`` without a grace period (cancel the running
    calls, destroy the channel).  Used on the event loop it was made on."""

    __slots__ = ("_channel", "_calls")

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self._calls: list[Any] = []

    def call(self, method: bytes) -> Any:
        """A call of ``method`` (the C-core call object grpc.aio's
        ``UnaryStreamCall`` wraps: no deadline, credentials or
        wait_for_ready), cancelled by :meth:`close` until its reader ends."""
        call = self._channel.call(method, None, None, None, 0)
        self._calls.append(call)
        return call

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        """``grpc.aio.Channel.get_state``: the channel's connectivity."""
        code = self._channel.check_connectivity_state(try_to_connect)
        return _common.CYGRPC_CONNECTIVITY_STATE_TO_CHANNEL_CONNECTIVITY[code]  # type: ignore[no-any-return]

    def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> Any:
        """``grpc.aio.Channel.wait_for_state_change``: an awaitable that ends
        once the state is not ``last_observed_state`` (the channel's close
        ends it too).  cygrpc's own coroutine, not one around it: a watch per
        side connection, one frame less each (~200 bytes per endpoint)."""
        return self._channel.watch_connectivity_state(last_observed_state.value[0], None)

    def forget(self, call: Any) -> None:
        """``call`` ended: :meth:`close` need not cancel it."""
        try:
            self._calls.remove(call)
        except ValueError:
            pass

    def __del__(self) -> None:
        # grpc.aio.Channel.__del__'s rule: a twin dropped unclosed is
        # destroyed (its hold on the shared C-core subchannel let go)
        channel = getattr(self, "_channel", None)
        if channel is not None and not channel.closed():
            channel.close()

    async def close(self, grace: float | None = None) -> None:
        channel = self._channel
        if channel.closed():
            return
        channel.closing()
        calls, self._calls = self._calls, []
        for call in calls:
            cancel(call)
        channel.close()


def cancel(call: Any) -> None:
    """grpc.aio's ``Call.cancel()`` of a :meth:`Twin.call` (any state)."""
    if not call.done():
        call.cancel(_LOCAL_CANCELLATION)


_LOCAL_CANCELLATION = "Locally cancelled by application!"


class Sink(Protocol):
    """Where a :class:`UnaryStreamReader` hands what it read (one object
    rather than two bound methods: ~128 bytes per stream)."""

    def message(self, raw: bytes) -> None:
        """A response message (serialized)."""

    def end(self, code: grpc.StatusCode, details: str) -> None:
        """The call's status, once."""


class UnaryStreamReader:
    """One :meth:`Twin.call` run as a unary-stream call and read to its end
    by callbacks on its event loop: :meth:`start` sends ``request``
    (serialized), each response message goes to ``sink.message``
    (serialized), then the call's status to ``sink.end(code, details)``,
    once.
    What a ``grpc.aio`` ``UnaryStreamCall`` read with ``read()`` until EOF
    does, without the call object around the C-core one, and without a task
    or a coroutine of its own: each batch is cygrpc's coroutine
    (``execute_batch``: grpc.aio's own), stepped from its future
    (:class:`~pyxds.xds.stepped.Stepped`; a task and a coroutine frame were
    ~0.7 KB per stream, issue 18: memory per endpoint).

    * A locally cancelled call (:func:`cancel`, or the twin's close) ends
      ``CANCELLED``, as grpc.aio's raises ``CancelledError``; an error of
      ``sink.message`` ends it ``UNKNOWN`` (the call cancelled).
    * The status is asked for once the messages ended, not from the start:
      a stream read to its end learns of every way it ends from its pending
      message (C-core completes it empty: OK, an error, a cancel, a lost
      connection), so grpc.aio's status task and its pending batch
      (``initiate_unary_stream``: a task, a coroutine, a future and its
      callback, ~1.5 KB per stream) are not needed.
    * :meth:`done` and :meth:`ended` tell and await its end (as a Task's
      ``done()`` and the task itself)."""

    __slots__ = ("_twin", "_call", "_sink", "_op", "_ended", "_done")

    def __init__(self, twin: Twin, call: Any, sink: Sink) -> None:
        self._twin = twin
        self._call = call
        self._sink = sink
        #: the pending batch's receiving operation (a message's, the status's)
        self._op: Any = None
        #: made when first asked for (:meth:`ended`)
        self._ended: asyncio.Future[None] | None = None
        self._done = False

    def start(self, request: bytes) -> None:
        """Send ``request`` (on the loop); the rest follows by callbacks."""
        loop = asyncio.get_running_loop()
        Stepped(_cygrpc.execute_batch(self._call, _start_ops(request), loop), self._started)

    def _started(self, _result: object, error: BaseException | None) -> None:
        if error is not None and not isinstance(error, _cygrpc.ExecuteBatchError):
            self._fail(error)
        else:  # sent (or failed: its status says how, after the messages)
            self._receive()

    def _receive(self) -> None:
        # a batch of one receive, as cygrpc's _receive_message (without its
        # coroutine around execute_batch's)
        op = self._op = _cygrpc.ReceiveMessageOperation(0)
        loop = asyncio.get_running_loop()
        Stepped(_cygrpc.execute_batch(self._call, (op,), loop), self._received)

    def _received(self, _result: object, error: BaseException | None) -> None:
        if error is not None and not isinstance(error, _cygrpc.ExecuteBatchError):
            self._fail(error)
            return
        # a failed receive is the end of the messages, as for grpc.aio
        raw = None if error is not None else self._op.message()
        if raw is None:  # no more messages: the status
            op = self._op = _cygrpc.ReceiveStatusOnClientOperation(0)
            loop = asyncio.get_running_loop()
            Stepped(_cygrpc.execute_batch(self._call, (op,), loop), self._got_status)
            return
        self._op = None
        try:
            self._sink.message(raw)
        except Exception as err:
            self._fail(err)
            return
        self._receive()

    def _got_status(self, _result: object, error: BaseException | None) -> None:
        if error is not None:
            self._fail(error)
        elif self._call.is_locally_cancelled():  # grpc.aio raises CancelledError
            self._end(grpc.StatusCode.CANCELLED, "")
        else:
            status = self._op
            self._end(_common.CYGRPC_STATUS_CODE_TO_STATUS_CODE[status.code()], status.details())

    def _fail(self, error: BaseException) -> None:
        cancel(self._call)
        if isinstance(error, asyncio.CancelledError):
            self._end(grpc.StatusCode.CANCELLED, "")
        else:
            self._end(grpc.StatusCode.UNKNOWN, str(error))

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        self._done = True
        self._op = None
        self._twin.forget(self._call)
        try:
            self._sink.end(code, details)
        finally:
            ended = self._ended
            if ended is not None and not ended.done():
                ended.set_result(None)

    def done(self) -> bool:
        """Whether the call ended (``on_end`` was called)."""
        return self._done

    def ended(self) -> asyncio.Future[None]:
        """A future of the running loop, done once the call ended."""
        ended = self._ended
        if ended is None:
            ended = self._ended = asyncio.get_running_loop().create_future()
            if self._done:
                ended.set_result(None)
        return ended


def _start_ops(request: bytes) -> tuple[Any, ...]:
    """The first batch of a unary-stream call: what grpc.aio's
    ``initiate_unary_stream`` sends in its batch (no metadata, no
    wait_for_ready: flags 0), with its next step, the initial metadata's
    receipt, in the same batch."""
    return (
        _cygrpc.SendInitialMetadataOperation((), 0),
        _cygrpc.SendMessageOperation(request, 0),
        _cygrpc.SendCloseFromClientOperation(0),
        _cygrpc.ReceiveInitialMetadataOperation(0),
    )
