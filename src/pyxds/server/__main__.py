"""``python -m pyxds.server --file resources.yaml --port N``: serve a resource file until killed.

Prints the server address and a bootstrap for clients, then serves until
SIGINT/SIGTERM. SIGHUP reloads the file (a bad file is reported and the
previous resources stay served).

The server also takes load reports (LRS, A27) from clusters with
``lrs_server: {self: {}}``, asking for every cluster each
``--lrs-interval`` seconds; ``--print-load-reports`` prints each one as a
JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from pyxds.server.files import ResourceFileError, load_resources
from pyxds.server.server import ManagementServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyxds.server", description=__doc__)
    parser.add_argument("--file", required=True, help="YAML or JSON resource file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--node-id", default="test-node", help="node id in the printed bootstrap")
    parser.add_argument(
        "--lrs-interval", type=float, default=10.0, help="load reporting interval asked (s)"
    )
    parser.add_argument(
        "--print-load-reports", action="store_true", help="print load reports as JSON lines"
    )
    args = parser.parse_args(argv)
    try:
        snapshot = load_resources(args.file)
    except ResourceFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = ManagementServer(
        args.host, args.port, snapshot=snapshot, lrs_interval=args.lrs_interval
    )
    if args.print_load_reports:
        server.lrs.on_report = lambda record: print(json.dumps(record.to_json()), flush=True)
    try:
        server.start()
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def reload(*_: object) -> None:
        try:
            server.set_snapshot(load_resources(args.file))
            print(f"reloaded {args.file}", file=sys.stderr, flush=True)
        except Exception as e:  # never let a bad file kill the server from a signal handler
            print(f"reload failed, keeping the previous resources: {e}", file=sys.stderr)

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, reload)
    print(f"pyxds.server serving {args.file} on {server.address}", flush=True)
    print(json.dumps(server.bootstrap(node_id=args.node_id)), flush=True)
    while not stop.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
