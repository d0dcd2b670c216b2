"""The xDS server as a user meets it: docs/examples/xds_server run as
subprocesses against ``pyxds serve`` (inbound Listener in a resource file),
``pyxds inspect --server``, CSDS, and a script that forgets ``stop()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cli_process import SRC, PyxdsProcess, cli_env, run_pyxds
from xds_server_fixtures import TEMPLATE, PyxdsServer, listener_name, wait_until

from pyxds.server import ManagementServer, Snapshot
from pyxds.server import inbound as ib

EXAMPLE = os.path.join(os.path.dirname(SRC), "docs", "examples", "xds_server")


def _serve(tmp_path, port):
    """``pyxds serve`` of the docs example's mesh.yaml moved to ``port``."""
    with open(os.path.join(EXAMPLE, "mesh.yaml"), encoding="utf-8") as f:
        text = f.read().replace("50051", str(port))
    path = tmp_path / "mesh.yaml"
    path.write_text(text)
    proc = PyxdsProcess("serve", str(path))
    proc.stdout_line()
    bootstrap = proc.stdout_line()
    return proc, bootstrap


def _python(script, *args, env, timeout=60):
    return subprocess.run(
        [sys.executable, os.path.join(EXAMPLE, script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_the_docs_example_runs(tmp_path, ports):
    # The example serves with SO_REUSEPORT (pyxds.serving): it joins this
    # hold, so no other program can bind the port while the test runs.
    port = ports.hold(shared=True).port
    serve, bootstrap = _serve(tmp_path, port)
    env = cli_env({"GRPC_XDS_BOOTSTRAP_CONFIG": bootstrap})
    server = subprocess.Popen(
        [sys.executable, os.path.join(EXAMPLE, "server.py"), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline().strip()
        if not first:  # the server exited: say why
            server.wait(10)
            assert server.stderr is not None
            raise AssertionError(f"server.py exited: {server.stderr.read()[-2000:]}")
        assert first == f"127.0.0.1:{port}: serving"
        client = _python("client.py", env=env)
        assert client.returncode == 0, client.stderr
        assert client.stdout.splitlines() == [
            "hello world",
            "Secret: PERMISSION_DENIED: Unauthorized RPC rejected",
        ]
        shown = run_pyxds(
            "inspect",
            "--server",
            f"127.0.0.1:{port}",
            "--template",
            TEMPLATE,
            "--json",
            env={"GRPC_XDS_BOOTSTRAP_CONFIG": bootstrap},
        )
        assert shown.returncode == 0, shown.stderr
        model = json.loads(shown.stdout)
        assert model["status"] == "ACKED" and model["verdict"] == "served: plaintext"
        (chain,) = model["filter_chains"]
        assert chain["http_filters"][0] == {
            "name": "deny-secret",
            "type": "RBAC",
            "action": "DENY",
            "policies": ["no-secrets"],
        }
    finally:
        server.kill()
        server.wait(10)
        serve.close()


def test_inspect_server_shows_why_a_listener_is_not_served(tmp_path):
    control = ManagementServer().start()
    try:
        address = "127.0.0.1:7"
        chains = [
            ib.filter_chain(name="mesh", tls=ib.downstream_tls(), source_ports=[1]),
            ib.filter_chain(name="plain"),
        ]
        control.set_snapshot(
            Snapshot(listeners=[ib.server_listener(listener_name(address), address, chains)])
        )
        boot = control.bootstrap(
            "inspect-server",
            server_listener_resource_name_template=TEMPLATE,
            certificate_providers={
                "default": {"plugin_name": "file_watcher", "config": {"ca_certificate_file": "x"}}
            },
        )
        shown = run_pyxds(
            "inspect", "--server", address, env={"GRPC_XDS_BOOTSTRAP_CONFIG": json.dumps(boot)}
        )
        assert shown.returncode == 0, shown.stderr
        text = " ".join(shown.stdout.split())
        assert "not served: filter chains on one listening port need different" in text
        assert "transport mTLS (client certificate required): identity 'default'" in text
    finally:
        control.stop()


def test_inspect_server_without_a_template_is_a_usage_error():
    control = ManagementServer().start()
    try:
        boot = json.dumps(control.bootstrap("x"))
        shown = run_pyxds(
            "inspect", "--server", "0.0.0.0:1", env={"GRPC_XDS_BOOTSTRAP_CONFIG": boot}
        )
        assert shown.returncode == 2
        assert "server_listener_resource_name_template" in shown.stderr
    finally:
        control.stop()


def test_csds_shows_the_servers_listener_its_scope_and_why_it_is_not_served():
    from pyxds.admin.csds import client_status_response

    control = ManagementServer().start()
    srv = PyxdsServer(control.bootstrap("csds", server_listener_resource_name_template=TEMPLATE))
    try:
        srv.start()
        other = ib.server_listener(listener_name(srv.address), "127.0.0.1:9", [ib.filter_chain()])
        control.set_snapshot(Snapshot(listeners=[other]))
        assert wait_until(lambda: srv.events, 10)
        (config,) = [c for c in client_status_response().config if c.node.id == "csds"]
        assert config.client_scope == "#server"
        (entry,) = [e for e in config.generic_xds_configs if e.name == listener_name(srv.address)]
        from envoy.admin.v3 import config_dump_shared_pb2

        assert entry.client_status == config_dump_shared_pb2.ClientResourceStatus.ACKED
        assert "xDS server not serving on" in entry.error_state.details
        assert "Address in LDS update does not match" in entry.error_state.details
        dump = srv.server.config_dump()
        (listed,) = [
            e for e in dump["generic_xds_configs"] if e["name"] == listener_name(srv.address)
        ]
        assert listed["client_status"] == "ACKED" and listed["serving"]["serving"] is False
    finally:
        srv.stop()
        control.stop()


_FORGETFUL = """
import json, os, sys, grpc
from concurrent import futures
import pyxds
boot = json.loads(os.environ["BOOT"])
server = pyxds.xds_server(futures.ThreadPoolExecutor(2), bootstrap=boot)
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("s.S", {})])
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
print("done", flush=True)
"""


def test_a_script_that_forgets_stop_exits():
    control = ManagementServer().start()
    try:
        boot = control.bootstrap("forgetful", server_listener_resource_name_template=TEMPLATE)
        env = cli_env({"BOOT": json.dumps(boot)})
        done = subprocess.run(
            [sys.executable, "-c", _FORGETFUL], capture_output=True, text=True, timeout=30, env=env
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-1] == "done"
    finally:
        control.stop()
