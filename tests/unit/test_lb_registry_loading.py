"""The LB policy registry loads a built-in policy when its name is first
asked for (issue 18, start-up), and the answers are those of a registry
with every policy loaded: a name resolves to its policy, a config naming a
policy that does not exist is refused (a CDS NACK) with the same words.

The first ``xds:`` resolver of a process also loads the xDS tree's
policies ahead on a thread of its own (``registry.load_ahead``), while
the first resources are on their way; that loading must keep a policy the
application registered under a built-in's name, as ``get`` does.

Fresh interpreters where the question is what a process has loaded (one
each way), no timing anywhere.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
from google.protobuf import struct_pb2
from xds.type.v3 import typed_struct_pb2

from pyxds.lb import PolicyFactory, registry
from pyxds.server import builders as b

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")


def _typed_struct(name: str, config: dict) -> typed_struct_pb2.TypedStruct:
    value = struct_pb2.Struct()
    value.update(config)
    return typed_struct_pb2.TypedStruct(type_url=f"type.googleapis.com/{name}", value=value)


def _clusters() -> list[bytes]:
    """CDS resources naming policies by every route a Cluster has: the
    legacy ``lb_policy`` enum, A52 typed policies (first supported wins),
    a policy that does not exist, and a known one with a bad config."""
    bad = [("pf", _typed_struct("pick_first", {"shuffleAddressList": 3}))]
    return [
        c.SerializeToString()
        for c in (
            b.cluster("rr"),
            b.cluster("rh", lb_policy="RING_HASH"),
            b.cluster("lr", lb_policy="LEAST_REQUEST"),
            b.cluster(
                "custom-then-wrr",
                load_balancing_policy=[
                    ("missing", _typed_struct("no_such_policy", {})),
                    ("wrr", _typed_struct("weighted_round_robin", {})),
                ],
            ),
            b.cluster(
                "unknown", load_balancing_policy=[("x", _typed_struct("no_such_policy", {}))]
            ),
            b.cluster("bad-config", load_balancing_policy=bad),
        )
    ]


_CHILD = textwrap.dedent(
    """
    import json, sys
    from pyxds.lb import registry
    if sys.argv[1] == "everything":
        registry.names()
    modules = sorted(set(registry.BUILTINS.values()))
    before = [m for m in modules if m in sys.modules]
    from pyxds.xds.resources import CLUSTER
    clusters = [bytes.fromhex(h) for h in json.loads(sys.argv[2])]
    results = [repr(CLUSTER.decode(c, use_memo=False)) for c in clusters]
    lists = [
        [{"no_such_policy": {}}, {"another_unknown": {}}],
        [{"no_such_policy": {}}, {"ring_hash_experimental": {"minRingSize": 0}}],
    ]
    refused = []
    for entries in lists:
        try:
            registry.select(entries)
        except Exception as err:
            refused.append(f"{type(err).__name__}: {err}")
    names = {n: getattr(registry.get(n), "name", None) for n in registry.BUILTINS}
    print(json.dumps({"before": before, "results": results, "refused": refused, "names": names,
                      "after": [m for m in modules if m in sys.modules]}))
    """
)


def fresh(code: str) -> Any:
    """The JSON a fresh interpreter running ``code`` on this tree's source
    prints last."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run(mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, json.dumps([c.hex() for c in _clusters()])],
        env={**os.environ, "PYTHONPATH": SRC, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_lazily_loaded_policies_resolve_and_refuse_as_with_every_policy_loaded() -> None:
    lazy, everything = _run("lazy"), _run("everything")
    assert lazy["before"] == []  # nothing loaded before a name was asked for
    assert len(everything["before"]) == len(set(registry.BUILTINS.values()))
    assert lazy["results"] == everything["results"]
    assert lazy["refused"] == everything["refused"]
    # every built-in name resolves to its own policy
    assert lazy["names"] == {name: name for name in registry.BUILTINS}
    acked = [r for r in lazy["results"] if "error=None" in r]
    assert len(acked) == 4, lazy["results"]  # rr, rh, lr, and wrr after the unknown one
    unknown, bad_config = lazy["results"][4], lazy["results"][5]
    assert "no supported load balancing policy" in unknown
    assert "shuffleAddressList" in bad_config and "error=None" not in bad_config
    assert "no_such_policy, another_unknown" in lazy["refused"][0]
    assert "minRingSize" in lazy["refused"][1]


class _UsersPolicy(PolicyFactory):
    def __init__(self, name: str) -> None:
        self.name = name

    def parse_config(self, json_config):
        return json_config

    def build(self, helper):
        raise NotImplementedError


@pytest.fixture
def fake_builtins(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    """Two built-in policy modules of a test package, each registering its
    policy and then blocking until released: ``first`` under a name the
    application registered too, ``second`` under another."""
    package = tmp_path / "fake_builtin_policies"
    package.mkdir()
    (package / "__init__.py").write_text("")
    body = textwrap.dedent(
        """
        from pyxds.lb import registry
        from tests_support_events import EVENTS

        class Factory(registry.PolicyFactory):
            def __init__(self, name):
                self.name = name
            def parse_config(self, json_config):
                return json_config
            def build(self, helper):
                raise NotImplementedError

        registry.register(Factory("fake_{which}"))
        EVENTS["{which} registering"].set()
        EVENTS["release {which}"].wait(5)
        """
    )
    for which in ("shared", "second"):
        (package / f"{which}.py").write_text(body.format(which=which))
    steps = ("shared registering", "second registering", "release shared", "release second")
    events = {step: threading.Event() for step in steps}
    support = type(sys)("tests_support_events")
    support.EVENTS = events  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tests_support_events", support)
    monkeypatch.syspath_prepend(str(tmp_path))
    for which in ("shared", "second"):
        monkeypatch.setitem(registry.BUILTINS, f"fake_{which}", f"fake_builtin_policies.{which}")
    yield events
    for which in ("shared", "second"):
        registry.unregister(f"fake_{which}")
        registry._loaded.discard(f"fake_builtin_policies.{which}")
        sys.modules.pop(f"fake_builtin_policies.{which}", None)
    sys.modules.pop("fake_builtin_policies", None)


def test_loading_two_builtins_at_once_keeps_the_applications_registration(fake_builtins) -> None:
    """``load_ahead`` loads a built-in module whose policy's name the
    application registered; while that module registers, ``get`` loads
    another built-in.  The application's policy stays.  Before the loads
    were serialized, the second load put back a snapshot of the registry
    taken while the first module's registration stood, after the first
    load had put back the application's."""
    users = _UsersPolicy("fake_shared")
    registry.register(users)
    ahead = threading.Thread(target=registry.load_ahead, args=(("fake_shared",),))
    ahead.start()
    assert fake_builtins["shared registering"].wait(5)
    got: list[PolicyFactory | None] = []
    second = threading.Thread(target=lambda: got.append(registry.get("fake_second")))
    second.start()
    # the second load starts now (unserialized) or waits for the first
    # (serialized): wait for it a little, then let the first end, then it
    fake_builtins["second registering"].wait(0.2)
    fake_builtins["release shared"].set()
    ahead.join(5)
    fake_builtins["release second"].set()
    second.join(5)
    assert not ahead.is_alive() and not second.is_alive()
    assert [factory.name for factory in got if factory is not None] == ["fake_second"]
    assert registry.get("fake_shared") is users


def test_load_ahead_loads_the_xds_tree_only_and_keeps_a_users_policy() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        from pyxds.lb import registry

        class Users(registry.PolicyFactory):
            name = "round_robin"
            def parse_config(self, json_config):
                return json_config
            def build(self, helper):
                raise NotImplementedError

        users = Users()
        registry.register(users)
        registry.load_ahead()
        print(json.dumps({
            "kept": registry.get("round_robin") is users,
            "loaded": sorted(m for m in set(registry.BUILTINS.values()) if m in sys.modules),
        }))
        """
    )
    out = fresh(code)
    assert out["kept"]
    assert out["loaded"] == sorted({registry.BUILTINS[name] for name in registry.XDS_TREE})
