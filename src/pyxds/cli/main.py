"""The ``pyxds`` command: ``pyxds demo`` and ``pyxds server --file F``."""

from __future__ import annotations

import argparse
import sys

from pyxds import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyxds", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pyxds {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the whole stack on loopback with a printed timeline")
    serve = commands.add_parser("server", help="serve xDS resources from a YAML/JSON file")
    serve.add_argument("--file", required=True)
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--lrs-interval", type=float, default=10.0)
    serve.add_argument("--print-load-reports", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from pyxds.cli.demo import run

        return run()
    from pyxds.server.__main__ import main as serve_main

    argv = ["--file", args.file, "--port", str(args.port), "--lrs-interval", str(args.lrs_interval)]
    if args.print_load_reports:
        argv.append("--print-load-reports")
    return serve_main(argv) or 0


if __name__ == "__main__":
    sys.exit(main())
