"""``pyxds inspect TARGET``: what a pyxds channel to TARGET resolves to."""

from __future__ import annotations

import argparse

from pyxds.cli.errors import CliError

HELP = "connect to an xDS target as a client would and print the resolved config"
DESCRIPTION = HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET", help="xds:///SERVICE target")


def run(args: argparse.Namespace) -> int:
    raise CliError("inspect: not implemented yet")
