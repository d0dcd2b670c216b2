"""The type check has teeth: code that misuses pyxds's public API fails
``mypy --strict`` (with the project's configuration), the same code used
right passes.  ``scripts/test.sh`` checks the package and the typed example
(tests/typing/typed_usage.py); this shows that check would catch a pyxds
channel typed as Any or as something other than grpcio's twin.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytest.importorskip("mypy")

_PRELUDE = """
import grpc
import grpc.aio
import pyxds
import pyxds.aio


def ser(request: str) -> bytes:
    return request.encode()


def deser(data: bytes) -> str:
    return data.decode()


def takes_channel(channel: grpc.Channel) -> None: ...


def takes_aio_channel(channel: grpc.aio.Channel) -> None: ...


"""


def _mypy(tmp_path: pathlib.Path, body: str) -> subprocess.CompletedProcess[str]:
    module = tmp_path / "usage.py"
    module.write_text(_PRELUDE + textwrap.dedent(body), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", str(module)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_right_use_of_the_channels_type_checks(tmp_path: pathlib.Path) -> None:
    result = _mypy(
        tmp_path,
        """
        channel = pyxds.insecure_channel("xds:///x")
        takes_channel(channel)
        takes_aio_channel(pyxds.aio.insecure_channel("xds:///x"))
        reply: str = channel.unary_unary(
            "/m", request_serializer=ser, response_deserializer=deser
        )("hi")
        """,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_sync_channel_is_no_aio_channel(tmp_path: pathlib.Path) -> None:
    result = _mypy(tmp_path, 'takes_aio_channel(pyxds.insecure_channel("xds:///x"))\n')
    assert result.returncode == 1
    assert '"takes_aio_channel" has incompatible type "XdsChannel"' in result.stdout
    assert "[arg-type]" in result.stdout


def test_a_response_has_the_deserializers_type_not_any(tmp_path: pathlib.Path) -> None:
    result = _mypy(
        tmp_path,
        """
        number: int = pyxds.insecure_channel("xds:///x").unary_unary(
            "/m", request_serializer=ser, response_deserializer=deser
        )("hi")
        """,
    )
    assert result.returncode == 1
    assert 'expression has type "str", variable has type "int"' in result.stdout


def test_an_aio_response_has_the_deserializers_type_not_any(tmp_path: pathlib.Path) -> None:
    result = _mypy(
        tmp_path,
        """
        async def main() -> None:
            call = pyxds.aio.insecure_channel("xds:///x").unary_unary(
                "/m", request_serializer=ser, response_deserializer=deser
            )("hi")
            number: int = await call
        """,
    )
    assert result.returncode == 1
    assert 'expression has type "str", variable has type "int"' in result.stdout
