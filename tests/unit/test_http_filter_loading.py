"""The A33 fault filter's module loads at the first route chain that names
its type, not with the filter registry (issue 18, start-up): a plain config
never loads it; a chain naming it gets the same fault injector as before,
from the first call on, in every thread that asks at once; and a filter
the application registered for the type first stays registered (it used to
replace the built-in, registered before it)."""

from __future__ import annotations

import json
import subprocess
import sys

FAULT = "envoy.extensions.filters.http.fault.v3.HTTPFault"

_PRELUDE = f"""
import json, sys, threading
from pyxds.resolver import http_filters
from pyxds.resolver.http_filters import build_chain, registered
from pyxds.server import builders as b
from pyxds.xds.resources.types import HttpFilter
FAULT = {FAULT!r}
loaded_at_first = "pyxds.resolver.fault_filter" in sys.modules
config = b.fault_config(abort_grpc_status=14, abort_percent=100).SerializeToString()
router = "envoy.extensions.filters.http.router.v3.Router"
listener = [HttpFilter("fault", FAULT, config), HttpFilter("router", router)]
"""


def _run(code: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _PRELUDE + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_fault_filter_loads_with_the_first_chain_that_names_it() -> None:
    result = _run(
        "plain = build_chain([listener[1]])\n"
        "before = 'pyxds.resolver.fault_filter' in sys.modules\n"
        "chain = build_chain(listener)\n"
        "from pyxds.resolver.fault_filter import FaultFilter, FaultInjector\n"
        "print(json.dumps({'at_first': loaded_at_first, 'after_plain': before,\n"
        "    'plain': len(plain), 'chain': [type(f).__name__ for f in chain],\n"
        "    'code': chain[0].config.abort_code.name,\n"
        "    'registered': type(registered(FAULT)).__name__}))\n"
    )
    assert result == {
        "at_first": False,
        "after_plain": False,
        "plain": 0,
        "chain": ["FaultInjector"],
        "code": "UNAVAILABLE",
        "registered": "FaultFilter",
    }


def test_threads_building_the_first_fault_chain_at_once_all_get_it() -> None:
    result = _run(
        "barrier, chains, errors = threading.Barrier(8), [], []\n"
        "def first():\n"
        "    barrier.wait(10)\n"
        "    try:\n"
        "        chains.append([type(f).__name__ for f in build_chain(listener)])\n"
        "    except BaseException as err:\n"
        "        errors.append(repr(err))\n"
        "threads = [threading.Thread(target=first) for _ in range(8)]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join(30)\n"
        "print(json.dumps({'chains': chains, 'errors': errors}))\n"
    )
    assert result == {"chains": [["FaultInjector"]] * 8, "errors": []}


def test_a_filter_the_application_registered_for_the_type_first_stays() -> None:
    result = _run(
        "class Mine(http_filters.HttpFilter):\n"
        "    type_urls = (FAULT,)\n"
        "    def call_filter(self, config):\n"
        "        return None\n"
        "mine = Mine()\n"
        "http_filters.register(mine)\n"
        "chain = build_chain(listener)\n"
        "import pyxds.resolver.fault_filter\n"
        "print(json.dumps({'chain': len(chain), 'mine': registered(FAULT) is mine}))\n"
    )
    assert result == {"chain": 0, "mine": True}


def test_the_stateful_session_filter_loads_with_the_first_config_naming_it() -> None:
    """The A55 filter (its resolver module and its config validators) as
    the fault filter: a plain listener and its chain load neither; the
    first listener naming it is validated as before (an empty cookie name
    NACKed in C-core's words) and its chain carries the session cookie."""
    result = _run(
        "from pyxds.xds.resources.listener import decode_listener\n"
        "modules = ('pyxds.resolver.stateful_session', 'pyxds.xds.resources.stateful_session')\n"
        "def decoded(*filters):\n"
        "    return decode_listener(b.listener('l', http_filters=filters).SerializeToString())\n"
        "_, plain, plain_error = decoded()\n"
        "build_chain(plain.http_filters)\n"
        "before = [m for m in modules if m in sys.modules]\n"
        "_, _, bad = decoded(b.stateful_session_filter(cookie_name=''))\n"
        "_, good, good_error = decoded(b.stateful_session_filter(cookie_name='c'))\n"
        "chain = build_chain(good.http_filters)\n"
        "print(json.dumps({'before': before, 'errors': [plain_error, good_error],\n"
        "    'bad': bad.endswith('.cookie.name: field not present'),\n"
        "    'after': [m for m in modules if m in sys.modules],\n"
        "    'chain': [(type(f).__name__, f.config.name) for f in chain]}))\n"
    )
    assert result == {
        "before": [],
        "errors": [None, None],
        "bad": True,
        "after": ["pyxds.resolver.stateful_session", "pyxds.xds.resources.stateful_session"],
        "chain": [["SessionCookie", "c"]],
    }
