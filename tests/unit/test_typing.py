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


#: one module per case, type checked in one mypy run (each run takes
#: seconds; the cases are independent modules, so one run reports each)
CASES = {
    "right_use": """
        channel = pyxds.insecure_channel("xds:///x")
        takes_channel(channel)
        takes_aio_channel(pyxds.aio.insecure_channel("xds:///x"))
        reply: str = channel.unary_unary(
            "/m", request_serializer=ser, response_deserializer=deser
        )("hi")
        """,
    "sync_is_no_aio": 'takes_aio_channel(pyxds.insecure_channel("xds:///x"))\n',
    "response_type": """
        number: int = pyxds.insecure_channel("xds:///x").unary_unary(
            "/m", request_serializer=ser, response_deserializer=deser
        )("hi")
        """,
    "aio_response_type": """
        async def main() -> None:
            call = pyxds.aio.insecure_channel("xds:///x").unary_unary(
                "/m", request_serializer=ser, response_deserializer=deser
            )("hi")
            number: int = await call
        """,
}


@pytest.fixture(scope="module")
def mypy_says(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bool, str]]:
    """Per case: (mypy found an error in its module, what mypy said of it)."""
    folder = tmp_path_factory.mktemp("typing")
    paths = []
    for name, body in CASES.items():
        module = folder / f"{name}.py"
        module.write_text(_PRELUDE + textwrap.dedent(body), encoding="utf-8")
        paths.append(str(module))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2: mypy itself failed
    said: dict[str, tuple[bool, str]] = {}
    for name in CASES:
        lines = [
            line
            for line in result.stdout.splitlines()
            if pathlib.Path(line.split(":", 1)[0]).name == f"{name}.py"
        ]
        said[name] = (any(": error:" in line for line in lines), "\n".join(lines))
    return said


def test_right_use_of_the_channels_type_checks(mypy_says: dict[str, tuple[bool, str]]) -> None:
    failed, output = mypy_says["right_use"]
    assert not failed, output


def _errors(mypy_says: dict[str, tuple[bool, str]], case: str) -> str:
    """What mypy said of ``case``, which it must have found an error in."""
    failed, output = mypy_says[case]
    assert failed, output
    return output


def test_a_sync_channel_is_no_aio_channel(mypy_says: dict[str, tuple[bool, str]]) -> None:
    output = _errors(mypy_says, "sync_is_no_aio")
    assert '"takes_aio_channel" has incompatible type "XdsChannel"' in output
    assert "[arg-type]" in output


def test_a_response_has_the_deserializers_type_not_any(
    mypy_says: dict[str, tuple[bool, str]],
) -> None:
    output = _errors(mypy_says, "response_type")
    assert 'expression has type "str", variable has type "int"' in output


def test_an_aio_response_has_the_deserializers_type_not_any(
    mypy_says: dict[str, tuple[bool, str]],
) -> None:
    output = _errors(mypy_says, "aio_response_type")
    assert 'expression has type "str", variable has type "int"' in output
