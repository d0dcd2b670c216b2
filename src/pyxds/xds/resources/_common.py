"""Helpers shared by the resource decoders: errors with field paths, durations,
Any unwrapping, RE2 compilation.

Validation collects every problem it finds (as C-core does) into an
:class:`Errors` list of ``"<field path>: <problem>"`` strings; a resource with
any error is rejected (NACKed) with all of them joined by ``"; "``.
"""

from __future__ import annotations

from typing import Any

import re2

TYPE_PREFIX = "type.googleapis.com/"
TYPED_STRUCT_TYPES = frozenset({"xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct"})
MAX_DURATION_SECONDS = 315_576_000_000

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS_NOCASE = re2.Options()
_RE2_OPTIONS_NOCASE.log_errors = False
_RE2_OPTIONS_NOCASE.case_sensitive = False


class Errors(list):
    """A list of ``"path: problem"`` strings."""

    def add(self, path: str, problem: str) -> None:
        self.append(f"{path}: {problem}" if path else problem)

    def text(self) -> str:
        return "; ".join(self)


def type_name(type_url: str) -> str:
    """The message type name of a type URL (the part after the last ``/``)."""
    return type_url.rpartition("/")[2]


def duration(d: Any, path: str, errs: Errors) -> float | None:
    """A google.protobuf.Duration as seconds, validated as C-core does."""
    seconds = d.seconds
    nanos = d.nanos
    ok = True
    if not 0 <= seconds <= MAX_DURATION_SECONDS:
        errs.add(f"{path}.seconds", f"value must be in the range [0, {MAX_DURATION_SECONDS}]")
        ok = False
    if not 0 <= nanos <= 999_999_999:
        errs.add(f"{path}.nanos", "value must be in the range [0, 999999999]")
        ok = False
    return seconds + nanos / 1e9 if ok else None


def compile_regex(pattern: str, path: str, errs: Errors, case_sensitive: bool = True) -> Any:
    """Compile with RE2 (never Python's ``re``); an error names ``path``."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS if case_sensitive else _RE2_OPTIONS_NOCASE)
    except Exception as err:  # re2.error
        detail = err.args[0] if err.args else err
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        errs.add(path, f"invalid regex {pattern!r}: {detail}")
        return None


def config_source_is_ads_or_self(cs: Any) -> bool:
    """True when a ConfigSource says ``ads`` or ``self`` (A27)."""
    return cs.WhichOneof("config_source_specifier") in ("ads", "self")


def unpack(any_msg: Any, message_cls: type, path: str, errs: Errors) -> Any:
    """Parse ``any_msg.value`` as ``message_cls``; None (and an error) if it fails."""
    msg = message_cls()
    try:
        msg.ParseFromString(any_msg.value)
    except Exception as err:  # google.protobuf.message.DecodeError
        errs.add(path, f"could not parse {message_cls.DESCRIPTOR.full_name}: {err}")
        return None
    return msg
