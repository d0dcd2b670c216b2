"""Virtual-host selection and route matching (gRFC A28 "Response validation",
"Picking"; A27 domain matching).

Theory of operation
-------------------

*Virtual host*: :func:`select_virtual_host` picks the domain pattern that
most specifically matches the data-plane authority, case-insensitively:
an exact domain beats the longest ``*suffix``, which beats the longest
``prefix*``, which beats ``*``.  A wildcard stands for at least one
character; a pattern with ``*`` only in the middle matches nothing (C-core's
classification, :func:`_domain_kind`).

*Routes*: :class:`RouteTable` is compiled once per route configuration from
``(RouteMatch, payload)`` pairs and answers "first route that matches this
RPC" (Envoy's first-match-wins).  Matching a route has two parts:

* the *path* part (path / prefix / safe_regex, with ``case_sensitive``),
  which depends on the RPC path alone, and
* the *extra* part (header matchers and ``runtime_fraction``), which depends
  on the RPC's metadata or on a random draw.

For a path the table computes a :class:`_Plan` once: the routes whose path
part matches, in route order, up to and including the first one with no
extra part (the *terminal* route: nothing after it can ever be chosen).
Plans are found through an index - dicts keyed by exact path and by
prefix, split by case sensitivity, with the set of prefix lengths in use -
so planning costs O(len(path) + candidates + regex routes), never a scan of
every path/prefix route.  Plans are memoised per path (bounded), so the
per-RPC cost for path/prefix-only tables is one dict lookup, independent
of the number of routes; header-matched routes cost one check each, only
for the routes whose path part matched.

Header rules (A28 latest): only custom metadata is visible; keys ending in
``-bin`` are invisible; ``content-type`` reads as ``application/grpc``; the
matcher's name is used as given (metadata keys are lower case, so a name with
upper-case letters finds nothing, as in C-core and grpc-go);
several values of one key are joined with ``","``.  An absent header fails
every matcher but ``present_match: false``; ``invert_match`` never turns an
absent header into a match (TRAPS: grpc-go#4902).  ``runtime_fraction``
matches when a draw in [0, 1_000_000) is below the scaled numerator.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from pyxds._values import dataclass
from pyxds.xds.resources.types import (
    HeaderMatcher,
    PathMatch,
    PrefixMatch,
    RegexMatch,
    RouteMatch,
    VirtualHost,
    ascii_lower,
)

__all__ = [
    "domain_matches",
    "select_virtual_host",
    "header_value",
    "RouteTable",
    "PLAN_CACHE_SIZE",
    "FRACTION_DENOMINATOR",
]

T = TypeVar("T")

FRACTION_DENOMINATOR = 1_000_000
PLAN_CACHE_SIZE = 4096  # distinct RPC paths memoised per table
GRPC_CONTENT_TYPE = "application/grpc"

# ----------------------------------------------------------------- virtual hosts

_EXACT, _SUFFIX, _PREFIX, _UNIVERSE = 0, 1, 2, 3


def _domain_kind(pattern: str) -> int | None:
    """Classify a domain pattern as C-core's DomainPatternMatchType does: no
    ``*`` is exact, ``*`` alone is the universe, a leading ``*`` a suffix
    match (any other ``*`` in it is literal), else a trailing ``*`` a prefix
    match; None (never matches) otherwise."""
    if not pattern:
        return None
    if "*" not in pattern:
        return _EXACT
    if pattern == "*":
        return _UNIVERSE
    if pattern[0] == "*":
        return _SUFFIX
    if pattern[-1] == "*":
        return _PREFIX
    return None


def domain_matches(pattern: str, host: str) -> bool:
    """Does ``pattern`` match ``host`` (ASCII letters compared ignoring case)?
    A wildcard matches at least one character."""
    pattern = ascii_lower(pattern)
    host = ascii_lower(host)
    kind = _domain_kind(pattern)
    if kind == _EXACT:
        return pattern == host
    if kind == _SUFFIX:
        return len(host) > len(pattern) - 1 and host.endswith(pattern[1:])
    if kind == _PREFIX:
        return len(host) > len(pattern) - 1 and host.startswith(pattern[:-1])
    return kind == _UNIVERSE


def select_virtual_host(virtual_hosts: Sequence[VirtualHost], authority: str) -> VirtualHost | None:
    """The virtual host whose domains most specifically match ``authority``
    (A27/A28): exact, then longest ``*suffix``, then longest ``prefix*``,
    then ``*``; the first virtual host wins a tie."""
    best: VirtualHost | None = None
    best_key: tuple[int, int] | None = None
    for vhost in virtual_hosts:
        for pattern in vhost.domains:
            kind = _domain_kind(pattern)
            if kind is None or not domain_matches(pattern, authority):
                continue
            key = (kind, -len(pattern))
            if best_key is None or key < best_key:
                best, best_key = vhost, key
                if kind == _EXACT:
                    return vhost
    return best


# ----------------------------------------------------------------- headers


def header_value(metadata: Sequence[tuple[str, str | bytes]], name: str) -> str | None:
    """The value route matching sees for header ``name`` (lower case), or
    None when it counts as absent (A28 latest rules, module docstring)."""
    if name.endswith("-bin"):
        return None
    if name == "content-type":
        return GRPC_CONTENT_TYPE
    values: list[str] = []
    for key, value in metadata:
        if key.lower() == name:
            if isinstance(value, bytes):
                try:
                    value = value.decode("ascii")
                except UnicodeDecodeError:
                    continue
            values.append(value)
    if not values:
        return None
    return values[0] if len(values) == 1 else ",".join(values)


# ----------------------------------------------------------------- routes


@dataclass(frozen=True, slots=True)
class _Entry(Generic[T]):
    """A compiled route: its position, its extra conditions and its payload."""

    index: int
    headers: tuple[tuple[str, HeaderMatcher], ...]  # (lower-case name, matcher)
    fraction: int | None  # per million; None = always
    payload: T

    @property
    def unconditional(self) -> bool:
        return not self.headers and self.fraction is None


@dataclass(frozen=True, slots=True)
class _Plan(Generic[T]):
    """The routes one path can match, in order, split at the first one that
    needs no further check."""

    conditional: tuple[_Entry[T], ...]  # path matched, extra part to check, in order
    terminal: _Entry[T] | None  # first path-matched route with no extra part


def _path_matches(spec: Any, case_sensitive: bool, path: str, lower: str) -> bool:
    if isinstance(spec, RegexMatch):
        return spec.regex is not None and spec.regex.fullmatch(path) is not None
    if isinstance(spec, PathMatch):
        return (path if case_sensitive else lower) == (
            spec.path if case_sensitive else ascii_lower(spec.path)
        )
    if isinstance(spec, PrefixMatch):
        if case_sensitive:
            return path.startswith(spec.prefix)
        return lower.startswith(ascii_lower(spec.prefix))
    return False


class RouteTable(Generic[T]):
    """First-match-wins route lookup compiled once (module docstring).

    ``routes`` is a sequence of ``(RouteMatch, payload)``.  :meth:`match`
    returns the payload of the first matching route, or None.  Thread-safe:
    the only mutation after construction is the plan memo (dict item
    assignment, atomic under the GIL).
    """

    __slots__ = (
        "_entries",
        "_exact",
        "_exact_ci",
        "_prefix",
        "_prefix_ci",
        "_prefix_lengths",
        "_prefix_ci_lengths",
        "_scan",
        "_plans",
        "_needs_lower",
        "size",
    )

    def __init__(self, routes: Iterable[tuple[RouteMatch, T]]) -> None:
        self._entries: list[_Entry[T]] = []
        self._exact: dict[str, list[_Entry[T]]] = {}
        self._exact_ci: dict[str, list[_Entry[T]]] = {}
        self._prefix: dict[str, list[_Entry[T]]] = {}
        self._prefix_ci: dict[str, list[_Entry[T]]] = {}
        self._scan: list[tuple[_Entry[T], RouteMatch]] = []  # regex routes
        self._plans: dict[str, _Plan[T]] = {}
        for index, (match, payload) in enumerate(routes):
            fraction = None
            if match.runtime_fraction is not None:
                fraction = match.runtime_fraction.per_million
            # Names are looked up as given, like C-core and grpc-go: metadata
            # keys are lower case, so a matcher naming "X-Env" sees no header.
            headers = tuple((h.name, h) for h in match.headers)
            entry = _Entry(index, headers, fraction, payload)
            self._entries.append(entry)
            spec = match.path_specifier
            if isinstance(spec, PathMatch):
                if match.case_sensitive:
                    self._add(self._exact, spec.path, entry)
                else:
                    self._add(self._exact_ci, ascii_lower(spec.path), entry)
            elif isinstance(spec, PrefixMatch):
                if match.case_sensitive:
                    self._add(self._prefix, spec.prefix, entry)
                else:
                    self._add(self._prefix_ci, ascii_lower(spec.prefix), entry)
            else:
                self._scan.append((entry, match))
        self._prefix_lengths = tuple(sorted({len(p) for p in self._prefix}))
        self._prefix_ci_lengths = tuple(sorted({len(p) for p in self._prefix_ci}))
        self._needs_lower = bool(self._exact_ci or self._prefix_ci)
        self.size = len(self._entries)

    @staticmethod
    def _add(index: dict[str, list[_Entry[T]]], key: str, entry: _Entry[T]) -> None:
        bucket = index.setdefault(key, [])
        # Nothing after an unconditional route with the same key can win.
        if bucket and bucket[-1].unconditional:
            return
        bucket.append(entry)

    # -- planning (once per distinct path) ---------------------------------
    def _plan(self, path: str) -> _Plan[T]:
        candidates: list[_Entry[T]] = []
        bucket = self._exact.get(path)
        if bucket:
            candidates.extend(bucket)
        for length in self._prefix_lengths:
            if length > len(path):
                break
            bucket = self._prefix.get(path[:length])
            if bucket:
                candidates.extend(bucket)
        if self._needs_lower:
            lower = ascii_lower(path)
            bucket = self._exact_ci.get(lower)
            if bucket:
                candidates.extend(bucket)
            for length in self._prefix_ci_lengths:
                if length > len(lower):
                    break
                bucket = self._prefix_ci.get(lower[:length])
                if bucket:
                    candidates.extend(bucket)
        else:
            lower = path
        for entry, match in self._scan:
            if _path_matches(match.path_specifier, match.case_sensitive, path, lower):
                candidates.append(entry)
        candidates.sort(key=lambda e: e.index)
        conditional: list[_Entry[T]] = []
        terminal = None
        for entry in candidates:
            if entry.unconditional:
                terminal = entry
                break
            conditional.append(entry)
        plan = _Plan(tuple(conditional), terminal)
        if len(self._plans) < PLAN_CACHE_SIZE:
            self._plans[path] = plan
        return plan

    # -- per RPC ------------------------------------------------------------
    def match(
        self,
        path: str,
        metadata: Sequence[tuple[str, str | bytes]],
        rand: Callable[[int], int] | None = None,
    ) -> T | None:
        """Payload of the first route matching the RPC, or None.

        ``rand(n)`` returns an int in [0, n) (``random.randrange``); it is
        called only for routes with a runtime fraction whose path matched.
        """
        plan = self._plans.get(path)
        if plan is None:
            plan = self._plan(path)
        if plan.conditional:
            headers: dict[str, str | None] | None = None
            for entry in plan.conditional:
                if entry.headers:
                    if headers is None:
                        headers = {}
                    ok = True
                    for name, matcher in entry.headers:
                        if name in headers:
                            value = headers[name]
                        else:
                            value = headers[name] = header_value(metadata, name)
                        if not matcher.matches(value):
                            ok = False
                            break
                    if not ok:
                        continue
                if entry.fraction is not None:
                    draw = (rand or random.randrange)(FRACTION_DENOMINATOR)
                    if draw >= entry.fraction:
                        continue
                return entry.payload
        terminal = plan.terminal
        return terminal.payload if terminal is not None else None

    @property
    def plans(self) -> dict[str, _Plan[T]]:
        """The per-path plan memo (read-only for callers; for fast paths)."""
        return self._plans

    def payloads(self) -> list[T]:
        """Every route's payload in route order."""
        return [e.payload for e in self._entries]
