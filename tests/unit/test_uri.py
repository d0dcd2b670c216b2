"""``pyxds._uri`` gives ``urllib.parse``'s results (its module docstring):
the same parts, strings and errors for targets, authorities, resource names
and random strings, whichever way each input takes; and a plain program's
targets do not load ``urllib.parse``."""

from __future__ import annotations

import random
import subprocess
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest

from pyxds import _uri

TARGETS = [
    "xds:///bench",
    "xds:///echo.default.svc.cluster.local:8080",
    "xds://authority.example/svc",
    "xds://traffic-director-global.xds.googleapis.com/svc",
    "xds:svc",
    "xds:/svc",
    "xds:///",
    "xds://",
    "xds:",
    "XDS:///Svc",
    "xds:///a%20b",
    "xds:///a%2Fb/c",
    "xds:///svc?q=1",
    "xds:///svc#frag",
    "xds://[::1]:80/svc",
    "xds://[::1/svc",
    "xds://::1]/svc",
    "dns:///localhost:50051",
    "static:///127.0.0.1:1,127.0.0.1:2",
    "ipv4:127.0.0.1:1",
    "unix:///tmp/sock",
    "xdstp://authority/envoy.config.cluster.v3.Cluster/c1",
    "xdstp://authority.example/envoy.config.listener.v3.Listener/a/b?x=1",
    "xdstp:///envoy.config.cluster.v3.Cluster/c",
    "1xds:///svc",
    "x+y-z.w:///svc",
    "x_y:///svc",
    ":///svc",
    "//host/path",
    "/path/only",
    "plain",
    "",
    " xds:///svc",
    "xds:///svc ",
    "xds:///s\tv\nc",
    "xds:///s\\vc",
    "xds://h\u00e9/svc",
    "xds:///\u00e9",
    "xds://user@host:1/svc",
]

SAFES = ["/", "", "!$&'()*+,;=:@/", "!$&'()*+,;=:@[]", "!$&'()*+,;=:@/?", "\u00e9/"]


def _outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """What ``fn`` gives: ("ok", its result; urlsplit's as a plain tuple) or
    ("error", the exception's type and text)."""
    try:
        result = fn(*args, **kwargs)
    except Exception as err:
        return "error", type(err), str(err)
    return "ok", tuple(result) if fn.__name__ == "urlsplit" else result


@pytest.mark.parametrize("target", TARGETS)
def test_urlsplit_gives_urllib_parses_parts(target: str) -> None:
    assert _outcome(_uri.urlsplit, target) == _outcome(urllib.parse.urlsplit, target)


@pytest.mark.parametrize("safe", SAFES)
@pytest.mark.parametrize("text", [*TARGETS, "a.b-c_d~e", "a b", "a/b", "a%b", "[x]", "\u00e9"])
def test_quote_and_unquote_give_urllib_parses_strings(text: str, safe: str) -> None:
    assert _outcome(_uri.quote, text, safe=safe) == _outcome(urllib.parse.quote, text, safe=safe)
    assert _outcome(_uri.unquote, text) == _outcome(urllib.parse.unquote, text)


def test_random_strings_give_urllib_parses_results() -> None:
    rng = random.Random(18)
    alphabet = "ax:/%[]?#@.-_~+ \t\\\u00e9091AZ!$&'()*,;="
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 14)))
        for prefix in ("", "xds:", "xds://", "xds:///", "xdstp://a/"):
            s = prefix + text
            assert _outcome(_uri.urlsplit, s) == _outcome(urllib.parse.urlsplit, s), s
            assert _outcome(_uri.unquote, s) == _outcome(urllib.parse.unquote, s), s
            safe = rng.choice(SAFES)
            assert _outcome(_uri.quote, s, safe=safe) == _outcome(
                urllib.parse.quote, s, safe=safe
            ), (s, safe)


def _printed_by(code: str) -> list[str]:
    """The words ``code`` prints in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.split()


def test_a_plain_target_and_name_do_not_load_urllib_parse() -> None:
    code = (
        "import sys\n"
        "from pyxds import _uri\n"
        "assert _uri.urlsplit('xds:///echo.svc:8080').path == '/echo.svc:8080'\n"
        "assert _uri.quote('authority.example', safe=\"!$&'()*+,;=:@[]\") == 'authority.example'\n"
        "assert _uri.unquote('echo') == 'echo'\n"
        "print('urllib.parse' in sys.modules, 'ipaddress' in sys.modules)\n"
    )
    assert _printed_by(code) == ["False", "False"]


def test_threads_taking_the_long_way_at_once_in_a_fresh_process_all_get_urllib_parses_results() -> (
    None
):
    """The first input that is not plain loads urllib.parse under the import
    lock: eight threads asking at once all get its answer."""
    code = (
        "import sys, threading\n"
        "assert 'urllib.parse' not in sys.modules\n"
        "from pyxds import _uri\n"
        "target = 'xds://[::1]:80/a%20b?q=1#f'\n"
        "barrier, seen, errors = threading.Barrier(8), [], []\n"
        "def first():\n"
        "    barrier.wait(10)\n"
        "    try:\n"
        "        parts = tuple(_uri.urlsplit(target))\n"
        "        seen.append((parts, _uri.quote('a b'), _uri.unquote('a%20b')))\n"
        "    except BaseException as err:\n"
        "        errors.append(repr(err))\n"
        "threads = [threading.Thread(target=first) for _ in range(8)]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join(30)\n"
        "import urllib.parse\n"
        "want = (tuple(urllib.parse.urlsplit(target)), 'a%20b', 'a b')\n"
        "print(len(seen), all(s == want for s in seen), errors)\n"
    )
    assert _printed_by(code) == ["8", "True", "[]"]
