"""``LBConfigError``: a bad LB config, with the JSON path of the bad field.

ARCHITECTURE.md "The LB policy API": the message names the JSON path, e.g.
``priority_experimental.children["p0"].config[0].pick_first.shuffleAddressList:
expected boolean, got "yes"``.  Parents re-raise a child's error with their own
path prefix via :meth:`LBConfigError.under`.
"""

from __future__ import annotations

import json
from typing import Any

from pyxds._duration import DurationError, parse_duration


class LBConfigError(ValueError):
    """Invalid load-balancing config.  ``path`` is the JSON path of the field."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)

    def under(self, prefix: str) -> LBConfigError:
        """The same error seen from a parent whose field is ``prefix``."""
        if not self.path:
            path = prefix
        elif self.path.startswith("[") or self.path.startswith("."):
            path = prefix + self.path
        else:
            path = f"{prefix}.{self.path}"
        return LBConfigError(path, self.problem)


def describe(value: Any) -> str:
    """Render a JSON value for an error message (``"yes"``, ``3``, ``null``)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def key_path(parent: str, key: str) -> str:
    """``parent["key"]`` for map keys, ``parent.key`` for field names."""
    return f"{parent}[{json.dumps(key)}]"


def field_path(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def drop_nulls(value: Any) -> Any:
    """``value`` with every object member whose value is JSON null left out,
    at any depth (array elements are kept as they are).

    grpcio 1.85 (C-core's JSON object loader) reads a field set to null as a
    field that is not there: an optional one takes its default, a required
    one is "field not present" (``{"cds_experimental": {"cluster": null}}``),
    which is also what proto3 JSON says of a null message field.  Checked live
    by ``tests/e2e/test_differential_node_lb_config.py``.
    """
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


_ASCII_SPACE = " \t\n\v\f\r"


def decimal_string(value: str) -> int | None:
    """The integer a JSON string holds the way grpcio 1.85 reads an integer
    field given as a string (C-core parses the text of a number or a string
    alike: ASCII blanks around it and one leading ``+`` allowed, decimal
    digits only), or None when it holds none.  ``"3"``, ``" 3"`` and
    ``"+3"`` are 3; ``"3.0"``, ``"0x3"``, ``"-3"`` and ``""`` are not
    integers."""
    text = value.strip(_ASCII_SPACE)
    if text.startswith("+"):
        text = text[1:]
    if not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def expect_object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LBConfigError(path, f"expected object, got {describe(value)}")
    return value


def expect_bool(obj: dict[str, Any], name: str, path: str, default: bool | None = None) -> bool:
    if name not in obj:
        if default is None:
            raise LBConfigError(field_path(path, name), "required field missing")
        return default
    value = obj[name]
    if not isinstance(value, bool):
        raise LBConfigError(field_path(path, name), f"expected boolean, got {describe(value)}")
    return value


def expect_string(obj: dict[str, Any], name: str, path: str, default: str | None = None) -> str:
    if name not in obj:
        if default is None:
            raise LBConfigError(field_path(path, name), "required field missing")
        return default
    value = obj[name]
    if not isinstance(value, str):
        raise LBConfigError(field_path(path, name), f"expected string, got {describe(value)}")
    return value


def expect_list(
    obj: dict[str, Any], name: str, path: str, default: list[Any] | None = None
) -> list[Any]:
    if name not in obj:
        if default is None:
            raise LBConfigError(field_path(path, name), "required field missing")
        return default
    value = obj[name]
    if not isinstance(value, list):
        raise LBConfigError(field_path(path, name), f"expected array, got {describe(value)}")
    return value


def expect_duration(value: Any, path: str, *, non_negative: bool = False) -> float:
    """A JSON duration read as grpcio 1.85 reads one (:mod:`pyxds._duration`),
    in seconds; an :class:`LBConfigError` naming ``path`` if it is not one."""
    try:
        return parse_duration(value, non_negative=non_negative)
    except DurationError as err:
        raise LBConfigError(path, str(err)) from None


def duration_field(
    obj: dict[str, Any], name: str, path: str, default: float, *, non_negative: bool = False
) -> float:
    """``obj[name]`` as :func:`expect_duration`, ``default`` when absent."""
    if name not in obj:
        return default
    return expect_duration(obj[name], field_path(path, name), non_negative=non_negative)


def expect_uint32(
    obj: dict[str, Any], name: str, path: str, default: int | None = None, minimum: int = 0
) -> int:
    if name not in obj:
        if default is None:
            raise LBConfigError(field_path(path, name), "required field missing")
        return default
    value = obj[name]
    if isinstance(value, str):  # a decimal string counts, as in grpcio 1.85
        number = decimal_string(value)
        if number is None:
            raise LBConfigError(field_path(path, name), f"expected integer, got {describe(value)}")
        value = number
    # A JSON number with a fraction or exponent (3.0, 1e2) is not an integer
    # to grpcio 1.85 either; a Struct's whole numbers arrive as ints
    # (xds/resources/lb_policy.py).
    if isinstance(value, bool) or not isinstance(value, int):
        raise LBConfigError(field_path(path, name), f"expected integer, got {describe(value)}")
    number = int(value)
    if number < minimum or number > 0xFFFFFFFF:
        raise LBConfigError(
            field_path(path, name),
            f"expected integer in [{minimum}, 4294967295], got {number}",
        )
    return number
