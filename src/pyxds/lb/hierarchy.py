"""Hierarchical addresses (gRFC A56, "Hierarchical Addresses").

Each endpoint may carry ``attributes["hierarchical_path"]``: a tuple of child
names, one per level of the policy tree.  A parent calls :func:`split` to
route each endpoint to the child named by the first element, with that
element stripped, so the child sees the rest of the path.  Endpoints with an
empty or missing path belong to no child and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pyxds.lb.api import Endpoint, _set_address_set, _set_below

PATH_KEY = "hierarchical_path"


def path_of(endpoint: Endpoint) -> tuple[str, ...]:
    return tuple(endpoint.attributes.get(PATH_KEY, ()))


def with_path(endpoint: Endpoint, path: Iterable[str]) -> Endpoint:
    """``endpoint`` with its hierarchical path replaced by ``path``."""
    return endpoint.with_attributes(**{PATH_KEY: tuple(path)})


class PathView(Mapping[str, Any]):
    """The attributes of an endpoint one level down the tree: those of the
    level above with ``hierarchical_path`` replaced by its rest.  Read-only;
    one small slotted object where a copied dict and its read-only proxy
    were two per endpoint per level (issue 18: objects the cyclic GC walks).
    A view of a view reads the first level's mapping directly."""

    __slots__ = ("_base", "_path")

    def __init__(self, base: Mapping[str, Any], path: tuple[str, ...]) -> None:
        self._base = base
        self._path = path

    def __getitem__(self, key: str) -> Any:
        if key == PATH_KEY:
            return self._path
        return self._base[key]

    def get(self, key: str, default: Any = None) -> Any:
        if key == PATH_KEY:
            return self._path
        return self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key == PATH_KEY or key in self._base

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)

    def __repr__(self) -> str:
        return f"PathView({dict(self)!r})"


def split(endpoints: Iterable[Endpoint]) -> dict[str, list[Endpoint]]:
    """Group endpoints by the first path element, stripping it (order kept).

    Runs once per tree level for every endpoint of an EDS update (10k
    endpoints: twice per update).  The stripped endpoint is made once per
    endpoint object and kept on it (``Endpoint._below``): an endpoint the
    next update passes down unchanged (cds reuses the endpoints of an
    unchanged locality) comes out as the same object again, so a level below
    sees an unchanged locality's endpoints as identical objects, and an
    update builds (and leaves for the garbage collector) only the endpoints
    that changed.  The stripped attributes are a :class:`PathView` of the
    first level's mapping; the rest of each distinct path is computed once,
    and endpoints that share one mapping (cds gives the endpoints of a
    locality one mapping when their attributes are equal) share one view of
    it: one object per locality per level where there was one per
    endpoint."""
    groups: dict[str, list[Endpoint]] = {}
    rests: dict[tuple[str, ...], tuple[str, ...]] = {}
    # keyed by the id of a mapping its view (kept here) keeps alive
    views: dict[tuple[int, tuple[str, ...]], PathView] = {}
    make = Endpoint.trusted
    for endpoint in endpoints:
        below = endpoint._below
        if below is not None:
            head = endpoint.attributes[PATH_KEY][0]
        else:
            attributes = endpoint.attributes
            path = attributes.get(PATH_KEY)
            if not path:
                continue
            if not isinstance(path, tuple):
                path = tuple(path)
            rest = rests.get(path)
            if rest is None:
                rest = rests[path] = path[1:]
            base = attributes._base if type(attributes) is PathView else attributes
            view = views.get((id(base), rest))
            if view is None:
                view = views[id(base), rest] = PathView(base, rest)
            below = make(endpoint.addresses, view)
            _set_address_set(below, endpoint._address_set)  # api.address_set, if made
            _set_below(endpoint, below)
            head = path[0]
        group = groups.get(head)
        if group is None:
            group = groups[head] = []
        group.append(below)
    return groups
