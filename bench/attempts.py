"""Python calls and instructions per failed connection attempt: deterministic
counts of pyxds's own work for one refused attempt, through the xDS LB tree.

The channel is a real ``ChannelCore`` on an ``xds:///`` target: the real xDS
resolver, a real control plane (``pyxds.server``, in this process) and the
real LB tree it builds (cds -> outlier_detection -> xds_cluster_impl ->
xds_override_host -> priority -> xds_wrr_locality -> weighted_target ->
round_robin -> pick_first per endpoint), the real subchannel cores and
work serializer.  Only two things are stand-ins, so that every round does
exactly the same work: the transports (no grpcio channel: ``--good`` of
them report READY, the ``--refusing`` others fail every attempt, delivered
as the connectivity monitor delivers a grpcio TRANSIENT_FAILURE) and the
clock (a :class:`~pyxds.testing.FakeClock` whose due timers go through the
channel's serializer, as a :class:`~pyxds.clock.RealClock`'s do).  What
grpcio and the monitor cost per attempt is not in these counts
(``bench/refusing.py`` has the whole).

One round: every refusing endpoint's attempt fails (its report), then the
clock moves past the (fixed, ``--backoff``) backoff: each subchannel goes
IDLE, its pick_first asks for a connection, a new transport is made and
CONNECTING goes up the tree.  That is one failed attempt per refusing
endpoint and the three reports the LB tree sees for it (TRANSIENT_FAILURE,
IDLE, CONNECTING).  Counted over ``--rounds`` rounds after ``--warm`` rounds:

* ``py calls``: Python function calls (``sys.setprofile`` "call" events) per
  attempt, ``C calls``: calls of C functions from Python;
* ``instructions`` (``--instructions``): the calling thread's instructions
  per attempt under ``valgrind --tool=callgrind`` (everything runs on it).

``--outlier`` configures outlier_detection on the cluster (its ejection
timer runs every 10 s of fake time; with a 1 s backoff ~1 in 10 rounds
has it).  ``--profile N`` prints the N functions called most per attempt.

Usage: python bench/attempts.py [--good 10] [--refusing 100] [--rounds 20]
       [--warm 3] [--outlier] [--profile 30] [--instructions]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CLUSTER = "attempts"


def _world(good: int, refusing: int, outlier: bool) -> tuple[Any, dict[str, Any]]:
    from refusing import one_cluster

    from pyxds.server import ManagementServer
    from pyxds.server import builders as b

    addresses = [f"127.0.0.1:{20000 + i}" for i in range(good)]
    addresses += [f"127.0.0.12:{20000 + i}" for i in range(refusing)]
    localities = [
        b.locality(zone=f"z{i}", endpoints=addresses[i::5]) for i in range(5) if addresses[i::5]
    ]
    cluster = b.cluster(CLUSTER)
    if outlier:
        cluster.outlier_detection.SetInParent()
    control = ManagementServer().start()
    control.set_snapshot(one_cluster(cluster, localities))
    return control, control.bootstrap(node_id="attempts")


class Attempts:
    """The channel over stand-in transports (module docstring)."""

    def __init__(self, good: int, refusing: int, outlier: bool, backoff: float) -> None:
        import grpc

        from pyxds.channel.core import ChannelCore
        from pyxds.channel.subchannel import Transport
        from pyxds.clock import Timer
        from pyxds.testing import FakeClock

        self.control, bootstrap = _world(good, refusing, outlier)
        self.backoff = backoff
        #: the transports of the attempts in flight, by address
        self.current: dict[str, Any] = {}
        current = self.current
        made = [0]

        class StandIn(Transport):
            __slots__ = ("on_state", "address")

            def __init__(self, address: str, on_state: Callable[[Any], None]) -> None:
                super().__init__()
                self.address = address
                self.on_state = on_state

            @property
            def channel(self) -> Any:
                return None

            def connect(self) -> None:
                if self.address.startswith("127.0.0.1:"):
                    self.on_state(grpc.ChannelConnectivity.READY)
                else:
                    current[self.address] = self

            def _close_now(self) -> None:
                self._closed_done()

        def make_transport(address: str, _credentials: Any, on_state: Any) -> Transport:
            made[0] += 1
            return StandIn(address, on_state)

        self.made = made
        holder: list[Any] = []

        class SerializedClock(FakeClock):
            """Due timers run through the channel's serializer (RealClock's dispatch)."""

            def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
                def run() -> None:
                    if not timer.cancelled:
                        fn()

                timer = super().call_later(delay, lambda: holder[0].run(run))
                return timer

        self.clock = SerializedClock()
        ms = int(backoff * 1000)
        self.core = ChannelCore(
            f"xds:///{CLUSTER}",
            make_transport,
            bootstrap=bootstrap,
            options=[
                ("grpc.initial_reconnect_backoff_ms", ms),
                ("grpc.max_reconnect_backoff_ms", ms),
            ],
            rng=random.Random(7),
            clock=self.clock,
        )
        holder.append(self.core.serializer)
        self.core.exit_idle()
        deadline = time.monotonic() + 300  # (valgrind on a loaded machine)
        while len(current) < refusing:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(current)} of {refusing} endpoints connecting")
            time.sleep(0.01)
        # the rounds must run on this thread: wait until the xDS client's
        # thread has no more work for the channel (its last update applied)
        while not self._settled():
            if time.monotonic() > deadline:
                raise RuntimeError("the channel's serializer never settled")
            time.sleep(0.05)
        self.grpc_tf = grpc.ChannelConnectivity.TRANSIENT_FAILURE

    def _settled(self) -> bool:
        """Whether a callback submitted now runs at once on this thread."""
        import threading

        me = threading.get_ident()
        ran_on: list[int] = []
        self.core.serializer.run(lambda: ran_on.append(threading.get_ident()))
        return ran_on == [me]

    def round(self) -> int:
        """Every attempt in flight fails; the backoffs end and the next begin."""
        if not self._settled():
            raise RuntimeError("another thread works on the channel: the counts would miss it")
        failing = list(self.current.values())
        self.current.clear()
        tf = self.grpc_tf
        for transport in failing:
            transport.on_state(tf)
        self.clock.advance(self.backoff * 1.25)
        return len(failing)

    def close(self) -> None:
        self.core.close()
        self.control.stop()


def _counted(attempts: Attempts, rounds: int, profile: int) -> dict[str, float]:
    calls = collections.Counter[str]()
    totals = [0, 0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            totals[0] += 1
            if profile:
                code = frame.f_code
                calls[f"{os.path.basename(code.co_filename)}:{code.co_name}"] += 1
        elif event == "c_call":
            totals[1] += 1
            if profile:
                calls[f"<C> {getattr(arg, '__qualname__', arg)}"] += 1

    n = 0
    sys.setprofile(count)
    try:
        for _ in range(rounds):
            n += attempts.round()
    finally:
        sys.setprofile(None)
    out = {"attempts": n, "py_calls": totals[0] / n, "c_calls": totals[1] / n}
    if profile:
        for name, k in calls.most_common(profile):
            print(f"  {k / n:7.2f}  {name}")
    return out


def _run(args: argparse.Namespace) -> None:
    try:
        attempts = Attempts(args.good, args.refusing, args.outlier, args.backoff)
    except RuntimeError as err:  # the xDS client's threads would keep the process
        print(f"attempts.py: {err}", file=sys.stderr, flush=True)
        os._exit(1)
    for _ in range(args.warm):
        attempts.round()
    if args.callgrind:
        print("READY", flush=True)
        sys.stdin.readline()
        n = sum(attempts.round() for _ in range(args.rounds))
        print("DONE", flush=True)
        sys.stdin.readline()
        print(json.dumps({"attempts": n}), file=sys.stderr, flush=True)
    else:
        print(json.dumps(_counted(attempts, args.rounds, args.profile)), flush=True)
    attempts.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--good", type=int, default=10)
    parser.add_argument("--refusing", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--backoff", type=float, default=1.0)
    parser.add_argument("--outlier", action="store_true")
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--callgrind", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.instructions:
        _run(args)
        return
    import rpc_instructions
    from rpc_instructions import counted

    rpc_instructions.KEEP = bool(os.environ.get("KEEP_CALLGRIND"))

    env = dict(os.environ, PYTHONMALLOC="malloc")
    argv = [a for a in sys.argv[1:] if a != "--instructions"]
    _total, calling = counted("attempts", [__file__, "--callgrind", *argv], env)
    n = args.rounds * args.refusing
    print(json.dumps({"attempts": n, "instructions": calling / n}))


if __name__ == "__main__":
    main()
