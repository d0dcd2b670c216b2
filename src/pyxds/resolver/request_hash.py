"""The per-RPC request hash for ring_hash (gRFC A42 "Hash computation").

Theory of operation
-------------------

A route's ``hash_policies`` are compiled once, with the selector, into a
:class:`RequestHasher`; the xDS ConfigSelector calls it per RPC (only for
routes that have policies) and hands the result to the LB policies as
``call_attributes[REQUEST_HASH_KEY]``.  The computation follows grpcio's
C-core xds_resolver, so an RPC hashes to the same value in both stacks:

* ``header``: the value route matching sees for the header
  (:func:`pyxds.resolver.route_matching.header_value`: the policy's name
  as given, ``-bin`` headers never, ``content-type`` reads as
  ``application/grpc``, several values joined with ``","``); an absent
  header yields nothing.  The optional ``regex_rewrite`` is applied with
  RE2 ``GlobalReplace`` semantics (:class:`GlobalReplace`), then the bytes
  are hashed with XXH64, seed 0.
* ``channel_id``: a 64-bit value fixed per resolver (C-core draws a random
  one when it creates the resolver).
* Combining, in policy order: the first value is the hash; each later value
  ``v`` makes it ``rotl64(hash, 1) ^ v`` (the rotation keeps two identical
  policies from cancelling out).  A ``terminal`` policy ends the walk once a
  hash exists - C-core tests the running hash, not just this policy's
  value, so a terminal policy that yields nothing still stops the walk
  after an earlier policy produced a hash.
* Nothing produced: None, and the caller leaves the attribute unset (the
  ring_hash picker then uses a random hash, as C-core does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pyxds.resolver.route_matching import header_value
from pyxds.xds.resources.types import HashPolicy

__all__ = ["GlobalReplace", "RequestHasher", "header_hash", "combine"]

_MASK64 = (1 << 64) - 1
#: XXH64's one-shot digest, loaded with the first header hash (start-up)
_xxh64: Callable[[bytes], int] | None = None


def _load_xxh64() -> Callable[[bytes], int]:
    global _xxh64
    import xxhash

    _xxh64 = xxhash.xxh64_intdigest
    return _xxh64


def combine(previous: int | None, value: int) -> int:
    """Fold one policy's ``value`` into the running hash (A42)."""
    if previous is None:
        return value
    return (((previous << 1) | (previous >> 63)) & _MASK64) ^ value


class GlobalReplace:
    """RE2 ``GlobalReplace(str, regex, rewrite)`` over UTF-8 bytes.

    Python's ``re.sub`` (and google-re2's ``sub``, which copies it) differ
    from RE2 in two ways that change the hashed bytes: an empty match right
    after a previous match is allowed there and skipped by RE2, and the
    replacement template language is Python's.  RE2's rewrite language:
    ``\\0``-``\\9`` insert a group (empty if it did not take part), ``\\\\``
    a backslash; any other escape is invalid and RE2 stops writing that
    replacement there.  A rewrite naming a group the regex does not have
    leaves the value unchanged.
    """

    __slots__ = ("_regex", "_pieces", "_usable")

    def __init__(self, regex: Any, rewrite: str) -> None:
        self._regex = regex
        raw = rewrite.encode("utf-8")
        pieces: list[bytes | int] = []
        literal = bytearray()
        highest = 0  # RE2's MaxSubmatch: scans the whole rewrite
        writing = True  # False after an invalid escape: RE2 writes no further
        i = 0
        while i < len(raw):
            byte = raw[i]
            if byte != 0x5C:  # not a backslash
                if writing:
                    literal.append(byte)
                i += 1
                continue
            nxt = raw[i + 1] if i + 1 < len(raw) else -1
            i += 2
            if 0x30 <= nxt <= 0x39:  # \N: group N
                highest = max(highest, nxt - 0x30)
                if writing:
                    if literal:
                        pieces.append(bytes(literal))
                        literal.clear()
                    pieces.append(nxt - 0x30)
            elif nxt == 0x5C:  # \\: a backslash
                if writing:
                    literal.append(0x5C)
            else:
                writing = False
        if literal:
            pieces.append(bytes(literal))
        self._pieces: tuple[bytes | int, ...] = tuple(pieces)
        self._usable = highest <= regex.groups

    def __call__(self, text: bytes) -> bytes:
        if not self._usable:
            return text
        search = self._regex.search
        pieces = self._pieces
        end = len(text)
        out = bytearray()
        pos = 0
        last_end = -1
        count = 0
        while pos <= end:
            match = search(text, pos)
            if match is None:
                break
            start, stop = match.span()
            if pos < start:
                out += text[pos:start]
            if start == stop and start == last_end:
                # An empty match where the previous one ended: copy one
                # UTF-8 character (one byte at the very end) and move on.
                step = _utf8_length(text[pos]) if pos < end else 1
                out += text[pos : pos + step]
                pos += step
                continue
            for piece in pieces:
                if isinstance(piece, int):
                    group = match.group(piece)
                    if group:
                        out += group
                else:
                    out += piece
            pos = last_end = stop
            count += 1
        if count == 0:
            return text
        if pos < end:
            out += text[pos:]
        return bytes(out)


def _utf8_length(lead: int) -> int:
    if lead < 0xC0:
        return 1
    if lead < 0xE0:
        return 2
    if lead < 0xF0:
        return 3
    return 4


def header_hash(
    metadata: Sequence[tuple[str, str | bytes]],
    name: str,
    rewrite: GlobalReplace | None = None,
) -> int | None:
    """XXH64 (seed 0) of the header's value after the optional rewrite, or
    None when the header counts as absent."""
    value = header_value(metadata, name)
    if value is None:
        return None
    data = value.encode("utf-8")
    if rewrite is not None:
        data = rewrite(data)
    return (_xxh64 or _load_xxh64())(data)


class RequestHasher:
    """One route's hash policies, compiled (module docstring).

    Calling it with the RPC's metadata returns the request hash, an int in
    [0, 2**64), or None when no policy produced a value.
    """

    __slots__ = ("_steps",)

    def __init__(self, policies: Sequence[HashPolicy], channel_id: int) -> None:
        channel_id &= _MASK64
        steps: list[tuple[str | None, GlobalReplace | None, int, bool]] = []
        for policy in policies:
            if policy.kind == "header":
                rewrite = None
                if policy.regex is not None:
                    rewrite = GlobalReplace(policy.regex, policy.substitution)
                steps.append((policy.header_name, rewrite, 0, policy.terminal))
            elif policy.kind == "channel_id":
                steps.append((None, None, channel_id, policy.terminal))
            # other kinds are never parsed (A42 ignores them)
        self._steps = tuple(steps)

    def __bool__(self) -> bool:
        return bool(self._steps)

    def __call__(self, metadata: Sequence[tuple[str, str | bytes]]) -> int | None:
        hash_: int | None = None
        for name, rewrite, constant, terminal in self._steps:
            value = constant if name is None else header_hash(metadata, name, rewrite)
            if value is not None:
                hash_ = combine(hash_, value)
            if terminal and hash_ is not None:
                break
        return hash_
