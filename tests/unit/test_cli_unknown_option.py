"""An unknown option of a subcommand names that subcommand's help."""

from __future__ import annotations

import pytest

from pyxds.cli.main import main


@pytest.mark.parametrize(
    ("command", "help_of"),
    [("serve", "serve"), ("server", "serve"), ("inspect", "inspect"), ("demo", "demo")],
)
def test_an_unknown_option_of_a_command_points_at_that_commands_help(command, help_of, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--frob"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unrecognized arguments: --frob" in line
    assert f"(see 'pyxds {help_of} --help')" in line  # an alias: its command's


def test_an_unknown_command_still_points_at_the_top_help(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["frob"])
    assert exited.value.code == 2
    assert "(see 'pyxds --help')" in capsys.readouterr().err
