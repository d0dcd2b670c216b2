"""Subchannels on grpcio: one grpcio channel per backend address.

Theory of operation
-------------------

A :class:`SubchannelCore` is the channel's connection to one address (with
one set of credentials).  It is shared by every LB policy of the channel that
asks for that address (:mod:`pyxds.channel.subchannel_pool` refcounts it);
each policy holds its own :class:`ChannelSubchannel` handle (the
``pyxds.lb.Subchannel`` it was given), with its own watchers and its own
``shutdown()``.

The connection itself is a :class:`Transport`: a grpcio channel (sync or
asyncio) to the single address (an IP literal as an ``ipv4:``/``ipv6:``
target, skipping C-core's dns resolver: :func:`grpcio_target`), built so
that grpcio neither balances nor retries on its own:
``grpc.lb_policy_name=pick_first`` over one address,
``grpc.enable_retries=0``, no service config lookups, a C-core subchannel of
its own so that two transports never share one (and its backoff): a local
subchannel pool (``grpc.use_local_subchannel_pool``), or for a sync
transport C-core's global pool keyed by a ``pyxds.connection`` argument
unique to it, which only its ``grpc.aio`` twin (the out-of-band ORCA
stream's channel, :mod:`pyxds.channel.grpc_aio_twin`) shares, an
effectively infinite client idle timeout (idleness is the pyxds channel's
job, A62 ``IDLE_TIMEOUT``), and channelz off (unless the application turns
it on).

How a transport hears its grpcio channel's connectivity costs no thread of
its own (issue 18): a sync one (:class:`PolledTransport`) is polled by the
process's :mod:`pyxds.connectivity` monitor on the one timer thread (warm
while in transition, cold otherwise; an RPC that failed UNAVAILABLE on it
makes it look at once, :meth:`Transport.suspect`), and closed there too; an
asyncio one (:class:`AioTransport`) awaits ``wait_for_state_change`` on its
event loop.  Either one, asked to connect, asks grpcio again each time it
looks until it sees the channel out of IDLE: a connection made and ended by
the server's GOAWAY before it looked leaves the channel IDLE as it was, and
the subchannel would wait for a change that is over (seen under load with a
20 ms ``grpc.max_connection_age_ms``: RPCs queued until their deadline;
:mod:`pyxds.connectivity` rule 7).

State machine of a core (every transition runs on the channel's work
serializer; grpcio's connectivity reports are marshalled onto it)::

    IDLE --connect()--> (new transport if none) --grpcio--> CONNECTING
    CONNECTING --grpcio READY--> READY               (backoff sequence resets)
    CONNECTING --grpcio TRANSIENT_FAILURE--> TRANSIENT_FAILURE
         the transport is retired (grpcio would retry by itself, staying in
         TRANSIENT_FAILURE: C-core's sticky pick_first) and a backoff timer
         starts, due one backoff delay after the failed attempt *started*
         (as C-core: time spent connecting counts); when it fires the core
         reports IDLE (the Subchannel contract
         of ARCHITECTURE.md), and the next connect() builds a fresh transport.
    READY --grpcio IDLE (GOAWAY, connection lost)--> IDLE   (not a failure;
         connect() reconnects on the same transport at once)
    any --last handle released / channel closed--> SHUTDOWN

Backoff follows gRPC's connection-backoff rules (doc/connection-backoff.md):
1 s initial, x1.6, +-20 % jitter, 120 s cap (``grpc.initial_reconnect_backoff_ms``
and ``grpc.max_reconnect_backoff_ms`` override the first and the cap), and
grpcio enforces the 20 s minimum connect timeout
(``grpc.min_reconnect_backoff_ms``) on each attempt.

A retired transport is closed once the RPCs running on it have finished, so a
policy that lets go of a subchannel never cancels RPCs already sent on it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from pyxds import connectivity
from pyxds.channel import grpc_aio_twin
from pyxds.channel.aio_live_calls import any_referred, keep_until_freed, referred_calls
from pyxds.channel.aio_loop_end import at_loop_end
from pyxds.channel.loop_inbox import LoopInbox
from pyxds.clock import Clock, Timer
from pyxds.lb.api import OK_STATUS, ConnectivityState, Status, Subchannel
from pyxds.lb.unwatch import Watched
from pyxds.xds.backoff import ExponentialBackoff
from pyxds.xds.completion_reader import app_loop_bound
from pyxds.xds.stepped import Stepped

if TYPE_CHECKING:
    from pyxds.channel.aio_closing import ClosingTasks
    from pyxds.channel.orca_oob import OobStream
    from pyxds.serializer import WorkSerializer

_log = logging.getLogger(__name__)

#: gRPC connection backoff (doc/connection-backoff.md).
INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 120.0
MIN_CONNECT_TIMEOUT = 20.0
#: While an asyncio transport asks for a connection, it looks at its grpc.aio
#: channel at least this often (seconds): the sync monitor's cold period.
ASKED_LOOK = connectivity.COLD_PERIOD
_NEVER_IDLE_MS = 2**31 - 1

#: Options a pyxds channel never passes on to a subchannel's grpcio channel.
_OVERRIDDEN = frozenset(
    {
        "grpc.lb_policy_name",
        "grpc.service_config",
        "grpc.enable_retries",
        "grpc.client_idle_timeout_ms",
        "grpc.use_local_subchannel_pool",
        "grpc.service_config_disable_resolution",
    }
)

#: Options that decide a channel's ``:authority`` when the application gives them.
_AUTHORITY_OPTIONS = frozenset({"grpc.default_authority", "grpc.ssl_target_name_override"})

_GRPC_IDLE = grpc.ChannelConnectivity.IDLE
#: grpcio's states (singletons) by identity: a dict keyed by the enum members
#: themselves calls ``Enum.__hash__``, a Python frame, for every report
_FROM_GRPC = {
    id(grpc.ChannelConnectivity.IDLE): ConnectivityState.IDLE,
    id(grpc.ChannelConnectivity.CONNECTING): ConnectivityState.CONNECTING,
    id(grpc.ChannelConnectivity.READY): ConnectivityState.READY,
    id(grpc.ChannelConnectivity.TRANSIENT_FAILURE): ConnectivityState.TRANSIENT_FAILURE,
    id(grpc.ChannelConnectivity.SHUTDOWN): ConnectivityState.SHUTDOWN,
}


def _ended(wait: asyncio.Future[None]) -> None:
    """A watch's wait no one awaits any more, ended: its outcome read."""
    if not wait.cancelled():
        wait.exception()


#: At most this long, a pyxds.aio channel's close waits for its closed
#: transports' watches to end (:mod:`pyxds.channel.aio_closing`), a closed
#: transport's watch cancelled by its event loop's end
#: (``asyncio.run`` cancels every task) keeps the loop for its grpcio wait to
#: see the channel's SHUTDOWN (:meth:`AioTransport._watch`), and so does the
#: loop's end for a wait handed to it (:func:`_read_at_loop_end`): it comes
#: within ms once the channel's calls are freed; while one is still referred
#: to it cannot come, and none of them waits at all
#: (:mod:`pyxds.channel.aio_live_calls`)
SHUTDOWN_READ_WAIT = 0.1
#: Loop iterations such a watch lets the loop run before it concludes a call
#: of its channel is kept past the loop's end: the loop's end cancels the
#: other tasks with it, and one may let go of a call as it unwinds
LET_GO_TURNS = 5
#: After those iterations, a closed transport's watch its close cancelled
#: (a call referred to at the close) on a transport that ran a stream of
#: pyxds's own (health checks, ORCA OOB: :meth:`AioTransport.spawn`) gives
#: the calls this long more to be freed, looking every :data:`LET_GO_LOOK`:
#: such a stream, cancelled by the close, lets go of its call once grpcio
#: read the cancelled call's status, a completion away (1.3 ms, 24
#: iterations, seen under load); a call the application keeps costs that
#: transport's close this long
LET_GO_WAIT = 0.01
LET_GO_LOOK = 0.001
#: The message of the cancel of a closed transport's watch by its close
#: while a call is referred to on a transport that ran a stream of pyxds's
#: own (:meth:`AioTransport._channel_closed`)
CLOSE_STREAM_ENDING = "pyxds: a stream of the closed channel ends"
#: The message of the cancel of a closed transport's watch by its channel's
#: close that waited :data:`SHUTDOWN_READ_WAIT` for it: its wait goes to
#: the loop's end at once
CLOSE_GAVE_UP = "pyxds: the close does not wait for this watch"


async def calls_let_go(calls: tuple[Any, ...], wait: float = 0.0) -> bool:
    """Whether every one of a closed channel's ``calls`` (weak references) is
    freed (else C-core's channel cannot reach SHUTDOWN), within
    :data:`LET_GO_TURNS` loop iterations, then ``wait`` seconds more."""
    for _ in range(LET_GO_TURNS):
        if not any_referred(calls):
            return True
        await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while any_referred(calls):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(LET_GO_LOOK)
    return True


async def _read_shutdown(wait: _GrpcWait, calls: tuple[Any, ...], why: tuple[Any, ...]) -> None:
    """A closed transport's cancelled watch (the loop's end, or its close
    while a call was referred to: ``why`` is the cancel's arguments) lets
    its grpcio ``wait`` see the SHUTDOWN, at most :data:`SHUTDOWN_READ_WAIT`,
    once ``calls`` are let go (:func:`calls_let_go`); a second cancel (the
    channel's close gave up) ends it."""
    wait.future = ended = asyncio.get_running_loop().create_future()
    try:
        if await calls_let_go(calls, LET_GO_WAIT if why == (CLOSE_STREAM_ENDING,) else 0.0):
            await asyncio.wait((ended,), timeout=SHUTDOWN_READ_WAIT)  # (ended: no wait)
    except asyncio.CancelledError:
        pass


def _read_at_loop_end(wait: _GrpcWait, calls: tuple[Any, ...]) -> None:
    """Hand a closed channel's pending grpcio ``wait`` to its event loop's end
    (:mod:`pyxds.channel.aio_loop_end`), held by the wait itself: there, once
    the cancelled tasks let go of ``calls``, it reads the SHUTDOWN (at most
    :data:`SHUTDOWN_READ_WAIT`), else grpcio kept the watch for good; if the
    SHUTDOWN comes before, the hand-over is dropped."""
    future = wait.future = asyncio.get_running_loop().create_future()

    async def at_end() -> None:
        if not future.done() and await calls_let_go(calls):
            await asyncio.wait((future,), timeout=SHUTDOWN_READ_WAIT)

    drop = at_loop_end(at_end)

    def ended(_future: asyncio.Future[None]) -> None:
        _ended(future)
        drop()

    future.add_done_callback(ended)


class _GrpcWait(Stepped):
    """``channel.wait_for_state_change(state)`` run without a task
    (:class:`~pyxds.xds.stepped.Stepped`), ending :attr:`future` (a future
    of the running loop) as it ends.  Nothing cancels grpcio's wait: a task
    awaiting :attr:`future` may be cancelled (``asyncio.run``'s end cancels
    every task), which cancels that future only; grpcio's wait still ends
    with a change, and ends whichever future :attr:`future` is by then.
    A subclass rather than a ``then`` closure: ~150 bytes less per
    ``pyxds.aio`` connection."""

    __slots__ = ("future",)

    def __init__(self, channel: Any, state: grpc.ChannelConnectivity) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        super().__init__(channel.wait_for_state_change(state), _no_then)

    def _end(self, result: Any, error: BaseException | None) -> None:
        super()._end(result, error)
        future = self.future
        if future.done():
            return
        if error is None:
            future.set_result(None)
        elif isinstance(error, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(error)


def _no_then(_result: object, _error: BaseException | None) -> None:
    """(:class:`_GrpcWait` ends its future itself)"""


def _ignore_state(state: grpc.ChannelConnectivity) -> None:
    """A closed transport's ``on_state``: what it reports no longer matters.
    Dropping the owner's callback breaks the cycle transport -> callback ->
    owner's box -> transport, so a retired transport is freed at once, not at
    the next full garbage collection (issue 18: with 9000 refusing endpoints,
    one per failed attempt, and full collections of ~1 s every 2 s)."""


_IPV4 = socket.AF_INET
_IPV6 = socket.AF_INET6
_inet_pton = socket.inet_pton
_CHANNELZ_OFF = ("grpc.enable_channelz", 0)


def grpcio_target(address: str, options: Sequence[tuple[str, Any]] = ()) -> str:
    """The target a subchannel's grpcio channel is given for ``address``.

    An IP literal with a port (``127.0.0.1:80``, ``[::1]:80``, what EDS
    gives) goes to C-core's ``ipv4:``/``ipv6:`` resolver: the plain form
    goes through its dns resolver, which for a literal finds the same one
    address at a cost of ~25-35 us of C-core CPU per channel, and a failed
    attempt builds a new channel (issue 18: 9000 refusing endpoints).
    Nothing seen changes: C-core's default authority for ``ipv4:A`` and
    ``ipv6:A`` is ``A``, as for ``A`` (so the ``:authority`` of RPCs and the
    name TLS checks the server certificate against), and its errors name
    the resolved address, ``ipv4:A``, either way.  Anything else (a host
    name, an IPv6 zone, a target with a scheme, no port) keeps today's
    plain target, and so does every address of a channel whose options turn
    grpcio's channelz on, whose listing shows each channel's target."""
    host, sep, port = address.rpartition(":")
    if not (sep and port.isdigit() and port.isascii() and 0 < int(port) < 65536):
        return address
    if _CHANNELZ_OFF not in options:
        return address
    try:
        if host[:1] == "[" and host[-1:] == "]":
            _inet_pton(_IPV6, host[1:-1])
            return "ipv6:" + address
        _inet_pton(_IPV4, host)
    except (OSError, ValueError):
        return address
    return "ipv4:" + address


def subchannel_options(
    options: Sequence[tuple[str, Any]] | None, authority: str | None = None
) -> tuple[tuple[str, Any], ...]:
    """The grpcio channel options of a subchannel: the user's options (e.g.
    keepalive, message sizes, user agent) minus those that would make grpcio
    balance, retry, or go idle by itself, plus ours.

    ``authority``: the channel's default authority (its target's, e.g.
    ``name`` of ``xds:///name``, ``host:port`` of a dns target), given to
    each subchannel's grpcio channel as ``grpc.default_authority``, so that
    RPCs carry the ``:authority`` C-core's channel sends (not the endpoint's
    address, which the subchannel's own target would give) and TLS checks
    the server's name against it, as C-core's subchannels do (they take the
    channel's authority).  Not when the application gave
    ``grpc.default_authority`` (it passes through) or
    ``grpc.ssl_target_name_override`` (C-core's rule: the override is then
    the authority)."""
    out = [(k, v) for k, v in (options or ()) if k not in _OVERRIDDEN]
    if authority and not any(k in _AUTHORITY_OPTIONS for k, _ in out):
        out.append(("grpc.default_authority", authority))
    out += [
        ("grpc.lb_policy_name", "pick_first"),
        ("grpc.enable_retries", 0),
        ("grpc.service_config_disable_resolution", 1),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.client_idle_timeout_ms", _NEVER_IDLE_MS),
    ]
    keys = {k for k, _ in out}
    if "grpc.min_reconnect_backoff_ms" not in keys:
        out.append(("grpc.min_reconnect_backoff_ms", int(MIN_CONNECT_TIMEOUT * 1000)))
    if "grpc.enable_channelz" not in keys:
        # A subchannel's grpcio channel is no channel of the application's:
        # grpcio's channelz would list every one of them as a top-level
        # channel, at ~3.5 KB each (issue 18, memory per endpoint).
        out.append(("grpc.enable_channelz", 0))
    return tuple(out)


def backoff_from_options(options: Sequence[tuple[str, Any]] | None, rng: Any) -> ExponentialBackoff:
    """gRPC connection backoff, honouring grpcio's reconnect-backoff options."""
    return backoff_maker(options, rng)()


def backoff_maker(
    options: Sequence[tuple[str, Any]] | None, rng: Any
) -> Callable[[], ExponentialBackoff]:
    """Makes :func:`backoff_from_options`'s backoff, the options read once
    (a channel's subchannels share its options: one read per channel, not
    per endpoint)."""
    opts = dict(options or ())
    initial = float(opts.get("grpc.initial_reconnect_backoff_ms", INITIAL_BACKOFF * 1000)) / 1000
    maximum = float(opts.get("grpc.max_reconnect_backoff_ms", MAX_BACKOFF * 1000)) / 1000
    initial = max(initial, 0.001)
    maximum = max(maximum, initial)
    return functools.partial(ExponentialBackoff, rng, initial=initial, maximum=maximum)


class Closing(Protocol):
    """A connection being closed: ``close_done`` is set once it is gone (a
    :class:`Transport`, or an ORCA OOB side connection)."""

    @property
    def close_done(self) -> threading.Event: ...


class Transport(ABC):
    """One grpcio channel to one address.  ``on_state`` receives grpcio
    connectivity states from any thread.  Counts the RPCs running on it so
    that :meth:`retire` closes it only when they are done."""

    #: True for a grpc.aio channel (calls run as tasks on its event loop)
    runs_on_event_loop = False

    #: Guards ``_retired``/``closed``/``_close_done`` of every transport.
    #: Shared: it is taken only around a transport's retirement and close
    #: (an RPC takes it only on a retired transport), each a few bytecodes,
    #: never with another lock held; one lock per connection would be one
    #: more object per endpoint for the cyclic GC (issue 18).
    _lock = threading.Lock()

    # slots: a process may hold thousands (issue 18, memory per endpoint)
    __slots__ = (
        "_calls",
        "_retired",
        "closed",
        "active_seen",
        "callables",
        "_close_done",
        "_gone",
    )

    def __init__(self) -> None:
        #: one token per RPC running on it (``append``/``pop`` are atomic; a
        #: list, not a deque: an empty deque is ~760 bytes, one per endpoint)
        self._calls: list[None] = []
        self._retired = False
        self.closed = False
        self.active_seen = False
        self.callables: dict[Any, Any] = {}
        self._close_done: threading.Event | None = None  # made when someone waits
        self._gone = False

    @property
    def close_done(self) -> threading.Event:
        """Set once the grpcio channel is closed (its connections gone)."""
        with self._lock:
            if self._close_done is None:
                self._close_done = threading.Event()
                if self._gone:
                    self._close_done.set()
            return self._close_done

    def _closed_done(self) -> None:
        """The grpcio channel is closed."""
        with self._lock:
            self._gone = True
            event = self._close_done
        if event is not None:
            event.set()

    @property
    @abstractmethod
    def channel(self) -> Any:
        """The grpcio channel RPCs are sent on (None until created)."""

    @abstractmethod
    def connect(self) -> None: ...

    def suspect(self) -> None:  # noqa: B027 - a no-op unless the transport polls
        """An RPC failed UNAVAILABLE on this transport: its connection may be
        gone.  A polled transport checks at once (an event-driven one
        already knows)."""

    def ready_now(self) -> bool:
        """Whether its grpcio channel is READY at this moment (a polled
        transport may not have reported a change yet); False when unknown."""
        return False

    @abstractmethod
    def _close_now(self) -> None: ...

    def authority_channel(self, authority: str) -> Any:
        """A ``grpc.aio`` channel to this transport's destination whose calls
        carry ``authority`` (A81; :mod:`pyxds.channel.grpc_authority`): an
        event-loop transport's only (a sync one sets the host per call)."""
        raise NotImplementedError

    def aio_twin(self) -> Callable[[], Any] | None:
        """A maker of a ``grpc.aio`` channel to this transport's destination
        (same address, credentials and options; on this transport's own
        connection where grpcio allows, :mod:`pyxds.channel.grpc_aio_twin`)
        for a stream that must cost no thread of its own
        (:mod:`pyxds.channel.orca_oob`); None when this transport has none
        (it runs on an event loop already)."""
        return None

    # Counting RPCs takes no lock while the transport is not retired (every
    # RPC passes here twice): the ClusterRef handshake.  An RPC adds its
    # token, then reads ``_retired``; retire() sets ``_retired``, then counts
    # the tokens under the lock.  Whichever comes second sees the other, so a
    # transport is closed exactly once, by whoever sees it retired with no
    # RPC left, and never under an RPC that was told it started.
    @property
    def calls_running(self) -> int:
        """RPCs counted as started on it and not finished."""
        return len(self._calls)

    def call_started(self) -> bool:
        """Count an RPC; False when the transport is already closed."""
        self._calls.append(None)
        if self._retired:
            with self._lock:
                if self.closed:
                    self._calls.pop()
                    return False
        return True

    def call_finished(self) -> None:
        calls = self._calls
        calls.pop()
        if not self._retired:
            return
        with self._lock:
            close = not calls and not self.closed
            if close:
                self.closed = True
        if close:
            self._close_now()

    def retire(self, force: bool = False) -> None:
        """Close now if idle (or ``force``), else when the last RPC ends."""
        with self._lock:
            self._retired = True
            close = (force or not self._calls) and not self.closed
            if close:
                self.closed = True
        if close:
            self._close_now()


class PolledTransport(Transport):
    """A sync grpcio channel whose connectivity a
    :class:`~pyxds.connectivity.ConnectivityMonitor` polls (no thread of its
    own; see that module for when it is checked), closed on the monitor's
    timer thread (never on the serializer, never on a thread of its own)."""

    __slots__ = ("_channel", "_on_state", "_monitor", "_watch")

    def __init__(
        self,
        channel: grpc.Channel,
        on_state: Callable[[grpc.ChannelConnectivity], None],
        monitor: connectivity.ConnectivityMonitor[int],
    ) -> None:
        super().__init__()
        self._channel = channel
        self._on_state = on_state
        self._monitor = monitor
        # A TRANSIENT_FAILURE retires the transport (SubchannelCore._fail):
        # nothing it reports afterwards matters, so it is not checked again.
        self._watch = connectivity.watch_channel_codes(
            channel, self, monitor, until=grpc.ChannelConnectivity.TRANSIENT_FAILURE
        )

    @property
    def channel(self) -> grpc.Channel:
        return self._channel

    def __call__(self, code: int) -> None:
        """The monitor's report of C-core's state ``code`` for this channel.
        The transport hears it itself: no bound method and adapter per
        connection (issue 18: objects per endpoint the cyclic GC walks)."""
        if not self.closed:
            self._on_state(connectivity.BY_CODE[code])

    def connect(self) -> None:
        if self.closed:
            return
        # asked again at each check until seen out of IDLE: a connection
        # made and GOAWAYed between two checks is not waited for forever
        # (pyxds.connectivity rule 7)
        self._watch.connect()

    def suspect(self) -> None:
        self._watch.check_now()

    def ready_now(self) -> bool:
        return not self.closed and connectivity.is_ready(self._channel)

    def _close_now(self) -> None:
        self._watch.cancel()
        self._on_state = _ignore_state  # its owner's closure refers back to it
        self._monitor.close_soon(self._close_channel)

    def _close_channel(self) -> None:
        try:
            self._channel.close()
        finally:
            self._closed_done()


class SyncTransport(PolledTransport):
    """A ``grpc.Channel`` to one address, on the process's monitor."""

    __slots__ = ("_args",)

    def __init__(
        self,
        address: str,
        credentials: grpc.ChannelCredentials | None,
        options: Sequence[tuple[str, Any]],
        compression: grpc.Compression | None,
        on_state: Callable[[grpc.ChannelConnectivity], None],
    ) -> None:
        target = grpcio_target(address, options)
        options = grpc_aio_twin.transport_options(options)  # its twin may share it
        if credentials is None:
            channel = grpc.insecure_channel(target, options, compression)
        else:
            channel = grpc.secure_channel(target, credentials, options, compression)
        super().__init__(channel, on_state, connectivity.monitor())
        self._args = (target, credentials, options, compression)

    def aio_twin(self) -> Callable[[], Any]:
        target, credentials, options, compression = self._args
        # on this channel's own connection where grpcio allows (A51, as C-core):
        # the same target and arguments, so the same C-core subchannel
        return functools.partial(grpc_aio_twin.twin, target, credentials, options, compression)


class AioTransport(Transport):
    """A ``grpc.aio.Channel`` to one address, bound to one event loop.
    Created and watched on that loop (``wait_for_state_change``); calls from
    other threads are posted to it through ``inbox`` (one wake-up of the
    loop per batch: the channel's transports share one).

    ``prepare`` runs on the loop just before its channel is made (the
    channel's hold on grpcio's asyncio engine, :mod:`pyxds.channel.aio_engine`)
    and ``connect=True`` asks for the connection as the channel is made: a
    transport made and connected from another thread (an xDS update's
    subchannel, :meth:`SubchannelCore.connect`) then goes to the loop in
    one hop, not three.  Each hop wakes the loop, whose thread then takes
    the GIL from the poster for that callable alone (measured on the first
    ``xds:///`` RPC of ``pyxds.aio``: the engine, the channel and the
    connection each in a hop of its own)."""

    runs_on_event_loop = True

    __slots__ = (
        "_loop",
        "_inbox",
        "_args",
        "_on_state",
        "_channel",
        "_watcher",
        "_want_connect",
        "_made_to_connect",
        "_prepare",
        "_asked",
        "_by_authority",
        "_closed_calls",
        "_closing",
        "_streamed",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        address: str,
        credentials: grpc.ChannelCredentials | None,
        options: Sequence[tuple[str, Any]],
        compression: grpc.Compression | None,
        on_state: Callable[[grpc.ChannelConnectivity], None],
        inbox: LoopInbox | None = None,
        closing: ClosingTasks | None = None,
        prepare: Callable[[], None] | None = None,
        connect: bool = False,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._inbox = inbox if inbox is not None and inbox.loop is loop else LoopInbox(loop)
        self._args = (grpcio_target(address, options), credentials, options, compression)
        self._on_state = on_state
        self._channel: Any = None
        self._watcher: asyncio.Task[None] | None = None
        self._want_connect = connect
        #: made with ``connect=True`` and not connect()ed since: the
        #: connect() that follows the making asks for nothing more
        self._made_to_connect = connect
        self._prepare = prepare
        #: a connection was asked for and the watch has not seen the channel
        #: out of IDLE since (read and written on the loop only)
        self._asked = False
        #: A81: the channels of attempts with an authority of their own
        self._by_authority: dict[str, Any] | None = None
        #: the channel's calls when it was closed (weak references; None:
        #: its close has not run)
        self._closed_calls: tuple[Any, ...] | None = None
        #: its channel's tasks of closing transports (its close awaits them)
        self._closing = closing
        #: a stream of pyxds's own ran on it (:meth:`spawn`)
        self._streamed = False
        self._inbox.run(self._create)

    @property
    def channel(self) -> Any:
        return self._channel

    def _create(self) -> None:
        if self.closed:
            return
        if self._prepare is not None:
            self._prepare()
        target, credentials, options, compression = self._args
        self._channel = grpc_aio_twin.public_channel(target, credentials, options, compression)
        keep_until_freed(self._channel)
        app_loop_bound(self._loop)  # grpcio bound this loop: it reads the completions
        self._watcher = self._loop.create_task(self._watch())
        if self._want_connect:
            self._ask()

    def _ask(self) -> None:
        """Ask the channel to connect (on the loop); the watch asks again
        each time it looks until it sees the channel out of IDLE: a
        connection made and GOAWAYed before it looks leaves the channel IDLE
        as it was, and its owner waiting (the sync transports'
        :mod:`pyxds.connectivity` rule 7).  While it asks, it looks at least
        every :data:`ASKED_LOOK` seconds, woken or not: under load (the
        whole machine starved) a channel was seen IDLE with its
        ``wait_for_state_change`` pending 3.6 s after an ask, where C-core
        leaves IDLE within ~30 ms of one; the sync monitor's checks bound
        the same case by its cold period."""
        self._asked = True
        self._channel.get_state(try_to_connect=True)

    async def _watch(self) -> None:
        """Report each state the channel is seen in.  A wait for a change
        is never cancelled while its state is current (TRAPS: grpcio keeps
        C-core's watch of a cancelled ``wait_for_state_change`` until the
        state changes, and strands it for good when its channel was the
        process's last ``grpc.aio`` one): a timed look leaves the wait
        pending and reads the state beside it; a wait on a state the look
        saw end is left to end by itself (C-core's watch fires at once);
        the transport's close ends the last wait with SHUTDOWN.  grpcio's
        wait runs without a task (:class:`_GrpcWait`), so that cancelling
        this task cancels only its await: when its loop ends
        (``asyncio.run`` cancels every task, then closes the loop) a closed
        transport's watch lets its wait see the SHUTDOWN first (at most
        :data:`SHUTDOWN_READ_WAIT`: C-core's channel shuts down once its
        calls are freed), else that completion came for a closed loop and
        grpcio kept the watch for good; while a call of the channel is
        still referred to (the application returns it from
        ``asyncio.run``, or a task holds it that the loop's end cancels
        later), the SHUTDOWN cannot come yet, and it returns at once,
        handing the wait to the loop's end (:func:`_read_at_loop_end`).
        Its transport's close cancels it the same way while a call is
        referred to (:meth:`_channel_closed`); cancelled by its channel's
        close that waited for it (:data:`CLOSE_GAVE_UP`), it hands the wait
        over at once."""
        channel = self._channel
        wait: _GrpcWait | None = None  # grpcio's current wait
        waited = _GRPC_IDLE  # the state it waits on
        try:
            while not self.closed:
                asked = self._asked
                state = channel.get_state(try_to_connect=asked)
                if asked and state is not _GRPC_IDLE:
                    self._asked = False
                self._on_state(state)  # (its owner may ask for a connection in it)
                if wait is not None and (wait.done or waited is not state):
                    wait.future.add_done_callback(_ended)  # not cancelled: see above
                    wait = None
                if wait is None:
                    wait = _GrpcWait(channel, state)
                    waited = state
                if self._asked:  # (only while a connection is asked for: a timer)
                    await asyncio.wait((wait.future,), timeout=ASKED_LOOK)
                else:
                    await wait.future
        except asyncio.CancelledError as cancel:
            if self.closed and wait is not None and not wait.done:
                calls = self._closed_calls
                if cancel.args != (CLOSE_GAVE_UP,):
                    await _read_shutdown(wait, calls or referred_calls(channel), cancel.args)
                if calls is not None and not wait.done:  # (closed: its SHUTDOWN comes)
                    _read_at_loop_end(wait, calls)
                    return
        except Exception:
            pass
        if wait is not None:
            wait.future.add_done_callback(_ended)  # its outcome read, now or when it ends

    def _close_channel(self, channel: Any) -> None:
        """``channel.close()`` (on the loop, without a task: grpc.aio's close
        with no grace ends in its first step), its calls taken first (the
        close forgets them); then :meth:`_channel_closed`."""
        self._closed_calls = referred_calls(channel)
        Stepped(channel.close(), self._channel_closed)

    def _channel_closed(self, _result: object, _error: BaseException | None) -> None:
        """C-core's SHUTDOWN ends the watch's wait within ms once the closed
        channel's calls are freed: the watch joins its channel's closing
        tasks (the channel's close waits for it, :data:`SHUTDOWN_READ_WAIT`
        at most).  While one is referred to it cannot come: the watch is
        cancelled at once, and reads the SHUTDOWN only if the calls are let
        go within :data:`LET_GO_TURNS` loop iterations (and
        :data:`LET_GO_WAIT` when a stream of pyxds's own ran on it: the
        close cancelled it), else hands its wait to the loop's end
        (:meth:`_watch`)."""
        watcher = self._watcher
        if watcher is None or watcher.done():
            return
        if any_referred(self._closed_calls or ()):
            watcher.cancel(CLOSE_STREAM_ENDING if self._streamed else None)
        if self._closing is not None:
            self._closing.add(watcher)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task on its loop for a stream of pyxds's own on its channel
        (:mod:`pyxds.channel.subchannel_stream`: health checks, ORCA OOB)."""
        self._streamed = True
        return self._loop.create_task(coro)

    def connect(self) -> None:
        if self._made_to_connect:  # the call that follows its making: _create asks
            self._made_to_connect = False
            return
        self._want_connect = True
        if self._channel is None:
            # not made yet: _create, queued on the loop, connects it (it
            # sets the channel before it reads the wish, this reads the
            # channel after setting the wish: one of the two sees the other)
            return

        def go() -> None:
            if self._channel is not None and not self.closed:
                self._ask()

        self._inbox.run(go)

    def authority_channel(self, authority: str) -> Any:
        """See :meth:`Transport.authority_channel` (made on the event loop,
        where attempts start; closed with the transport)."""
        channels = self._by_authority
        if channels is None:
            channels = self._by_authority = {}
        channel = channels.get(authority)
        if channel is None:
            from pyxds.channel.grpc_authority import aio_channel

            target, credentials, options, compression = self._args
            channel = aio_channel(target, credentials, options, compression, authority)
            keep_until_freed(channel)
            channels[authority] = channel
        return channel

    def _close_now(self) -> None:
        def go() -> None:
            # the watch is not cancelled: the close ends its wait (SHUTDOWN)
            # and it stops (``_watch``)
            if self._channel is not None:
                self._close_channel(self._channel)
            for channel in (self._by_authority or {}).values():
                Stepped(channel.close(), _no_then)

        self._on_state = _ignore_state  # its owner's closure refers back to it
        self._inbox.run(go)
        self._closed_done()  # closes on its event loop; nothing to wait for here


TransportFactory = Callable[
    [str, "grpc.ChannelCredentials | None", Callable[[grpc.ChannelConnectivity], None]],
    Transport,
]


class _TransportReports:
    """A transport's connectivity reports to its subchannel core: called on
    any thread, applied on the serializer, where ``transport`` is set by
    then (a transport may report while it is being made).  One slotted
    object per connection, not a closure with its cells (issue 18: objects
    per endpoint the cyclic GC walks)."""

    __slots__ = ("core", "transport")

    def __init__(self, core: SubchannelCore) -> None:
        self.core = core
        self.transport: Transport | None = None

    def __call__(self, connectivity: grpc.ChannelConnectivity) -> None:
        core = self.core
        core._serializer.run(functools.partial(core._apply_report, self, connectivity))


class SubchannelCore(Watched):
    """The channel's shared connection to one address (see module doc).
    Its watchers: usually one (lb/unwatch.py ``Watched``: no list)."""

    __slots__ = (
        "address",
        "key",
        "_make_transport",
        "_credentials",
        "_serializer",
        "_clock",
        "_backoff",
        "state",
        "status",
        "transport",
        "_backoff_timer",
        "_attempt_started",
        "refs",
        "failure_detail",
        "security_info",
        "orca_oob",
        "_failed_status",
    )

    def __init__(
        self,
        address: str,
        key: Any,
        make_transport: TransportFactory,
        credentials: grpc.ChannelCredentials | None,
        serializer: WorkSerializer,
        clock: Clock,
        backoff: ExponentialBackoff,
    ) -> None:
        self.address = address
        self.key = key
        self._make_transport = make_transport
        self._credentials = credentials
        self._serializer = serializer
        self._clock = clock
        self._backoff = backoff
        self.state = ConnectivityState.IDLE
        self.status = OK_STATUS
        self.transport: Transport | None = None
        self._backoff_timer: Timer | None = None
        self._attempt_started = 0.0
        self._watchers = None
        self.refs = 0
        #: Why the last attempt failed, when the transport knows (the A29 TLS relay).
        self.failure_detail: Callable[[], str | None] | None = None
        #: The ORCA out-of-band stream manager, made on first use by
        #: :func:`pyxds.channel.orca_oob.oob_stream_of`.
        self.orca_oob: OobStream | None = None
        #: The TLS relay's view for config_dump (A29), when there is one.
        self.security_info: Callable[[], dict[str, Any]] | None = None
        #: the last failed attempt's status, reused while its text is the
        #: same (one object per endpoint, not one per failed attempt)
        self._failed_status: Status | None = None

    # -- serializer-side API -------------------------------------------
    def watch(self, fn: Callable[[ConnectivityState, Status], None]) -> Callable[[], None]:
        unwatch = self._add_watcher(fn)
        fn(self.state, self.status)
        return unwatch

    def connect(self) -> None:
        if self.state is not ConnectivityState.IDLE:
            return
        self._attempt_started = self._clock.now()
        transport = self.transport
        if transport is not None and not transport.closed:
            transport.connect()
            return
        reports = _TransportReports(self)
        transport = self._make_transport(self.address, self._credentials, reports)
        reports.transport = transport
        self.transport = transport
        # The connection is asked for before CONNECTING goes up the LB tree
        # (every policy's report and a new picker, ~0.1-0.2 ms of Python):
        # C-core's connect runs on its own threads meanwhile (issue 18: an
        # RPC on a ring_hash endpoint not yet connected waits for both).
        # Off the serializer a report may already have been applied.
        transport.connect()
        if self.transport is transport and self.state is ConnectivityState.IDLE:
            self._set_state(ConnectivityState.CONNECTING, OK_STATUS)
        # One endpoint of an update that may connect thousands: a long one
        # holds the collector off (pyxds.gc_hold).
        self._serializer.bulk_progress()

    def reset_backoff(self) -> None:
        self._backoff.reset()
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
            self._backoff_timer = None
            self._set_state(ConnectivityState.IDLE, OK_STATUS)

    def drained(self) -> bool:
        """Shut down with no transport left open."""
        transport = self.transport
        return transport is None or transport.closed

    def shutdown(self, force: bool = False) -> None:
        if self.state is ConnectivityState.SHUTDOWN:
            if force and self.transport is not None:
                self.transport.retire(force=True)
            return
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
            self._backoff_timer = None
        self.state = ConnectivityState.SHUTDOWN
        self._watchers = None
        oob = getattr(self, "orca_oob", None)  # pyxds.channel.orca_oob, if used
        if oob is not None:
            oob.close()
        if self.transport is not None:
            self.transport.retire(force=force)

    # -- grpcio reports (marshalled onto the serializer) ----------------
    def _apply_report(
        self, reports: _TransportReports, connectivity: grpc.ChannelConnectivity
    ) -> None:
        transport = reports.transport
        if transport is not self.transport or self.state is ConnectivityState.SHUTDOWN:
            return  # a retired transport's late report
        state = _FROM_GRPC.get(id(connectivity))
        if state is None or state is ConnectivityState.SHUTDOWN:
            return
        if transport is not None and state is not ConnectivityState.IDLE:
            transport.active_seen = True
        if state is ConnectivityState.READY:
            self._backoff.reset()
            self._set_state(state, OK_STATUS)
        elif state is ConnectivityState.CONNECTING:
            self._set_state(state, OK_STATUS)
        elif state is ConnectivityState.IDLE:
            # grpcio's first report on a new transport is the IDLE it starts
            # in, possibly after our connect(): only an IDLE that follows
            # activity (a READY connection lost, a GOAWAY) is news.
            if transport is not None and transport.active_seen:
                self._set_state(state, OK_STATUS)
            return
        else:  # TRANSIENT_FAILURE: retire the transport, back off, then IDLE
            self._fail()

    def _fail(self) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.retire()
        # The next attempt is due one backoff delay after this one *started*
        # (connection-backoff.md ConnectWithBackoff; C-core Subchannel).
        elapsed = self._clock.now() - self._attempt_started
        delay = max(0.0, self._backoff.next_delay() - elapsed)
        text = f"failed to connect to {self.address}"
        detail = self.failure_detail() if self.failure_detail is not None else None
        if detail:
            text = f"{text}: {detail}"
        # The same failure again is the same (immutable) status: every
        # attempt's new Status lived through its backoff, into the oldest
        # GC generation (issue 18: 9000 refusing endpoints).
        status = self._failed_status
        if status is None or status.details != text:
            status = self._failed_status = Status(grpc.StatusCode.UNAVAILABLE, text)
        self._set_state(ConnectivityState.TRANSIENT_FAILURE, status)
        self._backoff_timer = self._clock.call_later(delay, self._backoff_done)

    def _backoff_done(self) -> None:
        self._backoff_timer = None
        if self.state is ConnectivityState.TRANSIENT_FAILURE:
            self._set_state(ConnectivityState.IDLE, OK_STATUS)

    def _set_state(self, state: ConnectivityState, status: Status) -> None:
        if state is self.state and status == self.status:
            return
        self.state, self.status = state, status
        for fn in self._watching():
            try:
                fn(state, status)
            except Exception:
                _log.exception("pyxds: subchannel watcher raised")


class ChannelSubchannel(Subchannel):
    """What ``Helper.create_subchannel`` returns: one policy's handle on a
    shared :class:`SubchannelCore`.  ``shutdown()`` drops this handle's
    watchers and its reference; the core closes with the last reference."""

    __slots__ = ("address", "attributes", "core", "_release", "_unwatchers", "_shut")

    def __init__(
        self,
        core: SubchannelCore,
        attributes: Mapping[str, Any],
        release: Callable[[SubchannelCore], None],
    ) -> None:
        self.address = core.address
        self.attributes = attributes
        self.core = core
        self._release = release
        #: what shutdown() undoes: None, one handle (usually: its policy's
        #: one watcher; no list per endpoint, issue 18) or a list of them
        self._unwatchers: Callable[[], None] | list[Callable[[], None]] | None = None
        self._shut = False

    @property
    def state(self) -> ConnectivityState:
        return ConnectivityState.SHUTDOWN if self._shut else self.core.state

    def connect(self) -> None:
        if not self._shut:
            self.core.connect()

    def watch_state(self, fn: Callable[[ConnectivityState, Status], None]) -> Callable[[], None]:
        if self._shut:
            return lambda: None
        unwatch = self.core.watch(fn)
        self._keep(unwatch)
        return unwatch

    def reset_backoff(self) -> None:
        if not self._shut:
            self.core.reset_backoff()

    def watch_orca_oob(
        self,
        period: float,
        fn: Callable[[Any], None],
        on_unimplemented: Callable[[str], None] | None = None,
    ) -> Callable[[], None]:
        """Subscribe ``fn`` to this subchannel's out-of-band ORCA reports,
        asking for one every ``period`` seconds (gRFC A51; one stream per
        connection shared by every subscriber, :mod:`pyxds.channel.orca_oob`);
        ``on_unimplemented(details)``: the backend does not serve
        OpenRcaService on this connection.  Returns the unsubscribe; this
        handle's ``shutdown()`` unsubscribes too."""
        if self._shut:
            return lambda: None
        from pyxds.channel.orca_oob import oob_stream_of

        cancel = oob_stream_of(self.core).add(period, fn, on_unimplemented)
        self._keep(cancel)
        return cancel

    def _keep(self, undo: Callable[[], None]) -> None:
        kept = self._unwatchers
        if kept is None:
            self._unwatchers = undo
        elif isinstance(kept, list):
            kept.append(undo)
        else:
            self._unwatchers = [kept, undo]

    def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        kept, self._unwatchers = self._unwatchers, None
        if isinstance(kept, list):
            for unwatch in kept:
                unwatch()
        elif kept is not None:
            kept()
        self._release(self.core)

    def __repr__(self) -> str:
        return f"ChannelSubchannel({self.address!r}, {self.state.name})"


def core_of(subchannel: Any) -> SubchannelCore | None:
    """The core behind a picked subchannel, unwrapping policies' wrappers
    (a wrapper exposes the wrapped subchannel as ``subchannel``,
    ``delegate``, ``wrapped`` or ``inner``)."""
    for _ in range(8):
        core = getattr(subchannel, "core", None)
        if isinstance(core, SubchannelCore):
            return core
        for name in ("subchannel", "delegate", "wrapped", "inner", "_subchannel", "_delegate"):
            inner = getattr(subchannel, name, None)
            if inner is not None and inner is not subchannel:
                subchannel = inner
                break
        else:
            return None
    return None
