"""``python -m pyxds.server --file resources.yaml --port N``: serve a resource file until killed.

Prints the server address and a bootstrap for clients, then serves until
SIGINT/SIGTERM. SIGHUP reloads the file (a bad file is reported and the
previous resources stay served).
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
    args = parser.parse_args(argv)
    try:
        snapshot = load_resources(args.file)
    except ResourceFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = ManagementServer(args.host, args.port, snapshot=snapshot)
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
