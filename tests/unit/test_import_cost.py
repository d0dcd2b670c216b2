"""``import pyxds`` loads what every channel needs and nothing a target may
not need (issue 18: a short-lived program pays the import every run).

A fresh interpreter imports pyxds; the xDS client, its protos and
validators, the management server, the CLI, re2, yaml, rich and
OpenTelemetry must not be loaded yet.  They load when a target needs them:
the xDS resolver with the first ``xds:`` channel, ``pyxds.aio`` at first
use (a count of modules, never a time)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

NOT_AT_IMPORT = (
    "pyxds.xds.client",
    "pyxds.xds.resources",
    "pyxds.resolver.xds_resolver",
    "pyxds.resolver.http_filters",
    "pyxds.server",
    "pyxds.cli",
    "pyxds.aio",
    "envoy",
    "udpa",
    "google.protobuf",
    "re2",
    "yaml",
    "rich",
    "opentelemetry",
    "cryptography",
)


def _printed(script: str) -> Any:
    """The JSON a fresh interpreter running ``script`` prints last."""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _loaded_after(code: str) -> set[str]:
    return set(_printed(f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"))


def _families(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in loaded)]


def test_import_pyxds_loads_no_xds_client_protos_server_cli_or_optional_packages() -> None:
    assert _families(_loaded_after("import pyxds"), NOT_AT_IMPORT) == []


def test_the_package_face_still_offers_every_public_name() -> None:
    loaded = _loaded_after(
        "import pyxds\n"
        "assert pyxds.__version__\n"
        "assert callable(pyxds.insecure_channel) and callable(pyxds.secure_channel)\n"
        "assert pyxds.XdsChannel.__name__ == 'XdsChannel'\n"
        "assert callable(pyxds.xds_channel_credentials)\n"
        "assert callable(pyxds.aio.insecure_channel)\n"
    )
    assert "pyxds.aio" in loaded


def test_a_non_xds_channel_never_loads_the_xds_client() -> None:
    loaded = _loaded_after(
        "import pyxds\nch = pyxds.insecure_channel('static:///127.0.0.1:1')\nch.close()\n"
    )
    assert _families(loaded, ("pyxds.xds.client", "envoy", "pyxds.server", "pyxds.cli")) == []


def test_health_checking_loads_only_for_a_channel_that_checks() -> None:
    """A17: the health check module and the stream machinery it runs on
    load with a channel whose service config has healthCheckConfig, not with
    any other (the check itself runs when a policy watches health)."""
    stream = ("pyxds.channel.health_check", "pyxds.channel.subchannel_stream")
    make = "import pyxds\nch = pyxds.insecure_channel('ipv4:127.0.0.1:1'{})\nch.close()\n"
    assert _families(_loaded_after(make.format("")), stream) == []
    sc = ', options=[("grpc.service_config", \'{"healthCheckConfig": {"serviceName": ""}}\')]'
    assert _families(_loaded_after(make.format(sc)), stream) == list(stream)


def test_the_xds_package_loads_its_client_on_first_use() -> None:
    loaded = _loaded_after("import pyxds.xds\nassert pyxds.xds.XdsClient.__name__ == 'XdsClient'")
    assert "pyxds.xds.client" in loaded


def test_the_bootstrap_does_not_load_the_channel() -> None:
    """The xDS client is below the channel (docs/architecture.md): loading
    and reading a bootstrap must not pull the package face in."""
    loaded = _loaded_after(
        "from pyxds.xds.bootstrap import parse_bootstrap\n"
        "b = parse_bootstrap({'xds_servers': [{'server_uri': 'localhost:1',"
        " 'channel_creds': [{'type': 'insecure'}]}], 'node': {'id': 'n'}})\n"
        "assert b.node.to_proto().user_agent_version\n"
    )
    assert _families(loaded, ("pyxds.channel", "pyxds._api")) == []


def test_the_channel_package_offers_both_channels_loading_each_on_first_use() -> None:
    loaded = _loaded_after(
        "import pyxds.channel\n"
        "assert 'pyxds.channel.channel' not in sys.modules\n"
        "from pyxds.channel import XdsChannel\n"
        "from pyxds.channel.channel import XdsChannel as sync_channel\n"
        "assert XdsChannel is sync_channel is pyxds.channel.XdsChannel\n"
        "assert pyxds.channel.AioXdsChannel.__name__ == 'AioXdsChannel'\n"
        "try:\n"
        "    pyxds.channel.NoSuchChannel\n"
        "except AttributeError as err:\n"
        "    assert str(err) == 'NoSuchChannel', err\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    assert {"pyxds.channel.channel", "pyxds.channel.aio"} <= loaded


def test_an_aio_channel_loads_its_interceptors_only_when_given_some() -> None:
    """Without interceptors the module never loads; a wrong one is refused
    with the same ValueError, before anything else is built."""
    loaded = _loaded_after(
        "import pyxds.aio\n"
        "ch = pyxds.aio.insecure_channel('static:///127.0.0.1:1', interceptors=[])\n"
        "assert 'pyxds.channel.aio_interceptors' not in sys.modules\n"
        "try:\n"
        "    pyxds.aio.insecure_channel('static:///127.0.0.1:1', interceptors=[object()])\n"
        "except ValueError as err:\n"
        "    assert 'is not a client interceptor: expected one of "
        "grpc.aio.UnaryUnaryClientInterceptor' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('no ValueError')\n"
    )
    assert "pyxds.channel.aio_interceptors" in loaded


def test_two_threads_making_the_first_channels_at_once_both_get_working_ones() -> None:
    """Everything a channel loads on first use (the channel, its calls, the
    value classes' templates, a config dump) loads once under the import
    lock: two threads making the first sync and asyncio channels and their
    dumps at the same moment in a fresh process both succeed."""
    loaded = _loaded_after(
        "import asyncio, threading\n"
        "import pyxds\n"
        "barrier, done, errors = threading.Barrier(4), [], []\n"
        "def sync_channel():\n"
        "    barrier.wait(10)\n"
        "    ch = pyxds.insecure_channel('static:///127.0.0.1:1')\n"
        "    dump = ch.config_dump()\n"
        "    ch.close()\n"
        "    return dump\n"
        "def aio_channel():\n"
        "    barrier.wait(10)\n"
        "    async def main():\n"
        "        ch = pyxds.aio.insecure_channel('static:///127.0.0.1:1')\n"
        "        dump = ch.config_dump()\n"
        "        await ch.close()\n"
        "        return dump\n"
        "    return asyncio.run(main())\n"
        "def run(fn):\n"
        "    try:\n"
        "        done.append(sorted(fn()))\n"
        "    except BaseException as err:\n"
        "        errors.append(repr(err))\n"
        "kinds = (sync_channel, aio_channel) * 2\n"
        "threads = [threading.Thread(target=run, args=(f,)) for f in kinds]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join(30)\n"
        "assert not errors, errors\n"
        "assert len(done) == 4 and all(d == done[0] for d in done), done\n"
    )
    assert {"pyxds.channel.dump", "pyxds.channel.channel", "pyxds.channel.aio"} <= loaded


def test_the_xds_resolver_loads_no_lb_policy_on_the_calling_thread() -> None:
    """The xDS tree's policies load on the load-ahead thread while the first
    resources come (pyxds.resolver.xds_resolver, ``_load_policies_ahead``),
    not when the resolver's modules load on the thread making the channel:
    the ConfigSelector names ``xds_override_host``'s call attribute from
    ``pyxds.lb.api``, not from the policy's module."""
    policies = (
        "pyxds.lb.xds_override_host",
        "pyxds.lb.outlier_detection",
        "pyxds.lb.xds_cluster_impl",
        "pyxds.lb.cds",
        "pyxds.lb.round_robin",
    )
    loaded = _loaded_after("import pyxds.resolver.xds_resolver")
    assert _families(loaded, policies) == []


def _lean_checks_after_loading_ahead(api: str) -> dict[str, object]:
    """In a fresh interpreter using ``api``: the lean unary calls' checks
    of grpcio after the first xDS resolver's load-ahead job, before any call."""
    script = (
        "import json, sys\n"
        f"import pyxds\n{api}\n"
        "from pyxds.resolver import xds_resolver\n"
        "xds_resolver._load_ahead()\n"
        "def checked(name):\n"
        "    module = sys.modules.get(name)\n"
        "    return None if module is None else module.available.answer\n"
        "print(json.dumps({name: checked('pyxds.channel.' + name)"
        " for name in ('grpc_unary', 'grpc_aio_unary')}"
        " | {'grpc._channel': 'grpc._channel' in sys.modules}))\n"
    )
    return dict(_printed(script))


def test_loading_ahead_takes_the_lean_unary_calls_check_of_grpcio() -> None:
    """The first xDS resolver's load-ahead thread takes the lean unary
    call's check of grpcio's sources (~4.5 M instructions), which the first
    unary call would otherwise take once the config came and its subchannel
    connected: the sync call's where the sync channel is in use, the
    grpc.aio call's where only the asyncio channel is (and neither the
    other's, nor grpcio's sync channel module for an asyncio program)."""
    sync = _lean_checks_after_loading_ahead("pyxds.insecure_channel")
    assert sync == {"grpc_unary": True, "grpc_aio_unary": None, "grpc._channel": True}
    aio = _lean_checks_after_loading_ahead("import pyxds.aio\npyxds.aio.insecure_channel")
    assert aio == {"grpc_unary": None, "grpc_aio_unary": True, "grpc._channel": False}


def _ahead_after_loading_the_policies(api: str) -> list[dict[str, object]]:
    """In a fresh interpreter using ``api`` that loaded the xDS tree's
    policies itself (as a program that named the resolver's modules before
    its first channel): whether the first resolver's ``_load_policies_ahead``
    starts the load-ahead thread, and the lean calls' checks after it; then
    once more with everything done (the thread's once-flag reset)."""
    script = (
        "import json, sys, threading\n"
        f"import pyxds\n{api}\n"
        "from pyxds.lb import registry\n"
        "from pyxds.resolver import xds_resolver\n"
        "registry.load_ahead()\n"
        "started = []\n"
        "start = threading.Thread.start\n"
        "def counted(thread):\n"
        "    started.append(thread)\n"
        "    start(thread)\n"
        "threading.Thread.start = counted\n"
        "def ahead():\n"
        "    started.clear()\n"
        "    xds_resolver._load_policies_ahead()\n"
        "    for t in started: t.join(30)\n"
        "    def answer(name):\n"
        "        module = sys.modules.get('pyxds.channel.' + name)\n"
        "        return None if module is None else module.available.answer\n"
        "    checks = {n: answer(n) for n in ('grpc_unary', 'grpc_aio_unary')}\n"
        "    return {'threads': [t.name for t in started], **checks}\n"
        "first = ahead()\n"
        "xds_resolver._loading_ahead[0] = False\n"
        "print(json.dumps([first, ahead()]))\n"
    )
    return list(_printed(script))


def test_policies_loaded_already_still_leave_the_lean_calls_check_to_the_load_ahead_thread() -> (
    None
):
    """With the xDS tree's policies loaded before the first ``xds:``
    channel, the load-ahead thread still runs while the lean unary call's
    check of grpcio is not taken (else the first unary call takes it on the
    event loop between its pick and its call: ~0.8 ms of the first RPC), and
    not once both are done."""
    aio = _ahead_after_loading_the_policies("import pyxds.aio\npyxds.aio.insecure_channel")
    assert aio == [
        {"threads": ["pyxds-load-ahead"], "grpc_unary": None, "grpc_aio_unary": True},
        {"threads": [], "grpc_unary": None, "grpc_aio_unary": True},
    ]
    # sync: grpcio's sync channel module loaded by the program, the check not taken
    sync = _ahead_after_loading_the_policies("pyxds.insecure_channel\nimport grpc._channel")
    assert sync == [
        {"threads": ["pyxds-load-ahead"], "grpc_unary": True, "grpc_aio_unary": None},
        {"threads": [], "grpc_unary": True, "grpc_aio_unary": None},
    ]
