"""The pyxds command: serve xDS resources from files, inspect a target, run the demo."""

from __future__ import annotations

import argparse
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


def _command_parser(parser: Parser, command: str) -> Parser:
    """The subparser of ``command`` (an alias names its command's parser)."""
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub: Parser = commands.choices[command]
    return sub


def main(argv: list[str] | None = None) -> int:
    # pyxds logs warnings (a failed ADS stream, ...) that the commands report
    # themselves in one line; without this Python would print them too.
    logging.getLogger("pyxds").addHandler(logging.NullHandler())
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse reports a subcommand's unknown option as the top parser's
        # ("see 'pyxds --help'", which does not list it): say whose it is.
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
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
