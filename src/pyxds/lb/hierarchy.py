"""Hierarchical addresses (gRFC A56, "Hierarchical Addresses").

Each endpoint may carry ``attributes["hierarchical_path"]``: a tuple of child
names, one per level of the policy tree.  A parent calls :func:`split` to
route each endpoint to the child named by the first element, with that
element stripped, so the child sees the rest of the path.  Endpoints with an
empty or missing path belong to no child and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

from pyxds.lb.api import Endpoint, _set_below

PATH_KEY = "hierarchical_path"


def path_of(endpoint: Endpoint) -> tuple[str, ...]:
    return tuple(endpoint.attributes.get(PATH_KEY, ()))


def with_path(endpoint: Endpoint, path: Iterable[str]) -> Endpoint:
    """``endpoint`` with its hierarchical path replaced by ``path``."""
    return endpoint.with_attributes(**{PATH_KEY: tuple(path)})


def split(endpoints: Iterable[Endpoint]) -> dict[str, list[Endpoint]]:
    """Group endpoints by the first path element, stripping it (order kept).

    Runs once per tree level for every endpoint of an EDS update (10k
    endpoints: twice per update).  The stripped endpoint is made once per
    endpoint object and kept on it (``Endpoint._below``): an endpoint the
    next update passes down unchanged (cds reuses the endpoints of an
    unchanged locality) comes out as the same object again, so a level below
    sees an unchanged locality's endpoints as identical objects, and an
    update builds (and leaves for the garbage collector) only the endpoints
    that changed.  Otherwise one attribute dict copy each, the rest of each
    distinct path computed once."""
    groups: dict[str, list[Endpoint]] = {}
    rests: dict[tuple[str, ...], tuple[str, ...]] = {}
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
            merged = dict(attributes)
            merged[PATH_KEY] = rest
            below = make(endpoint.addresses, MappingProxyType(merged))
            _set_below(endpoint, below)
            head = path[0]
        group = groups.get(head)
        if group is None:
            group = groups[head] = []
        group.append(below)
    return groups
