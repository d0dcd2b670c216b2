"""The pyxds command: serve xDS resources from files, inspect a target, run the demo."""

from __future__ import annotations

import logging
import sys

from pyxds.cli.errors import USAGE, CliError, Parser, fail


def _version() -> str:
    from pyxds import __version__

    return __version__


def build_parser() -> Parser:
    """The whole command line (every subcommand registers its options here)."""
    from pyxds.cli import demo, inspect, serve

    parser = Parser(
        prog="pyxds",
        description="gRPC's client-side xDS in pure Python: a file-driven xDS control "
        "plane, a resolved-config inspector and a live demo.",
        epilog="Run 'pyxds COMMAND --help' for the options of a command.",
    )
    parser.add_argument(
        "--version", action="version", version=f"pyxds {_version()}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    for module, names in ((serve, ("serve", "server")), (inspect, ("inspect",)), (demo, ("demo",))):
        sub = commands.add_parser(
            names[0],
            aliases=list(names[1:]),
            help=module.HELP,
            description=module.DESCRIPTION,
        )
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    # pyxds logs warnings (a failed ADS stream, ...) that the commands report
    # themselves in one line; without this Python would print them too.
    logging.getLogger("pyxds").addHandler(logging.NullHandler())
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except CliError as e:
        fail(str(e))
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["USAGE", "build_parser", "main"]
