"""Hierarchical addresses (gRFC A56, "Hierarchical Addresses").

Each endpoint may carry ``attributes["hierarchical_path"]``: a tuple of child
names, one per level of the policy tree.  A parent calls :func:`split` to
route each endpoint to the child named by the first element, with that
element stripped, so the child sees the rest of the path.  Endpoints with an
empty or missing path belong to no child and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyxds.lb.api import Endpoint

PATH_KEY = "hierarchical_path"


def path_of(endpoint: Endpoint) -> tuple[str, ...]:
    return tuple(endpoint.attributes.get(PATH_KEY, ()))


def with_path(endpoint: Endpoint, path: Iterable[str]) -> Endpoint:
    """``endpoint`` with its hierarchical path replaced by ``path``."""
    return endpoint.with_attributes(**{PATH_KEY: tuple(path)})


def split(endpoints: Iterable[Endpoint]) -> dict[str, list[Endpoint]]:
    """Group endpoints by the first path element, stripping it (order kept)."""
    groups: dict[str, list[Endpoint]] = {}
    for endpoint in endpoints:
        path = path_of(endpoint)
        if not path:
            continue
        groups.setdefault(path[0], []).append(with_path(endpoint, path[1:]))
    return groups
