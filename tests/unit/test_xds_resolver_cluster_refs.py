"""ClusterRef: the A31 RPC reference on a cluster, lock-free."""

from __future__ import annotations

import threading

from pyxds.resolver.config_selector import ClusterRef


def test_retired_cluster_refuses_new_references():
    idle: list[str] = []
    ref = ClusterRef("c", lambda: idle.append("idle"))
    assert ref.acquire()
    ref.in_routes = False
    assert not ref.try_retire(), "retired while an RPC holds it"
    ref.release()
    assert idle == ["idle"], "last release of an unrouted cluster must schedule a sweep"
    assert ref.try_retire()
    assert not ref.acquire()
    assert ref.count == 0


def test_cluster_still_in_routes_is_never_retired_nor_reported_idle():
    idle: list[str] = []
    ref = ClusterRef("c", lambda: idle.append("idle"))
    assert ref.acquire()
    ref.release()
    assert idle == []
    assert not ref.try_retire()


def test_no_rpc_ever_holds_a_retired_cluster_under_concurrency():
    ref = ClusterRef("c", lambda: None)
    ref.in_routes = False
    violations: list[int] = []
    stop = threading.Event()
    retired_for_good = threading.Event()

    def rpcs() -> None:
        while not stop.is_set():
            if ref.acquire():
                # Holding a reference: the cluster must not have been retired.
                if retired_for_good.is_set():
                    violations.append(1)
                ref.release()

    threads = [threading.Thread(target=rpcs) for _ in range(3)]
    for t in threads:
        t.start()
    retired = False
    for _ in range(20000):
        if ref.try_retire():
            retired = True
            retired_for_good.set()
            break
    for _ in range(2000):  # let the RPC threads try after the retirement
        pass
    stop.set()
    for t in threads:
        t.join(5.0)
    assert not violations
    if retired:
        assert not ref.acquire()
