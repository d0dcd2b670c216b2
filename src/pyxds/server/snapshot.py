"""Snapshots: the resources a management server serves to a node, and their versions.

Theory of operation
-------------------
A :class:`Snapshot` is an immutable set of resources, by type and by name. The
server keeps one snapshot as the default for every node and optionally one per
node id (:class:`SnapshotStore`). When a snapshot is installed, each type is
compared, by serialized bytes, with what the node was served before:

* an unchanged type keeps its version and its *generation*, so streams do not
  resend it (identical resources propagate nowhere);
* a changed type gets a new version: the snapshot's explicit ``version`` when
  one is given, else the next number of a server-wide counter for that type
  ("1", "2", ...), and a new generation.

Generations are unique server-wide integers; streams compare generations, never
version strings, so two snapshots that happen to carry the same version text
can never hide a change from a stream.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any

from pyxds._values import dataclass
from pyxds.server.types import FIELD_OF_TYPE, TYPE_OF_FIELD, TYPE_URLS, resource_name


@dataclass(frozen=True)
class RawResource:
    """A resource given as bytes, e.g. to serve a malformed resource in a NACK test."""

    name: str
    data: bytes

    def SerializeToString(self, **_: Any) -> bytes:
        return self.data


def _encode(resource: Any) -> bytes:
    data: bytes
    try:
        data = resource.SerializeToString(deterministic=True)
    except TypeError:
        data = resource.SerializeToString()
    return data


def _index(type_url: str, resources: Iterable[Any] | Mapping[str, Any]) -> dict[str, Any]:
    field_name = FIELD_OF_TYPE[type_url]
    if isinstance(resources, Mapping):
        out = {}
        for name, resource in resources.items():
            if not isinstance(name, str):
                raise TypeError(f"Snapshot.{field_name}: resource name {name!r} is not a string")
            out[name] = resource
        return out
    out = {}
    for i, resource in enumerate(resources):
        if not hasattr(resource, "SerializeToString"):
            raise TypeError(
                f"Snapshot.{field_name}[{i}]: {type(resource).__name__} is not a protobuf "
                "message (no SerializeToString)"
            )
        name = resource_name(type_url, resource)
        if name in out:
            raise ValueError(f"Snapshot.{field_name}[{i}]: duplicate resource name {name!r}")
        out[name] = resource
    return out


class Snapshot:
    """Resources of the four xDS types, each a sequence of envoy protos or a mapping name->proto.

    ``version``: when given, every type that changed gets this version string;
    when None the server numbers each type's versions itself.
    """

    __slots__ = ("_by_type", "version")

    def __init__(
        self,
        listeners: Iterable[Any] | Mapping[str, Any] = (),
        routes: Iterable[Any] | Mapping[str, Any] = (),
        clusters: Iterable[Any] | Mapping[str, Any] = (),
        endpoints: Iterable[Any] | Mapping[str, Any] = (),
        version: str | None = None,
    ) -> None:
        if version is not None and not isinstance(version, str):
            raise TypeError(f"Snapshot.version: expected a string, got {version!r}")
        given = {"listeners": listeners, "routes": routes, "clusters": clusters}
        given["endpoints"] = endpoints
        self._by_type: dict[str, dict[str, Any]] = {
            type_url: _index(type_url, given[FIELD_OF_TYPE[type_url]]) for type_url in TYPE_URLS
        }
        self.version = version

    def resources(self, type_url: str) -> dict[str, Any]:
        """The resources of one type, by name (a copy)."""
        return dict(self._by_type[type_url])

    @property
    def listeners(self) -> tuple[Any, ...]:
        return tuple(self._by_type[TYPE_OF_FIELD["listeners"]].values())

    @property
    def routes(self) -> tuple[Any, ...]:
        return tuple(self._by_type[TYPE_OF_FIELD["routes"]].values())

    @property
    def clusters(self) -> tuple[Any, ...]:
        return tuple(self._by_type[TYPE_OF_FIELD["clusters"]].values())

    @property
    def endpoints(self) -> tuple[Any, ...]:
        return tuple(self._by_type[TYPE_OF_FIELD["endpoints"]].values())

    def replace(self, version: str | None = None, **types: Any) -> Snapshot:
        """A copy with whole types replaced, e.g. ``replace(clusters=[...])``."""
        fields: dict[str, Any] = {
            name: self._by_type[type_url] for type_url, name in FIELD_OF_TYPE.items()
        }
        for name, value in types.items():
            if name not in fields:
                raise TypeError(f"Snapshot.replace: unknown resource type {name!r}")
            fields[name] = value
        return Snapshot(version=version, **fields)

    def without(self, version: str | None = None, **names: Iterable[str]) -> Snapshot:
        """A copy with the named resources removed, e.g. ``without(clusters=["c1"])``."""
        fields: dict[str, Any] = {
            name: self._by_type[type_url] for type_url, name in FIELD_OF_TYPE.items()
        }
        for name, removed in names.items():
            if name not in fields:
                raise TypeError(f"Snapshot.without: unknown resource type {name!r}")
            if isinstance(removed, str):
                removed = (removed,)
            gone = set(removed)
            fields[name] = {k: v for k, v in fields[name].items() if k not in gone}
        return Snapshot(version=version, **fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return self.version == other.version and all(
            {k: _encode(v) for k, v in self._by_type[t].items()}
            == {k: _encode(v) for k, v in other._by_type[t].items()}
            for t in TYPE_URLS
        )

    # mutable, compared by content: unhashable (mypy wants __hash__ a method)
    __hash__ = None  # type: ignore[assignment]  # unhashable, as a dict

    def __repr__(self) -> str:
        counts = ", ".join(
            f"{FIELD_OF_TYPE[t]}={sorted(self._by_type[t])}" for t in TYPE_URLS if self._by_type[t]
        )
        return f"Snapshot({counts}, version={self.version!r})"


@dataclass(frozen=True)
class TypeState:
    """What a node is served for one type: version, generation, resources as bytes by name.

    ``explicit``: the version came from the snapshot (not the server's counter),
    so a new version is sent even when the bytes are the same.
    """

    version: str
    generation: int
    resources: Mapping[str, bytes] = field(default_factory=dict)
    explicit: bool = False


@dataclass(frozen=True)
class NodeState:
    """A snapshot as installed: the snapshot and its per-type served state."""

    snapshot: Snapshot
    types: Mapping[str, TypeState]


class SnapshotStore:
    """The default snapshot plus one per node id. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._default: NodeState | None = None
        self._nodes: dict[str, NodeState] = {}
        self._generations = itertools.count(1)
        self._counters: dict[str, int] = dict.fromkeys(TYPE_URLS, 0)

    def get(self, node_id: str | None) -> NodeState | None:
        """The state a node is served: its own snapshot, else the default (None: nothing yet)."""
        with self._lock:
            if node_id is not None and node_id in self._nodes:
                return self._nodes[node_id]
            return self._default

    def snapshot(self, node_id: str | None = None) -> Snapshot | None:
        state = self.get(node_id)
        return None if state is None else state.snapshot

    def set(self, snapshot: Snapshot, node_id: str | None = None) -> NodeState:
        """Install ``snapshot`` for ``node_id`` (None: the default); returns the new state."""
        if not isinstance(snapshot, Snapshot):
            raise TypeError(f"set_snapshot: expected a Snapshot, got {type(snapshot).__name__}")
        encoded = {t: {n: _encode(r) for n, r in snapshot._by_type[t].items()} for t in TYPE_URLS}
        with self._lock:
            previous = self._default if node_id is None else self._nodes.get(node_id, self._default)
            types: dict[str, TypeState] = {}
            for type_url in TYPE_URLS:
                old = None if previous is None else previous.types[type_url]
                data = encoded[type_url]
                if (
                    old is not None
                    and dict(old.resources) == data
                    and (snapshot.version is None or snapshot.version == old.version)
                ):
                    types[type_url] = old
                    continue
                if snapshot.version is not None:
                    version = snapshot.version
                else:
                    self._counters[type_url] += 1
                    version = str(self._counters[type_url])
                types[type_url] = TypeState(
                    version, next(self._generations), data, snapshot.version is not None
                )
            state = NodeState(snapshot, types)
            if node_id is None:
                self._default = state
            else:
                self._nodes[node_id] = state
            return state

    def clear(self, node_id: str | None = None) -> None:
        """Forget a node's own snapshot (it falls back to the default); None clears the default."""
        with self._lock:
            if node_id is None:
                self._default = None
            else:
                self._nodes.pop(node_id, None)
