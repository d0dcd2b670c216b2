"""The pyxds command: serve xDS resources from files, inspect a target, run the demo."""

from __future__ import annotations

import argparse
import difflib
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


def _commands(parser: Parser) -> dict[str, Parser]:
    """Each command name and alias, with its parser (an alias: its command's)."""
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    choices: dict[str, Parser] = commands.choices
    return choices


def _knows(parser: Parser, token: str) -> bool:
    """``parser`` has option ``token`` (``--opt=value`` and unique ``--op`` too)."""
    option = token.split("=", 1)[0]
    options = parser._option_string_actions
    if option in options:
        return True
    return (
        option.startswith("--") and len(option) > 2 and any(o.startswith(option) for o in options)
    )


def _check_command(parser: Parser, argv: list[str]) -> None:
    """Name the real mistake before the subcommand runs: an unknown option of
    ``pyxds`` itself, a missing or unknown command.  (argparse would say that
    COMMAND is required after an unknown option, and its "invalid choice"
    wording changes between Python versions.)"""
    choices = _commands(parser)
    rest = [t for t in argv if t != "--"]
    words = [t for t in rest if not t.startswith("-") or t == "-"]
    command = words[0] if words else None
    for token in rest:
        if token == command:
            break
        if _knows(parser, token):
            return  # --help or --version: argparse prints and exits
        hint = "pyxds takes only --help and --version before the command"
        owner = next((w for w in words if w in choices and _knows(choices[w], token)), None)
        if owner is not None:
            hint = f"options of a command go after it: pyxds {owner} {token} ..."
        parser.error(f"unknown option {token}; {hint}")
    names = ", ".join(choices)
    if command is None:
        parser.error(f"no command given: one of {names}")
    if command not in choices:
        close = difflib.get_close_matches(command, choices, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        parser.error(f"unknown command {command!r}{guess}: the commands are {names}")


def main(argv: list[str] | None = None) -> int:
    """Run ``pyxds ARGV``; the exit status (docs/cli.md).  Ctrl-C at any point,
    loading the commands too (a second of imports), is 130 without a traceback."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        return 130


def _run(argv: list[str] | None) -> int:
    # pyxds logs warnings (a failed ADS stream, ...) that the commands report
    # themselves in one line; without this Python would print them too.
    logging.getLogger("pyxds").addHandler(logging.NullHandler())
    parser = build_parser()
    _check_command(parser, sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse reports a subcommand's unknown option as the top parser's
        # ("see 'pyxds --help'", which does not list it): say whose it is.
        _commands(parser)[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.run(args) or 0
    except CliError as e:
        fail(str(e))
        return e.code


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["USAGE", "build_parser", "main"]
