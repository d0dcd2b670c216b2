"""``pyxds serve FILE...``: a file-driven xDS control plane (``server`` is an alias).

Serves the Listener, RouteConfiguration, Cluster and ClusterLoadAssignment
resources of YAML/JSON files (Envoy's JSON form, see docs/serve.md) over ADS
to any gRPC xDS client (pyxds, grpcio's C-core, grpc-go, grpc-java) or Envoy.
Files are re-read when they change (watchfiles) and on SIGHUP; a changed file
is pushed at once to every connected client as a new version, and a file that
fails to parse or validate is reported (file, line, field) while the last
good version stays served. Configs a client accepts but that cannot serve (a
locality without weight, a route to a cluster no file defines, ...:
:mod:`pyxds.server.lint`) are warned about on stderr, one line each, at start
and at every reload; ``--strict`` refuses them. Prints a bootstrap JSON line
for clients.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
import threading

from pyxds.cli.errors import USAGE, CliError, seconds

HELP = "serve xDS resources from YAML/JSON files, reloading them on change"
DESCRIPTION = (
    "Serve the xDS resources of YAML/JSON files over ADS to gRPC xDS clients and Envoy. "
    "Files are watched: an edit is pushed to every client as a new version; a file "
    "that fails to load is reported and the last good version stays served. "
    "SIGHUP reloads too. The first two lines printed are the address and a bootstrap "
    "JSON for clients (GRPC_XDS_BOOTSTRAP_CONFIG)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="resource file(s) served to every node without per-node files",
    )
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        dest="extra_files",
        metavar="FILE",
        help="same as a FILE argument (kept for older scripts)",
    )
    parser.add_argument(
        "--node-file",
        action="append",
        default=[],
        metavar="NODE_ID=FILE",
        help="serve FILE only to clients whose bootstrap node id is NODE_ID (repeatable)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on (default: 0, a free port)"
    )
    parser.add_argument(
        "--node-id",
        default="test-node",
        help="node id written in the printed bootstrap (default: test-node)",
    )
    parser.add_argument(
        "--no-validate",
        action="store_true",
        help="serve resources a gRPC client would reject (to test NACK handling)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse configs a client accepts but that cannot serve (the warnings become "
        "errors: exit 2 at start, the last good version stays served on reload)",
    )
    parser.add_argument(
        "--no-watch", action="store_true", help="reload only on SIGHUP, not on file changes"
    )
    parser.add_argument(
        "--lrs-interval",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="load reporting (LRS) interval asked of clients (default: 10)",
    )
    parser.add_argument(
        "--print-load-reports",
        action="store_true",
        help="print each load report received as a JSON line on stdout",
    )


def _node_files(specs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for spec in specs:
        node, sep, path = spec.partition("=")
        if not sep or not node or not path:
            raise CliError(
                f"--node-file {spec!r}: expected NODE_ID=FILE, e.g. --node-file canary=canary.yaml",
                USAGE,
            )
        out.setdefault(node, []).append(path)
    return out


def _check_listen_address(host: str, port: int) -> None:
    """Fail in one line on a host that is not an address of this machine (exit 2)
    or a taken port (exit 1), before grpc would log its own error or, with
    SO_REUSEPORT, share the port with another server."""
    from pyxds.server.server import bind_error

    if not host.strip("[]"):
        raise CliError("--host '': expected an address, e.g. 127.0.0.1 or 0.0.0.0", USAGE)
    err = bind_error(host, port)
    if err is None:
        return
    if err.errno in (errno.EADDRINUSE, errno.EACCES):
        why = "port taken?" if err.errno == errno.EADDRINUSE else "a port below 1024 needs root;"
        raise CliError(
            f"cannot listen on {host}:{port}: {err.strerror} "
            f"({why} pick another with --port, or --port 0 for a free one)"
        )
    raise CliError(
        f"--host {host}: cannot listen there: {err.strerror or err} "
        "(give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0)",
        USAGE,
    )


def _check_file(path: str) -> None:
    """A resource file the command can read, or a usage error naming why not."""
    if not path:
        raise CliError("an empty FILE name (give the path of a YAML/JSON resource file)", USAGE)
    if os.path.isdir(path):
        raise CliError(f"{path}: is a directory (give a YAML/JSON resource file)", USAGE)
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file (check the path)", USAGE)
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise CliError(
            f"{path}: cannot read: {e.strerror or e} (check its permissions)", USAGE
        ) from None


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from pyxds.server.files import ResourceFileError
    from pyxds.server.server import ManagementServer
    from pyxds.server.watch import CannotServeError, FileWatcher, ServedFiles

    files = list(args.files) + list(args.extra_files)
    node_files = _node_files(args.node_file)
    if not files and not node_files:
        raise CliError("no resource file given: pyxds serve FILE... (see docs/serve.md)", USAGE)
    for path in files + [p for paths in node_files.values() for p in paths]:
        _check_file(path)
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port}: expected 0..65535", USAGE)
    _check_listen_address(args.host, args.port)
    server = ManagementServer(args.host, args.port, lrs_interval=args.lrs_interval)
    if args.print_load_reports:
        server.lrs.on_report = lambda record: print(json.dumps(record.to_json()), flush=True)
    served = ServedFiles(
        server, files, node_files, validate=not args.no_validate, log=_log, strict=args.strict
    )
    try:
        served.load_initial()
    except CannotServeError as e:
        raise CliError(f"{e}: fix them (see the lines above), or drop --strict", USAGE) from None
    except ResourceFileError as e:
        raise CliError(f"{e} (fix the file, or --no-validate to serve it anyway)", USAGE) from None
    try:
        server.start()
    except RuntimeError:
        raise CliError(
            f"cannot listen on {args.host}:{args.port} (port taken? pick another with --port)"
        ) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if hasattr(signal, "SIGHUP"):
        # A signal handler must not block: reload on a thread.
        signal.signal(
            signal.SIGHUP,
            lambda *_: threading.Thread(target=served.reload, daemon=True).start(),
        )
    watcher = None if args.no_watch else FileWatcher(served.paths, served.reload).start()
    names = ", ".join(files + [f"{n}={p}" for n, ps in node_files.items() for p in ps])
    print(f"pyxds serve: serving {names} on {server.address}", flush=True)
    print(json.dumps(server.bootstrap(node_id=args.node_id)), flush=True)
    _log(
        "clients: GRPC_XDS_BOOTSTRAP_CONFIG='<the JSON line above>' "
        + ("(files are watched; " if watcher else "(")
        + "SIGHUP reloads; Ctrl-C stops)"
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        if watcher is not None:
            watcher.stop()
        server.stop()
    return 0
