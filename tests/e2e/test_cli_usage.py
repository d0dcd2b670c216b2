"""The ``pyxds`` command's help, version and failures, run as a user would.

Bad input gives one line naming the cause and the fix, exit 2 for usage
errors and 1 for runtime ones, and never a traceback.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import socket
import subprocess
import sys
import time

import pytest
from cli_process import cli_env, run_pyxds

COMMANDS = ("serve", "server", "inspect", "demo")


def one_line_error(done, code: int, *words: str) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_version_prints_the_package_version():
    done = run_pyxds("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("pyxds ") and done.stdout.split()[1][0].isdigit()


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_describes_every_option_without_raw_markup(command):
    done = run_pyxds(*([command] if command else []), "--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for markup in ("``", "[bold", "[/", ":func:", ":class:"):
        assert markup not in text
    assert "options:" in text


def test_every_option_of_every_command_has_help_text():
    import argparse

    from pyxds.cli.main import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in [("pyxds", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_unknown_command_is_a_usage_error():
    one_line_error(run_pyxds("frobnicate"), 2, "unknown command 'frobnicate'", "pyxds --help")


def test_python_dash_m_pyxds_is_the_pyxds_command():
    def python_m_pyxds(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pyxds", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
        )

    from pyxds import __version__

    assert python_m_pyxds("--version").stdout == f"pyxds {__version__}\n"
    one_line_error(python_m_pyxds("--bogus"), 2, "unknown option --bogus", "pyxds --help")


def test_unknown_flag_is_a_usage_error():
    one_line_error(run_pyxds("serve", "--frob", "x.yaml"), 2, "--frob", "--help")


def test_serve_of_a_missing_file_is_a_usage_error(tmp_path):
    one_line_error(run_pyxds("serve", str(tmp_path / "nope.yaml")), 2, "nope.yaml", "no such file")


def test_serve_of_unreadable_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("resources:\n- a: 1\n- b: c: d\n")
    one_line_error(run_pyxds("serve", str(path)), 2, "bad.yaml:3: invalid YAML", "fix the file")


def test_serve_on_a_taken_port_is_a_runtime_error(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("resources: []\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_pyxds("serve", "--port", str(port), str(path))
    one_line_error(done, 1, f"127.0.0.1:{port}", "--port")


def test_inspect_with_a_bootstrap_without_xds_servers_is_a_usage_error(tmp_path):
    path = tmp_path / "bootstrap.json"
    path.write_text(json.dumps({"node": {"id": "n"}}))
    one_line_error(
        run_pyxds("inspect", "xds:///x", "--bootstrap", str(path)), 2, "xds_servers", "bootstrap"
    )


def test_inspect_without_any_bootstrap_says_how_to_give_one():
    one_line_error(run_pyxds("inspect", "xds:///x"), 2, "--bootstrap", "GRPC_XDS_BOOTSTRAP")


def test_inspect_with_a_missing_bootstrap_file_is_a_usage_error(tmp_path):
    one_line_error(
        run_pyxds("inspect", "xds:///x", "--bootstrap", str(tmp_path / "nope.json")),
        2,
        "nope.json",
    )


def test_demo_no_live_passes_in_under_a_minute():
    done = run_pyxds("demo", "--no-live", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo passed" in done.stdout
    assert "\x1b[" not in done.stdout  # plain text for logs
    # step 6 (A44): failures without a retry policy, none once it is pushed
    assert "6. a route retry policy (A44) hides a failing backend" in done.stdout
    before = re.search(r"no retry policy.*?: 300 RPCs, (\d+) failed", done.stdout)
    after = re.search(r"pushed retry_policy.*then 300 RPCs, (\d+) failed", done.stdout)
    retried = re.search(r"(\d+) attempts failed on broken and were retried", done.stdout)
    assert before and after and retried, done.stdout
    assert int(before.group(1)) > 0
    assert int(after.group(1)) == 0
    assert int(retried.group(1)) > 0


def test_demo_live_view_walks_every_step_including_the_retry_policy():
    # the rich live view needs a terminal: run the command on a pseudo-terminal
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyxds.cli", "demo"],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env=cli_env({"COLUMNS": "200", "LINES": "60", "TERM": "xterm"}),
    )
    os.close(secondary)
    chunks = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(primary, 65536)
            except OSError:  # the other end closed (Linux: EIO)
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(primary)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    assert code == 0, text[-3000:]
    assert "a retry policy hides a failing backend" in text  # the progress line
    assert "pushed retry_policy" in text  # the timeline panel
    assert "demo passed" in text
