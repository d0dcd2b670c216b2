"""Differential: pick_first's ``shuffleAddressList`` end to end, grpcio 1.85
against pyxds with the same service config on the same three backends.

Sources: grpc-node ``packages/grpc-js/test/test-pick-first.ts``
"End-to-end functionality: Should still work with shuffleAddressList set",
"Address list randomization: Should pick the same subchannel if address
randomization is disabled" and "Should pick different subchannels after
multiple updates" (gRFC A62: the list is shuffled once per resolver update;
here each new channel is a new update).  Observed per channel: which backend
serves its RPCs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import grpc
import pytest
from channel_fixtures import SERVICE, Backend

import pyxds._api as pyxds

CHANNELS = 12  # all 12 shuffles putting one backend first: 3 * 3**-12, about 6e-6


@pytest.fixture(scope="module")
def backends() -> Iterator[list[Backend]]:
    started = [Backend(f"b{i}").start() for i in range(3)]
    try:
        yield started
    finally:
        for backend in started:
            backend.stop()


def grpcio_channel(target: str, sc: dict) -> grpc.Channel:
    """A grpcio channel with subchannels of its own: in C-core's global pool
    a backend still connected for another channel (the one just closed, or
    a test's before) is READY at once, and pick_first takes a READY
    subchannel whatever its place in the shuffled list (a loaded full run
    saw 12 channels all on b0)."""
    options = [("grpc.service_config", json.dumps(sc)), ("grpc.use_local_subchannel_pool", 1)]
    return grpc.insecure_channel(target, options=options)


def pyxds_channel(target: str, sc: dict) -> grpc.Channel:
    return pyxds.insecure_channel(target, service_config=sc)


def served_by(make: Callable[[str, dict], grpc.Channel], target: str, shuffle: bool) -> set[str]:
    """The backends that served five RPCs on one new channel."""
    channel = make(
        target, {"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": shuffle}}]}
    )
    try:
        who = channel.unary_unary(f"/{SERVICE}/Who")
        return {who(b"", timeout=10).decode() for _ in range(5)}
    finally:
        channel.close()


@pytest.mark.parametrize("make", [grpcio_channel, pyxds_channel], ids=["grpcio", "pyxds"])
def test_shuffled_pick_first_sticks_to_one_backend_per_channel_and_varies_across_channels(
    backends, make
):
    target = "ipv4:" + ",".join(b.address for b in backends)
    firsts = []
    for _ in range(CHANNELS):
        served = served_by(make, target, shuffle=True)
        assert len(served) == 1, served  # still pick_first: one connection
        firsts.extend(served)
    assert len(set(firsts)) > 1, firsts


@pytest.mark.parametrize("make", [grpcio_channel, pyxds_channel], ids=["grpcio", "pyxds"])
def test_unshuffled_pick_first_always_uses_the_first_address(backends, make):
    target = "ipv4:" + ",".join(b.address for b in backends)
    for _ in range(3):
        assert served_by(make, target, shuffle=False) == {"b0"}
