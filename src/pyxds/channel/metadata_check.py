"""Call metadata grpcio would refuse, found before its call is made.

grpcio 1.85 turns a call's metadata into C-core's form only after it has
created the C-core call (cygrpc ``_call``: ``grpc_channel_create_call``,
then ``_operate`` -> ``SendInitialMetadataOperation.c()`` ->
``_store_c_metadata``).  When that conversion raises (a pair that does not
unpack into two, a key or a text value that is neither str, bytes nor None,
a ``-bin`` key whose value is not bytes, a str that does not encode as
UTF-8), the exception leaves ``_call`` without ``grpc_call_unref``: the
call, never started, holds its channel, and the channel's connection stays
open after ``close()`` (with grpcio's own channels, sync and ``grpc.aio``;
docs/traps.md).  Issue 18's bad-input rule: nothing may outlive the
channel.

:func:`well_formed` is the good path's check (one loop over the pairs, a
few type tests each); metadata it does not vouch for goes to
:func:`grpcio_error` (:func:`grpc_aio_error` for grpc.aio), which repeats
``_store_c_metadata`` step by step with Cython's own words (the unpacking
messages are Cython's, not CPython's), and may well answer None (a None
value, a bytes key, non-ASCII text): grpcio converts those, and C-core then
judges the headers (an upper-case key ends the call INTERNAL, nothing
kept).  Checked against grpcio's own raise for every kind of input
(tests/e2e/test_metadata_leak.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

__all__ = ["Refused", "grpc_aio_error", "grpcio_error", "well_formed"]


#: the metadata :func:`well_formed` vouched for last: an exact tuple of
#: exact 2-tuples of str and bytes, immutable all the way down, so the same
#: object stays good (an application passing one constant tuple per call
#: pays an identity test, not the loop)
_vouched: tuple[Any, ...] = ()


def well_formed(metadata: tuple[Any, ...]) -> bool:
    """True when grpcio 1.85 surely converts ``metadata`` (the tuple its
    ``augment_metadata`` makes): each pair an exact 2-tuple of a str key and
    a bytes value under an ASCII key, or an ASCII str value under a key not
    ending in ``-bin``.  False: look closer (:func:`grpcio_error`).  ~2k
    instructions a pair (callgrind, CPython 3.11), ~160 for the tuple
    vouched for last."""
    global _vouched
    if metadata is _vouched:
        return True
    for item in metadata:
        if item.__class__ is not tuple or len(item) != 2:
            return False
        key, value = item
        if key.__class__ is not str:
            return False
        if value.__class__ is str:
            if not (key + value).isascii() or key[-4:] == "-bin":
                return False
        elif value.__class__ is not bytes or not key.isascii():
            return False
    _vouched = metadata
    return True


def grpcio_error(metadata: tuple[Any, ...]) -> Exception | None:
    """The exception grpcio's ``_store_c_metadata`` raises for ``metadata``
    (its loop, pair by pair, up to the first raise), or None."""
    for item in metadata:
        try:
            key, value = _unpack(item)
            if _encode(key)[-4:] != b"-bin":
                value = _encode(value)
            elif not isinstance(value, bytes):
                return TypeError(f'Binary metadata key="{key}" expected bytes, got {type(value)}')
            if type(value) is not bytes:  # the value's typed view refuses a subclass
                return TypeError(f"Expected bytes, got {type(value).__name__}")
        except Exception as err:  # the exception grpcio raises
            return err
    return None


def grpc_aio_error(raw: Any, metadata: tuple[Any, ...]) -> Exception | None:
    """:func:`grpcio_error` for a ``grpc.aio`` call given ``raw`` (the
    application's metadata; ``metadata``: its tuple).  grpc.aio first makes
    a sequence a ``grpc.aio.Metadata`` (pairs unpacked in Python, each key's
    values together), when the call is made: what fails there raises here,
    as grpc.aio raises it from making the call, before any C-core call."""
    if isinstance(raw, Sequence):
        metadata = tuple(importlib.import_module("grpc.aio").Metadata.from_tuple(metadata))
    return grpcio_error(metadata)


def _unpack(item: Any) -> tuple[Any, Any]:
    """``key, value = item`` as Cython compiles it (its messages)."""
    values: list[Any] = []
    for value in item:  # "'int' object is not iterable": CPython's words, and Cython's
        if len(values) == 2:
            raise ValueError("too many values to unpack (expected 2)")
        values.append(value)
    if len(values) < 2:
        count = len(values)
        raise ValueError(f"need more than {count} value{'' if count == 1 else 's'} to unpack")
    return values[0], values[1]


def _encode(text: Any) -> bytes:
    """cygrpc's ``_encode``."""
    if text is None:
        return b""
    if isinstance(text, bytes):
        return text
    if isinstance(text, str):
        return text.encode("utf8")
    raise TypeError(f"Expected str, not {type(text)}")


class Refused(tuple):  # type: ignore[type-arg]
    """A ``grpc.aio`` RPC's ``send_metadata`` when grpcio would refuse it
    (grpc.aio raises the conversion's error from the awaited call, not from
    the call's creation): iterating it, as grpc.aio's ``_init_metadata``
    and pyxds's attempt start do before any C-core call is made, raises
    grpcio's exception, so the attempt fails to start where grpc.aio's own
    call raised, with no C-core call made."""

    __slots__ = ()

    def __new__(cls, error: Exception) -> Refused:
        return super().__new__(cls, (error,))  # non-empty: ``metadata or ()`` keeps it

    def __iter__(self) -> Any:
        raise tuple.__getitem__(self, 0).with_traceback(None)
