"""A ``google.protobuf.Duration`` written in JSON (``"1.5s"``), read as
grpcio 1.85's C-core reads one, for every JSON config that holds durations:
LB policy configs (weighted_round_robin, A58; outlier_detection, A50; rls),
the service config (A6 backoffs, methodConfig ``timeout``) and the bootstrap's
``file_watcher`` ``refresh_interval`` (A29).

C-core's JSON object loader (``json_object_loader.cc``, ``LoadDuration``)
takes only a string; it must end in ``s``; the text before it, ASCII blanks
stripped, is split at its first ``.``; each part is read as a decimal
integer (blanks around it and one sign allowed, as absl's ``SimpleAtoi``):
the seconds in int64, the fraction in int32, at most 9 characters long and
scaled to nanoseconds by that length.  The seconds must be in [0,
315576000000].  So ``" 1s"``, ``"1 s"`` and ``"+1s"`` are 1 s, ``"-0.5s"``
is 0.5 s (its seconds part is 0), ``"1. 5s"`` is 1.05 s and ``"1.-5s"``
0.95 s; ``"1e3s"``, ``".5s"``, ``"1.s"``, ``"1s "`` and numbers are
refused.  The verdicts are compared live by
``tests/e2e/test_differential_node_lb_config.py``.  gRFC A50 asks outlier
detection for non-negative durations outright: ``non_negative=True``.

Errors are :class:`DurationError` with C-core's words and the value; the
caller adds the field's path (its own error type).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_SECONDS", "DurationError", "parse_duration"]

#: google/protobuf/duration.proto: about +-10,000 years
MAX_SECONDS = 315_576_000_000
_BLANKS = " \t\n\v\f\r"
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class DurationError(ValueError):
    """Not a JSON duration; the text is the problem, without the field."""


def _integer(text: str, bounds: tuple[int, int]) -> int | None:
    """``text`` as absl's ``SimpleAtoi`` reads it into an integer type of
    ``bounds``: ASCII blanks around, one ``+`` or ``-``, decimal digits;
    None when it is not one or does not fit."""
    text = text.strip(_BLANKS)
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not (digits.isascii() and digits.isdigit()):
        return None
    number = int(text)
    return number if bounds[0] <= number <= bounds[1] else None


def _show(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _refuse(problem: str, value: Any) -> DurationError:
    return DurationError(f"{problem}, got {_show(value)}")


def parse_duration(value: Any, *, non_negative: bool = False) -> float:
    """The JSON duration ``value`` in seconds (module docstring), or
    :class:`DurationError`.  With ``non_negative`` (A50) a duration written
    with a minus sign or worth less than 0 is refused too."""
    if not isinstance(value, str):
        raise _refuse("is not a string", value)
    if not value.endswith("s"):
        raise _refuse("Not a duration (no s suffix)", value)
    body = value[:-1].strip(_BLANKS)
    whole, dot, fraction = body.partition(".")
    nanos = 0
    if dot:
        parsed = _integer(fraction, _INT32)
        if parsed is None:
            raise _refuse("Not a duration (not a number of nanoseconds)", value)
        if len(fraction) > 9:
            raise _refuse("Not a duration (too many digits after decimal)", value)
        nanos = parsed * 10 ** (9 - len(fraction))
    seconds = _integer(whole, _INT64)
    if seconds is None:
        raise _refuse("Not a duration (not a number of seconds)", value)
    if not 0 <= seconds <= MAX_SECONDS:
        raise _refuse(f"seconds must be in the range [0, {MAX_SECONDS}]", value)
    result = seconds + nanos / 1e9
    if non_negative and (result < 0 or "-" in body):
        raise _refuse("must be non-negative", value)
    return result
