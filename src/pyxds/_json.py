"""JSON text read as C-core reads it: a key repeated in one object is an error.

Python's :func:`json.loads` keeps the last of two equal keys without a word;
C-core's JSON reader (grpcio 1.85 ``json_reader.cc``) refuses the text with
``duplicate key "K" at index N``.  A bootstrap, a service config or a SPIFFE
bundle map with a repeated key is therefore refused here too, naming the
key (Python's parser does not say where the key was, so no index), rather
than silently using one of the two values: "same config, same behaviour".
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads"]


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f'duplicate key "{key}"')
        obj[key] = value
    return obj


def loads(text: str | bytes | bytearray) -> Any:
    """:func:`json.loads`, refusing a key repeated in one object
    (ValueError ``duplicate key "K"``, as any other JSON error)."""
    return json.loads(text, object_pairs_hook=_object)
