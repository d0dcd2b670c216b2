"""``urlsplit``, ``quote`` and ``unquote`` with ``urllib.parse``'s results,
without loading ``urllib.parse`` for the plain strings a program's targets
and resource names are (issue 18, start-up).

Rules:

1. Each function gives exactly what ``urllib.parse``'s function of the same
   name gives (``urlsplit``: the same five parts, as a :class:`SplitParts`;
   errors raised the same), and takes the short way only for inputs where
   that result is plain to see:

   * ``urlsplit``: printable ASCII without ``[ ] ? #``, space or backslash:
     no bracketed host to check, no query or fragment, nothing to strip or
     remove, an ASCII netloc (what ``urllib.parse`` checks);
   * ``quote``: a string of unreserved characters (``A-Z a-z 0-9 _ . - ~``)
     and ``safe`` ones, which ``quote`` returns unchanged;
   * ``unquote``: a string without ``%``, which ``unquote`` returns as it is.

   Anything else is handed to ``urllib.parse`` (loaded then).
2. Why: ``urllib.parse`` imports ``ipaddress`` at its top; the two cost a
   fresh program ~2.5-3.5 ms of CPU (more than any pyxds module), and a
   program pays it for ``xds:///service`` alone.  grpcio's C-core parses its
   targets in C++ and loads neither.

``tests/unit/test_uri.py`` compares the three with ``urllib.parse``'s over
targets, authorities and random strings.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SplitParts", "quote", "unquote", "urlsplit"]

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: RFC 3986 unreserved characters (``urllib.parse``'s always-safe set)
_UNRESERVED = frozenset(_LETTERS + "0123456789_.-~")
#: a scheme's characters after the first (a letter)
_SCHEME = frozenset(_LETTERS + "0123456789+-.")
#: the characters ``urlsplit`` takes the short way for: printable ASCII but
#: space, brackets, ``?``, ``#`` and backslash
_PLAIN = frozenset(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "[]?#\\")


class SplitParts(NamedTuple):
    """The five parts of ``urllib.parse.urlsplit``'s result."""

    scheme: str
    netloc: str
    path: str
    query: str
    fragment: str


def urlsplit(url: str) -> SplitParts:
    """``urllib.parse.urlsplit(url)``'s parts (rules above)."""
    if not _PLAIN.issuperset(url):
        from urllib.parse import urlsplit as split

        return SplitParts(*split(url))
    scheme = netloc = ""
    i = url.find(":")
    if i > 0 and url[0] in _LETTERS and _SCHEME.issuperset(url[1:i]):
        scheme, url = url[:i].lower(), url[i + 1 :]
    if url[:2] == "//":
        end = url.find("/", 2)
        if end < 0:
            end = len(url)
        netloc, url = url[2:end], url[end:]
    return SplitParts(scheme, netloc, url, "", "")


def quote(string: str, safe: str = "/") -> str:
    """``urllib.parse.quote(string, safe=safe)`` (rules above)."""
    if _UNRESERVED.issuperset(string.translate(_dropping(safe))):
        return string
    from urllib.parse import quote as full

    return full(string, safe=safe)


def unquote(string: str) -> str:
    """``urllib.parse.unquote(string)`` (rules above)."""
    if "%" not in string:
        return string
    from urllib.parse import unquote as full

    return full(string)


_DROPPING: dict[str, dict[int, None]] = {}


def _dropping(safe: str) -> dict[int, None]:
    """A ``str.translate`` table deleting the ASCII characters of ``safe``."""
    table = _DROPPING.get(safe)
    if table is None:
        table = _DROPPING[safe] = {ord(c): None for c in safe if c.isascii()}
    return table
