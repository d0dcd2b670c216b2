"""A pyxds.aio channel's hold on grpcio's asyncio engine
(:mod:`pyxds.channel.aio_engine`): taken once, let go once, for good, and
let go when the channel is collected unclosed (as grpc.aio.Channel's end)."""

from __future__ import annotations

import gc

import grpc.aio
import pytest

from pyxds.channel.aio_engine import EngineHold


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    monkeypatch.setattr(grpc.aio, "init_grpc_aio", lambda: made.append("init"))
    monkeypatch.setattr(grpc.aio, "shutdown_grpc_aio", lambda: made.append("shutdown"))
    return made


def test_the_engine_is_taken_once_and_let_go_once(calls):
    hold = EngineHold()
    hold.take()
    hold.take()  # a second connection of the channel
    assert hold.held
    hold.let_go()
    hold.let_go()  # close() again
    assert calls == ["init", "shutdown"]
    assert not hold.held


def test_a_take_queued_before_the_close_runs_after_it_takes_nothing(calls):
    hold = EngineHold()
    hold.let_go()  # the channel closed before its loop ran the take
    hold.take()
    assert calls == []
    assert not hold.held


def test_a_channel_never_connected_lets_go_of_nothing(calls):
    EngineHold().let_go()
    assert calls == []


def test_a_hold_collected_while_held_lets_the_engine_go(calls):
    hold = EngineHold()
    hold.take()
    del hold
    gc.collect()
    assert calls == ["init", "shutdown"]
