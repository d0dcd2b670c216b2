"""The load-reporting scenario of the LRS e2e and differential tests (A27).

Routes: header ``x-cluster: drop`` -> cluster ``lrs-drop`` (one locality, EDS
drop category ``throttle`` at 100 %), ``x-cluster: plain`` -> ``plain`` (no
``lrs_server``), everything else -> ``lrs-main`` (EDS service name
``lrs-main-eds``, localities ``za`` -> backend a0 and ``zb`` -> backend b0,
drop category ``lb`` at ``main_drop_ppm``).  Every LRS cluster has
``lrs_server: {self: {}}``.

Traffic: ``Who`` calls succeed, ``Fail`` calls fail with INTERNAL at the
backend; the backend's name is in every answer and failure, so what each
locality served is known exactly and compared with what was reported.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from channel_fixtures import LISTENER, SERVICE

from pyxds.server import builders as b
from pyxds.server.snapshot import Snapshot

MAIN = "lrs-main"
MAIN_EDS = "lrs-main-eds"
DROP = "lrs-drop"
PLAIN = "plain"
ZONE_OF = {"a0": "za", "b0": "zb"}


def lrs_snapshot(
    backends: dict[str, Any],
    main_drop_ppm: int = 200_000,
    lrs: bool = True,
    main_max_requests: int | None = None,
) -> Snapshot:
    """The scenario; ``lrs`` False: no cluster reports; ``main_max_requests``:
    the main cluster's circuit breaker."""

    def header(value: str) -> Any:
        return b.header_matcher("x-cluster", exact=value)

    return Snapshot(
        listeners=[b.listener(LISTENER)],
        routes=[
            b.route_config(
                f"{LISTENER}-route",
                [
                    b.virtual_host(
                        "vh",
                        routes=[
                            b.route(prefix="", headers=[header("drop")], cluster=DROP),
                            b.route(prefix="", headers=[header("plain")], cluster=PLAIN),
                            b.route(prefix="", cluster=MAIN),
                        ],
                    )
                ],
            )
        ],
        clusters=[
            b.cluster(
                MAIN, eds_service_name=MAIN_EDS, lrs_server=lrs, max_requests=main_max_requests
            ),
            b.cluster(DROP, lrs_server=lrs),
            b.cluster(PLAIN),
        ],
        endpoints=[
            b.endpoints(
                MAIN_EDS,
                [
                    b.locality(region="r", zone="za", endpoints=[backends["a0"].address]),
                    b.locality(region="r", zone="zb", endpoints=[backends["b0"].address]),
                ],
                drop_overloads={"lb": main_drop_ppm} if main_drop_ppm else None,
            ),
            b.endpoints(
                DROP,
                [b.locality(region="r", zone="zd", endpoints=[backends["a0"].address])],
                drop_overloads={"throttle": 1_000_000},
            ),
            b.endpoints(
                PLAIN, [b.locality(region="r", zone="zp", endpoints=[backends["b0"].address])]
            ),
        ],
    )


@dataclass
class Observed:
    """What a client saw: per zone, calls that succeeded / failed at a
    backend; per category, calls dropped; anything else."""

    succeeded: collections.Counter = field(default_factory=collections.Counter)
    errors: collections.Counter = field(default_factory=collections.Counter)
    dropped: collections.Counter = field(default_factory=collections.Counter)
    circuit_breaker: int = 0
    other: collections.Counter = field(default_factory=collections.Counter)

    def add(self, outcome: str, count: int = 1) -> None:
        """``outcome`` as the fixtures' counters spell it: a backend name, or
        ``error:CODE: details``."""
        if outcome in ZONE_OF:
            self.succeeded[ZONE_OF[outcome]] += count
            return
        for name, zone in ZONE_OF.items():
            if outcome.startswith("error:INTERNAL") and f"{name} says no" in outcome:
                self.errors[zone] += count
                return
        if outcome.endswith(": circuit breaker drop"):
            self.circuit_breaker += count
            return
        if "EDS-configured drop: " in outcome:
            self.dropped[outcome.rsplit("EDS-configured drop: ", 1)[1]] += count
            return
        self.other[outcome] += count

    def expected(self) -> dict[str, Any]:
        """In the shape of :meth:`pyxds.server.lrs.LoadTotals.counts`."""
        zones = set(self.succeeded) | set(self.errors)
        return {
            "issued": {
                ("r", z, ""): self.succeeded[z] + self.errors[z]
                for z in zones
                if self.succeeded[z] + self.errors[z]
            },
            "succeeded": {("r", z, ""): n for z, n in self.succeeded.items() if n},
            "errors": {("r", z, ""): n for z, n in self.errors.items() if n},
            "dropped": {c: n for c, n in self.dropped.items() if n},
            "total_dropped": sum(self.dropped.values()) + self.circuit_breaker,
        }


WHO = f"/{SERVICE}/Who"
FAIL = f"/{SERVICE}/Fail"


def one_cluster_snapshot(
    cluster: Any,
    zone: str | None = None,
    address: str | None = None,
    drops: dict[str, int] | None = None,
    localities: list[Any] | None = None,
    version: str | None = None,
    **route: Any,
) -> Snapshot:
    """The listener -> one route (``route``: more :func:`builders.route`
    arguments, e.g. ``retry_policy``) to ``cluster`` (a Cluster proto); with
    ``zone``, its EDS resource: one locality (region "r", ``zone``) holding
    ``address``, or with ``localities`` (LocalityLbEndpoints) those, and the
    EDS drop categories ``drops`` (ppm); ``version``: the snapshot's."""
    endpoints = []
    if zone is not None:
        localities = [b.locality(region="r", zone=zone, endpoints=[address])]
    if localities is not None:
        endpoints.append(b.endpoints(cluster.name, localities, drop_overloads=drops))
    return Snapshot(
        listeners=[b.listener(LISTENER)],
        routes=[
            b.route_config(
                f"{LISTENER}-route",
                [b.virtual_host("vh", routes=[b.route(prefix="", cluster=cluster.name, **route)])],
            )
        ],
        clusters=[cluster],
        endpoints=endpoints,
        version=version,
    )


def idle(record: Any) -> bool:
    """A report (LoadReportRecord) of a cluster that counts no call at all:
    the all-zero report a client sends once after a report that counted
    some (gRFC A27; C-core and pyxds then skip all-zero ones), so "one
    more interval" after the last calls is the one whose report is idle."""
    stats = record.stats
    return not stats.total_dropped_requests and not any(
        s.total_issued_requests or s.total_successful_requests or s.total_error_requests
        for s in stats.upstream_locality_stats
    )
