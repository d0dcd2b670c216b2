"""``pyxds inspect TARGET``: what a pyxds channel to TARGET resolves to.

Opens ``pyxds.insecure_channel(TARGET)`` with the given bootstrap (or the
``GRPC_XDS_BOOTSTRAP``/``GRPC_XDS_BOOTSTRAP_CONFIG`` environment, as any gRPC
client), waits until the xDS resources arrive and prints the tree (rich):
listener, route table, clusters with type, LB policy, priorities, localities
and endpoints (health, connectivity), NACK reasons and fields gRPC ignores.
``--json`` prints ``channel.config_dump()``; ``--watch`` keeps printing as it
changes. Exit 1 with one line when the control plane cannot be reached or the
listener does not exist.  ``--server ADDRESS`` shows instead the Listener an
xDS-enabled server on ADDRESS gets (:mod:`pyxds.cli.inspect_server`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from pyxds.cli.errors import USAGE, CliError, seconds

HELP = "connect to an xDS target as a client would and print the resolved config"
DESCRIPTION = (
    "Connect to TARGET (xds:///SERVICE) as a pyxds client would and print what it "
    "resolves to: listener, virtual hosts and routes, clusters (type, LB policy, "
    "priorities, localities, endpoints with health and connectivity), NACK reasons "
    "and fields gRPC ignores. The bootstrap comes from --bootstrap, else from "
    "GRPC_XDS_BOOTSTRAP or GRPC_XDS_BOOTSTRAP_CONFIG."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="TARGET", nargs="?", help="the channel target, e.g. xds:///greeter"
    )
    parser.add_argument(
        "--server",
        metavar="ADDRESS",
        help="show the Listener of an xDS-enabled server listening on ADDRESS "
        "(e.g. 0.0.0.0:50051) instead of a channel target",
    )
    parser.add_argument(
        "--template",
        metavar="TEMPLATE",
        help="with --server: the Listener name template (default: the bootstrap's "
        "server_listener_resource_name_template)",
    )
    parser.add_argument(
        "--bootstrap", metavar="FILE", help="xDS bootstrap JSON file (default: the environment)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the raw channel.config_dump() as JSON"
    )
    parser.add_argument(
        "--watch", action="store_true", help="keep running and print again on every change"
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=20.0,
        metavar="SECONDS",
        help="how long to wait for the xDS resources (default: 20)",
    )


def _bootstrap(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(what the channel is given, the parsed bootstrap)``; errors exit 2."""
    from pyxds.xds.bootstrap import BootstrapError, load_bootstrap

    source: Any = args.bootstrap
    if source == "":
        raise CliError("--bootstrap '': expected the path of a bootstrap JSON file", USAGE)
    if source is None and not (
        os.environ.get("GRPC_XDS_BOOTSTRAP") or os.environ.get("GRPC_XDS_BOOTSTRAP_CONFIG")
    ):
        raise CliError(
            "no xDS bootstrap: pass --bootstrap FILE or set GRPC_XDS_BOOTSTRAP "
            "(pyxds serve prints one)",
            USAGE,
        )
    try:
        return source, load_bootstrap(source)
    except BootstrapError as e:
        raise CliError(f"{e} (fix the bootstrap; see docs/bootstrap.md)", USAGE) from None


def _check_target(target: str) -> None:
    """An ``xds:`` target (gRFC A27), or a usage error saying what to write."""
    if target.startswith("xds:"):
        return
    if not target:
        raise CliError("TARGET '': expected an xDS target, e.g. xds:///greeter", USAGE)
    if ":" not in target and "/" not in target:
        raise CliError(
            f"{target}: not an xDS target (no scheme): did you mean xds:///{target}?", USAGE
        )
    raise CliError(f"{target}: inspect shows xDS targets, e.g. xds:///greeter", USAGE)


def _server_uri(bootstrap: Any) -> str:
    servers = getattr(bootstrap, "xds_servers", ()) or ()
    return getattr(servers[0], "server_uri", "?") if servers else "?"


def _problem(dump: dict[str, Any], uri: str) -> CliError | None:
    """A reason to give up now, or None."""
    from pyxds.cli.inspect_model import resources

    manager = (dump.get("resolver") or {}).get("dependency_manager") or {}
    listener = manager.get("listener") or ""
    entry = resources(dump).get(("Listener", listener))
    if entry is not None and entry.get("client_status") == "DOES_NOT_EXIST":
        return CliError(
            f"listener {listener!r} does not exist on the control plane at {uri} "
            "(check the target's service name and the served resources)"
        )
    if dump.get("xds_config") is None and dump.get("state") == "TRANSIENT_FAILURE":
        status = str(dump.get("status", ""))
        if "no responses received" in status or "failed to connect" in status:
            cause = status.rsplit("last error: ", 1)[-1].rsplit("status: ", 1)[-1]
            return CliError(
                f"cannot reach the control plane at {uri} ({cause}); "
                "is it running? check server_uri in the bootstrap"
            )
        if "not present in bootstrap config" in status:  # xds://AUTHORITY/... (A47)
            cause = status.rsplit("xds resolver: ", 1)[-1]
            return CliError(
                f"{dump.get('target')}: {cause} (add it to the bootstrap's authorities, "
                "or use xds:///SERVICE)",
                USAGE,
            )
    return None


def _settled(dump: dict[str, Any]) -> bool:
    """Resources arrived and every subchannel attempted a connection."""
    if dump.get("xds_config") is None:
        return False
    client = dump.get("xds_client") or {}
    if any(e.get("client_status") == "REQUESTED" for e in client.get("generic_xds_configs", [])):
        return False
    states = [s.get("state") for s in (dump.get("subchannels") or {}).values()]
    return all(s in ("READY", "TRANSIENT_FAILURE") for s in states)


def _printable(dump: dict[str, Any]) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads(json.dumps(dump, default=str))
    return plain


def run(args: argparse.Namespace) -> int:
    import pyxds
    from pyxds.cli.inspect_view import render

    source, bootstrap = _bootstrap(args)
    uri = _server_uri(bootstrap)
    if args.server is not None:
        if args.target is not None:
            raise CliError("give a TARGET or --server ADDRESS, not both", USAGE)
        from pyxds.cli import inspect_server

        return inspect_server.run(args, source, bootstrap, uri)
    if args.target is None:
        raise CliError("give a TARGET (xds:///SERVICE) or --server ADDRESS", USAGE)
    _check_target(args.target)
    channel = pyxds.insecure_channel(args.target, bootstrap=source)
    try:
        channel.subscribe(lambda _state: None, try_to_connect=True)
        deadline = time.monotonic() + args.timeout
        dump = channel.config_dump()
        while not _settled(dump):
            problem = _problem(dump, uri)
            if problem is not None:
                raise problem
            if time.monotonic() > deadline:
                if dump.get("xds_config") is not None:
                    break  # resources arrived; some endpoint is still connecting
                raise CliError(
                    f"no xDS resources for {args.target} from {uri} within {args.timeout:g}s "
                    "(raise --timeout, or check the control plane)"
                )
            time.sleep(0.1)
            dump = channel.config_dump()
        last = None
        while True:
            shown = _printable(dump)
            if shown != last:
                if args.json:
                    print(json.dumps(shown, indent=None if args.watch else 2), flush=True)
                else:
                    render(shown, sys.stdout)
                last = shown
            if not args.watch:
                return 0
            time.sleep(0.5)
            dump = channel.config_dump()
    finally:
        channel.close()
