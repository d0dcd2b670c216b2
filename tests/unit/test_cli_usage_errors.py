"""The ``pyxds`` command's usage errors, argv-level (docs/cli.md "When
something is wrong"): one line on stderr naming the cause and what to do,
exit 2, before any control plane or channel starts."""

from __future__ import annotations

import builtins
import json

import pytest

from pyxds.cli import serve
from pyxds.cli.main import main

COMMANDS = "serve, server, inspect, demo"


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of ``pyxds ARGV``, which must exit 2."""
    with pytest.raises(SystemExit) as exited:
        code = main(argv)
        raise SystemExit(code)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    assert "Traceback" not in err
    return line


@pytest.mark.parametrize("argv", [["--bogus"], ["--bogus", "serve", "x.yaml"], ["-x"]])
def test_an_unknown_option_before_the_command_is_named(argv, capsys):
    line = usage_error(argv, capsys)
    assert f"unknown option {argv[0]}" in line
    assert "(see 'pyxds --help')" in line
    assert "required" not in line  # not "the following arguments are required: COMMAND"


def test_a_command_option_given_before_the_command_says_to_put_it_after(capsys):
    line = usage_error(["--port", "5", "serve", "x.yaml"], capsys)
    assert "unknown option --port" in line
    assert "pyxds serve --port" in line


@pytest.mark.parametrize("word", ["frob", ""])
def test_an_unknown_command_names_itself_and_lists_the_commands(word, capsys):
    line = usage_error([word], capsys)
    assert f"unknown command {word!r}" in line
    assert COMMANDS in line and "(see 'pyxds --help')" in line


def test_a_misspelt_command_suggests_the_close_one(capsys):
    assert "did you mean 'inspect'?" in usage_error(["inspct"], capsys)


def test_no_command_lists_the_commands(capsys):
    line = usage_error([], capsys)
    assert "no command given" in line and COMMANDS in line


@pytest.mark.parametrize("argv", [["--version", "frob"], ["--vers"]])
def test_version_still_prints_before_anything_else(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("pyxds ")


@pytest.mark.parametrize(
    ("command", "option"),
    [("serve", "--lrs-interval"), ("inspect", "--timeout")],
)
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_seconds_must_be_a_finite_number_above_zero(command, option, value, tmp_path, capsys):
    path = tmp_path / "empty.yaml"
    path.write_text("resources: []\n")
    line = usage_error([command, f"{option}={value}", str(path)], capsys)
    assert f"argument {option}: {value!r}: expected a finite number of seconds > 0" in line
    assert f"(see 'pyxds {command} --help')" in line


def test_serve_of_an_empty_file_name_says_so(capsys):
    assert "an empty FILE name" in usage_error(["serve", ""], capsys)


def test_serve_of_a_directory_says_it_is_one(tmp_path, capsys):
    line = usage_error(["serve", "--node-file", f"canary={tmp_path}"], capsys)
    assert f"{tmp_path}: is a directory" in line


def test_serve_of_an_unreadable_file_names_the_cause(tmp_path, monkeypatch, capsys):
    path = tmp_path / "mesh.yaml"
    path.write_text("resources: []\n")

    def denied(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied")
        return builtins.open(file, *args, **kwargs)

    monkeypatch.setattr(serve, "open", denied, raising=False)  # root reads a chmod 000 file
    line = usage_error(["serve", str(path)], capsys)
    assert "mesh.yaml: cannot read: Permission denied (check its permissions)" in line


@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("", "--host '': expected an address"),
        ("192.0.2.1", "--host 192.0.2.1: cannot listen there: Cannot assign requested address"),
        ("no-such-host.invalid", "--host no-such-host.invalid: cannot listen there"),
    ],
)
def test_serve_on_a_host_that_is_not_this_machine_is_a_usage_error(host, words, tmp_path, capsys):
    path = tmp_path / "empty.yaml"
    path.write_text("resources: []\n")
    line = usage_error(["serve", "--host", host, str(path)], capsys)
    assert words in line
    assert "port taken" not in line


@pytest.fixture
def bootstrap(tmp_path) -> str:
    path = tmp_path / "bootstrap.json"
    server = {"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]}
    path.write_text(json.dumps({"xds_servers": [server], "node": {"id": "n"}}))
    return str(path)


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("", "TARGET '': expected an xDS target, e.g. xds:///greeter"),
        ("greeter", "greeter: not an xDS target (no scheme): did you mean xds:///greeter?"),
        ("dns:///greeter", "dns:///greeter: inspect shows xDS targets"),
    ],
)
def test_inspect_of_a_target_that_is_not_xds_says_what_to_write(target, words, bootstrap, capsys):
    assert words in usage_error(["inspect", target, "--bootstrap", bootstrap], capsys)


def test_inspect_with_an_empty_bootstrap_path_says_so(capsys):
    line = usage_error(["inspect", "xds:///x", "--bootstrap", ""], capsys)
    assert "--bootstrap '': expected the path of a bootstrap JSON file" in line


def test_inspect_with_a_binary_bootstrap_names_the_encoding(tmp_path, capsys):
    path = tmp_path / "bootstrap.json"
    path.write_bytes(b"\xff\xfe{}")
    line = usage_error(["inspect", "xds:///x", "--bootstrap", str(path)], capsys)
    assert "bootstrap.json: not UTF-8 JSON: byte 0" in line


def test_inspect_server_of_an_empty_address_names_the_option(bootstrap, capsys):
    line = usage_error(["inspect", "--server", "", "--bootstrap", bootstrap], capsys)
    assert "--server: listening address '': expected host:port" in line


def test_inspect_server_with_an_empty_template_names_the_option(bootstrap, capsys):
    argv = ["inspect", "--server", "0.0.0.0:5", "--template", "", "--bootstrap", bootstrap]
    assert "--template '': expected a Listener name template" in usage_error(argv, capsys)


@pytest.mark.parametrize("where", ["build_parser", "_check_command"])
def test_ctrl_c_while_the_command_loads_is_130_without_a_traceback(where, monkeypatch, capsys):
    from pyxds.cli import main as cli_main

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, where, interrupted)
    assert main(["inspect", "xds:///x"]) == 130
    assert capsys.readouterr() == ("", "")


def test_inspect_of_an_authority_the_bootstrap_lacks_says_so_at_once(bootstrap, capsys):
    line = usage_error(["inspect", "xds://other/greeter", "--bootstrap", bootstrap], capsys)
    assert 'xds://other/greeter: authority "other" not present in bootstrap config' in line
    assert "authorities" in line
