"""``pyxds demo``: the whole stack on loopback, with a printed timeline.

It starts a pyxds.server control plane and real grpcio backends, opens
``pyxds.insecure_channel("xds:///greeter")`` and walks through what pyxds
does: a 75/25 traffic split from RDS (A28), priority failover when every
priority-0 backend dies and fail-back when they return (A56), a route
switched to another cluster under continuous load with no failed RPC (A74),
outlier detection ejecting a failing backend (A50), and a route retry policy
hiding a failing backend (A44: failures before the control plane pushes it,
none after).  Every number printed is measured in this run.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from pyxds.cli.backends import DEMO_METHOD, NamedBackend
from pyxds.server import ManagementServer, Snapshot
from pyxds.server import builders as b

if TYPE_CHECKING:
    from pyxds.channel.channel import XdsChannel

SERVICE = "greeter"
STEPS = 7


class Progress:
    """What the live view is told (the plain timeline ignores it)."""

    def step(self, number: int, title: str) -> None:
        """Step ``number`` of :data:`STEPS` started."""

    def traffic(self, counts: collections.Counter[str]) -> None:
        """RPCs seen so far in the current step, by backend (or ``error CODE``)."""


def _snapshot(
    main: list[NamedBackend], fallback: NamedBackend, canary: NamedBackend, split: dict[str, int]
) -> Snapshot:
    return Snapshot(
        listeners=[b.listener(SERVICE, route_config_name=f"{SERVICE}-route")],
        routes=[
            b.route_config(
                f"{SERVICE}-route",
                [
                    b.virtual_host(
                        "greeter", [SERVICE], [b.route(prefix="", weighted_clusters=split)]
                    )
                ],
            )
        ],
        clusters=[b.cluster("main"), b.cluster("canary")],
        endpoints=[
            b.endpoints(
                "main",
                [
                    b.locality(zone="zone-a", priority=0, endpoints=[x.address for x in main]),
                    b.locality(zone="zone-b", priority=1, endpoints=[fallback.address]),
                ],
            ),
            b.endpoints("canary", [b.locality(zone="zone-c", endpoints=[canary.address])]),
        ],
    )


class _Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.start:7.3f}s]"


def _count(
    call: Callable[[], bytes], n: int, progress: Progress | None = None
) -> collections.Counter[str]:
    seen: collections.Counter[str] = collections.Counter()
    for i in range(n):
        try:
            seen[call().decode()] += 1
        except grpc.RpcError as err:
            seen[f"error {err.code().name}"] += 1
        if progress is not None and (i % 50 == 49 or i == n - 1):
            progress.traffic(seen)
    return seen


def _outlier_snapshot(
    main: list[NamedBackend],
    fallback: NamedBackend,
    canary: NamedBackend,
    pool: list[NamedBackend],
    broken: NamedBackend,
) -> Snapshot:
    """Route everything to cluster ``pool`` (two good backends, one broken) with
    A50 failure-percentage ejection checked every second."""
    base = _snapshot(main, fallback, canary, {"pool": 1})
    cluster = b.cluster("pool")
    detection = cluster.outlier_detection
    detection.interval.FromTimedelta(datetime.timedelta(seconds=1))
    detection.base_ejection_time.FromTimedelta(datetime.timedelta(seconds=30))
    detection.max_ejection_percent.value = 50
    detection.failure_percentage_threshold.value = 50
    detection.enforcing_failure_percentage.value = 100
    detection.failure_percentage_minimum_hosts.value = 3
    detection.failure_percentage_request_volume.value = 10
    detection.enforcing_consecutive_5xx.value = 0
    detection.enforcing_success_rate.value = 0
    addresses = [x.address for x in [*pool, broken]]
    return base.replace(
        clusters=[*base.clusters, cluster],
        endpoints=[*base.endpoints, b.endpoints("pool", [b.locality(endpoints=addresses)])],
    )


def _retry_snapshot(
    main: list[NamedBackend],
    fallback: NamedBackend,
    canary: NamedBackend,
    pool: list[NamedBackend],
    broken: NamedBackend,
    retry: bool,
) -> Snapshot:
    """Route everything to cluster ``flaky`` (round robin over two good backends
    and one that fails every RPC with UNAVAILABLE, no outlier detection); with
    ``retry`` the route carries an A44 retry policy: retry_on unavailable, two
    retries, 10-50 ms backoff."""
    base = _snapshot(main, fallback, canary, {"flaky": 1})
    policy = (
        b.retry_policy("unavailable", num_retries=2, base_interval=0.01, max_interval=0.05)
        if retry
        else None
    )
    route = b.route(prefix="", cluster="flaky", retry_policy=policy)
    addresses = [x.address for x in [*pool, broken]]
    return base.replace(
        routes=[
            b.route_config(f"{SERVICE}-route", [b.virtual_host("greeter", [SERVICE], [route])])
        ],
        clusters=[*base.clusters, b.cluster("flaky")],
        endpoints=[*base.endpoints, b.endpoints("flaky", [b.locality(endpoints=addresses)])],
    )


def _until_clean(
    call: Callable[[], bytes], run: int, timeout: float, progress: Progress
) -> tuple[float | None, int]:
    """(seconds until ``run`` RPCs in a row succeed or None on timeout, failures seen)."""
    start = time.monotonic()
    streak = 0
    seen: collections.Counter[str] = collections.Counter()
    while time.monotonic() - start < timeout:
        try:
            seen[call().decode()] += 1
            streak += 1
        except grpc.RpcError as err:
            seen[f"error {err.code().name}"] += 1
            streak = 0
        if sum(seen.values()) % 50 == 0:
            progress.traffic(seen)
        failed = sum(n for k, n in seen.items() if k.startswith("error"))
        if streak >= run:
            return time.monotonic() - start, failed
    return None, sum(n for k, n in seen.items() if k.startswith("error"))


def _until_in_effect(
    channel: XdsChannel, route: dict[str, Any], timeout: float, since: float | None = None
) -> float | None:
    """Seconds (from ``since``, default now) until the config the channel
    uses routes as ``route`` says (its first route's action as
    ``config_dump()`` shows it, e.g. ``{"cluster": "pool"}``); None on timeout.

    A new snapshot reaches the channel some time after ``set_snapshot``, later
    under load, and until then RPCs follow the old config: a step that counts
    what the new one does must first wait for it.  The dump is read on the
    channel's serializer, between two updates: once it shows the new route,
    every RPC started after uses it."""
    start = time.monotonic() if since is None else since
    deadline = time.monotonic() + timeout
    while True:
        config = channel.config_dump().get("xds_config") or {}
        routes = (config.get("virtual_host") or {}).get("routes") or [{}]
        if {k: v for k, v in routes[0].items() if k != "match"} == route:
            return time.monotonic() - start
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _until_picked(call: Callable[[], bytes], backend: NamedBackend, timeout: float) -> bool:
    """Make RPCs until one reaches ``backend`` (answered or failed there):
    the LB policy picks it (round robin picks only connected backends);
    False on timeout."""
    before = backend.calls
    deadline = time.monotonic() + timeout
    while backend.calls == before:
        if time.monotonic() >= deadline:
            return False
        try:
            call()
        except grpc.RpcError:
            pass
    return True


def _wait_until(call: Callable[[], bytes], wanted: set[str], timeout: float) -> float | None:
    """Seconds until an RPC lands on one of ``wanted``; None on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if call().decode() in wanted:
                return time.monotonic() - start
        except grpc.RpcError:
            pass
        time.sleep(0.01)
    return None


HELP = "run the whole stack on loopback: split, failover, route switch, ejection, retries"
DESCRIPTION = (
    "Start a control plane and real gRPC backends on 127.0.0.1, open a pyxds channel to "
    "xds:///greeter and walk through a 75/25 traffic split, priority failover and "
    "fail-back, a route switched under load, outlier ejection of a failing backend and a "
    "retry policy hiding one. Every number shown is measured. "
    "Takes about 20 seconds; exits 0 when every step behaved."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-live",
        action="store_true",
        help="print a plain timeline instead of the live view (for logs and CI)",
    )


def run(args: argparse.Namespace) -> int:
    live = not args.no_live and sys.stdout.isatty()
    if live:
        from pyxds.cli.demo_live import run_live

        return run_live(run_demo)
    return run_demo()


def run_demo(say: Callable[[str], None] = print, progress: Progress | None = None) -> int:
    """Run the demo; returns a process exit code (0 when every step behaved)."""
    import pyxds

    progress = progress or Progress()
    clock = _Clock()
    main = [NamedBackend("main-p0-a").start(), NamedBackend("main-p0-b").start()]
    fallback = NamedBackend("main-p1").start()
    canary = NamedBackend("canary").start()
    pool = [NamedBackend("pool-a").start(), NamedBackend("pool-b").start()]
    broken = NamedBackend("broken", fail=True).start()
    ok = True
    with ManagementServer() as server:
        server.set_snapshot(_snapshot(main, fallback, canary, {"main": 75, "canary": 25}))
        say(f"{clock.stamp()} control plane on {server.address}; backends:")
        for backend in [*main, fallback, canary]:
            say(f"           {backend.name:10s} {backend.address}")
        channel = pyxds.insecure_channel(f"xds:///{SERVICE}", bootstrap=server.bootstrap("demo"))
        who: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(DEMO_METHOD)

        def call() -> bytes:
            return who(b"", timeout=5, wait_for_ready=True)

        say(f"{clock.stamp()} 1. RDS splits {SERVICE} 75/25 between clusters main and canary")
        progress.step(1, "75/25 split between clusters main and canary")
        seen = _count(call, 2000, progress)
        canary_share = seen["canary"] / 2000
        say(f"           2000 RPCs: {dict(sorted(seen.items()))}  canary share {canary_share:.1%}")
        ok &= abs(canary_share - 0.25) < 0.04

        say(f"{clock.stamp()} 2. stop every priority-0 backend of cluster main")
        progress.step(2, "priority failover: every priority-0 backend stopped")
        for backend in main:
            backend.stop()
        took = _wait_until(call, {"main-p1"}, 15)
        say(
            f"           traffic reached priority 1 (main-p1) after {_secs(took)}"
            if took is not None
            else "           FAILED: priority 1 never took traffic"
        )
        ok &= took is not None
        seen = _count(call, 200, progress)
        say(f"           200 RPCs: {dict(sorted(seen.items()))}")
        ok &= not any(k.startswith("error") for k in seen)

        say(f"{clock.stamp()} 3. restart the priority-0 backends on their ports")
        progress.step(3, "fail-back: priority-0 backends restarted")
        for backend in main:
            backend.start()
        took = _wait_until(call, {"main-p0-a", "main-p0-b"}, 30)
        say(
            f"           traffic back on priority 0 after {_secs(took)}"
            if took is not None
            else "           FAILED: never failed back to priority 0"
        )
        ok &= took is not None

        say(f"{clock.stamp()} 4. switch the route to canary only, under continuous load")
        progress.step(4, "route switched to canary under load")
        failures = 0
        sent = 0
        stop = threading.Event()

        def load() -> None:
            nonlocal failures, sent
            while not stop.is_set():
                try:
                    call()
                except grpc.RpcError:
                    failures += 1
                sent += 1

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        switched = time.monotonic()
        server.set_snapshot(_snapshot(main, fallback, canary, {"canary": 1}))
        # canary answered under the old split too: wait for the new route
        took = _until_in_effect(channel, {"weighted_clusters": {"canary": 1}}, 30, switched)
        time.sleep(0.3)  # and the load goes on a moment under the new route
        stop.set()
        for thread in threads:
            thread.join(10)
        seen = _count(call, 100, progress)
        say(
            f"           switched after {_secs(took)}; {sent} RPCs during the switch,"
            f" {failures} failed; then {dict(seen)}"
        )
        ok &= took is not None and failures == 0 and seen.get("canary") == 100

        say(f"{clock.stamp()} 5. outlier detection (A50) ejects a backend that fails its RPCs")
        progress.step(5, "outlier detection ejects a failing backend")
        server.set_snapshot(_outlier_snapshot(main, fallback, canary, pool, broken))
        # in effect, and broken picked: before it is, a streak proves nothing
        in_effect = _until_in_effect(channel, {"weighted_clusters": {"pool": 1}}, 30) is not None
        in_effect = in_effect and _until_picked(call, broken, 10)
        if not in_effect:
            say("           FAILED: the new config never took effect with broken picked")
        took, errors = _until_clean(call, 100, 15, progress)
        seen = _count(call, 200, progress)
        say(
            f"           {errors} RPCs failed on the broken backend, then it was ejected:"
            f" 100 RPCs in a row succeeded after {_secs(took)};"
            f" then 200 RPCs: {dict(sorted(seen.items()))}"
        )
        ok &= in_effect and took is not None and not any(k.startswith("error") for k in seen)

        say(f"{clock.stamp()} 6. a route retry policy (A44) hides a failing backend")
        progress.step(6, "a retry policy hides a failing backend")
        ok &= _retry_step(
            server, channel, call, say, progress, main, fallback, canary, pool, broken
        )

        say(f"{clock.stamp()} 7. channel.config_dump() (abridged):")
        progress.step(7, "channel.config_dump()")
        dump = channel.config_dump()
        for line in _summarize(dump):
            say(f"           {line}")
        channel.close()
    for backend in [*main, fallback, canary, *pool, broken]:
        backend.close()
    progress.step(STEPS + 1, "done")
    say(f"{clock.stamp()} demo {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


def _retry_step(
    server: ManagementServer,
    channel: XdsChannel,
    call: Callable[[], bytes],
    say: Callable[[str], None],
    progress: Progress,
    main: list[NamedBackend],
    fallback: NamedBackend,
    canary: NamedBackend,
    pool: list[NamedBackend],
    broken: NamedBackend,
) -> bool:
    """Step 6: without a retry policy a share of RPCs fails on the broken
    backend; once the control plane pushes one, none does.  True when both held."""
    server.set_snapshot(_retry_snapshot(main, fallback, canary, pool, broken, retry=False))
    # The old config (step 5: broken ejected) serves pool-a and pool-b too:
    # count once the new one is in effect and broken is picked again.
    reached = _until_in_effect(channel, {"cluster": "flaky"}, 30) is not None
    reached = reached and _until_picked(call, broken, 10)
    if not reached:
        say("           FAILED: the new config never took effect with broken picked")
    seen = _count(call, 300, progress)
    failed = sum(n for k, n in seen.items() if k.startswith("error"))
    say(
        f"           no retry policy, round robin over pool-a, pool-b and broken:"
        f" 300 RPCs, {failed} failed: {dict(sorted(seen.items()))}"
    )
    server.set_snapshot(_retry_snapshot(main, fallback, canary, pool, broken, retry=True))
    # round robin puts the broken backend every third pick: 30 successes in a
    # row only happen once the channel retries (bounded generously: the push
    # reaches the channel later on a loaded machine)
    took, during = _until_clean(call, 30, 30, progress)
    before = broken.calls
    seen = _count(call, 300, progress)
    retried = broken.calls - before
    after = sum(n for k, n in seen.items() if k.startswith("error"))
    say(
        f"           control plane pushed retry_policy {{retry_on: unavailable, num_retries: 2}}:"
        f" in effect after {_secs(took)} ({during} failed meanwhile);"
        f" then 300 RPCs, {after} failed: {dict(sorted(seen.items()))};"
        f" {retried} attempts failed on broken and were retried"
    )
    return reached and failed > 0 and took is not None and after == 0 and retried > 0


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.3f}s"


def _summarize(dump: dict[str, Any]) -> list[str]:
    """A few readable lines from ``channel.config_dump()``."""
    lines = [f"channel {dump.get('target')}: {dump.get('state')}"]
    xds = dump.get("xds_client") or {}
    for entry in xds.get("generic_xds_configs", []):
        type_name = entry.get("type_url", "").rsplit(".", 1)[-1]
        lines.append(
            f"{type_name:22s} {entry.get('name', ''):16s} {entry.get('client_status', '')}"
            f" version {entry.get('version_info', '')}"
        )
    if not xds:
        manager = (dump.get("resolver") or {}).get("dependency_manager") or {}
        for watch in manager.get("watches", []):
            lines.append(
                f"{watch.get('type', ''):4s} {watch.get('name', ''):16s} {watch.get('state')}"
            )
    _walk(dump.get("lb_policy") or {}, "", lines)
    return lines


def _walk(node: dict[str, Any], indent: str, lines: list[str]) -> None:
    extra = [f"{k}={node[k]}" for k in ("state", "current_priority", "current") if k in node]
    lines.append(f"{indent}{node.get('policy', '?')} {' '.join(extra)}".rstrip())
    if isinstance(node.get("child"), dict):
        _walk(node["child"], indent + "  ", lines)
    for name, child in (node.get("children") or {}).items():
        if isinstance(child, dict):
            lines.append(f"{indent}  {name}:")
            _walk(child, indent + "    ", lines)
