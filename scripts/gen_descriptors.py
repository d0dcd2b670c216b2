"""Generate ``src/pyxds/xds/descriptors.bin``: the serialized descriptors of
the xds-protos files a plain ``xds:`` config needs, so that pyxds loads them
without importing ~110 generated modules and packages
(``pyxds.xds.descriptors``; issue 18, start-up).

    .venv/bin/python scripts/gen_descriptors.py          # write it
    .venv/bin/python scripts/gen_descriptors.py --check  # exit 1 if out of date

The files are the dependency closure of ``ROOTS`` (the generated modules
pyxds's xDS client and resource parsers name at module level), in the
order their modules would import them, protobuf's own files (well-known
types, ``google/rpc/status.proto``) included: importing any generated
module loads protobuf's pure-Python runtime (``descriptor_pool``,
``python_message``, ``text_format``, ...), which a upb program otherwise
never needs.  Each entry records the module's source size, which
``pyxds.xds.descriptors`` checks against the installed module before using
the bundle, and its package root (``envoy``, ``google.protobuf``, ...),
whose distribution's metadata directory (its name carries the version) the
header names and which must sit beside the packages.  Run this after
changing ``ROOTS`` or upgrading xds-protos or protobuf
(tests/unit/test_descriptors.py runs ``--check``).

Each file lists as ``"deferred"`` its top-level messages that no root
reaches through fields (the option and annotation schemas:
``descriptor.proto``, ``validate``, ``udpa``/``xds`` annotations; envoy's
access log entries; the collections, delta discovery and the like beside
the messages pyxds reads): ``pyxds.xds.descriptors`` makes their classes
only when one is asked for.  The roots are the messages pyxds names on a
stand-in (``NAMED``; tests/unit/test_descriptors.py holds it equal to what
the source names) and those of protobuf's and ``google.rpc``'s files but
``descriptor.proto`` (a well-known type can be packed in an ``Any``).  A
top-level message is reached with all its nested ones (they are made with
it), so what is reached is closed under fields: no eagerly made class ever
has upb make a missing one on demand (upb names such a class after its
caller's module).  Since stop 38 the loader makes each class on first use
and names upb's on-demand ones itself (``descriptors._name_as_generated``),
so these marks no longer decide what is made at load.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import pathlib
import re
import sys
from collections.abc import Iterable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "pyxds" / "xds" / "descriptors.bin"

#: the generated modules pyxds takes from the bundle (``descriptors.module``)
ROOTS = (
    "envoy.service.discovery.v3.discovery_pb2",
    "envoy.config.core.v3.base_pb2",
    "envoy.config.listener.v3.listener_pb2",
    "envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2",
    "envoy.config.route.v3.route_pb2",
    "envoy.config.route.v3.route_components_pb2",
    "envoy.config.cluster.v3.cluster_pb2",
    "envoy.config.endpoint.v3.endpoint_pb2",
)
#: the messages pyxds names on a stand-in (``descriptors.module(...).Name``),
#: by module: the roots of what is made at load (see the module docstring)
NAMED = {
    "envoy.config.core.v3.base_pb2": ("Node",),
    "envoy.service.discovery.v3.discovery_pb2": (
        "DiscoveryRequest",
        "DiscoveryResponse",
        "Resource",
    ),
    "envoy.config.listener.v3.listener_pb2": ("Listener",),
    "envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2": (
        "HttpConnectionManager",
    ),
    "envoy.config.route.v3.route_pb2": ("RouteConfiguration",),
    "envoy.config.route.v3.route_components_pb2": ("FilterConfig",),
    "envoy.config.cluster.v3.cluster_pb2": ("Cluster",),
    "envoy.config.endpoint.v3.endpoint_pb2": ("ClusterLoadAssignment",),
}
#: protobuf's file of option messages (no root: see the module docstring)
DESCRIPTOR_PROTO = "google/protobuf/descriptor.proto"
#: the packages whose distributions are checked at load: a file's root is
#: the first of these its module is in (``google`` is a namespace package
#: that several distributions fill: protobuf ships ``google.protobuf``;
#: ``google.rpc`` comes with xds-protos or googleapis-common-protos)
PACKAGE_ROOTS = ("google.protobuf", "google.rpc", "envoy", "xds", "udpa", "validate")

_GENCODE = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
    r"\s*(\d+),\s*(\d+),\s*(\d+),"
)


def _module_name(proto: str) -> str:
    return proto.removesuffix(".proto").replace("/", ".").replace("-", "_") + "_pb2"


def _root(module: str) -> str:
    return next(r for r in PACKAGE_ROOTS if module == r or module.startswith(r + "."))


def _distribution(path: str) -> str:
    """The metadata directory of the installed distribution holding ``path``."""
    path = os.path.realpath(path)
    for dist in importlib.metadata.distributions():
        base = dist.locate_file("")
        for file in dist.files or ():
            if os.path.realpath(base / file) == path:
                return f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
    raise LookupError(f"no installed distribution holds {path}")


def collect() -> tuple[dict, list[bytes]]:
    """The bundle's header and each file's bytes."""
    files: list = []
    distributions: dict[str, str] = {}
    blobs: list[bytes] = []
    gencode = (0, 0, 0)
    seen: set[str] = set()

    def visit(fd) -> None:
        nonlocal gencode
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            visit(dep)
        name = _module_name(fd.name)
        mod = sys.modules[name]
        assert mod.DESCRIPTOR is fd, name
        source = pathlib.Path(mod.__file__).read_text()
        found = _GENCODE.search(source)
        if found:
            gencode = max(gencode, tuple(int(v) for v in found.groups()))
        blob = fd.serialized_pb
        root = _root(name)
        if root not in distributions:
            distributions[root] = _distribution(mod.__file__)
        files.append(
            {
                "name": fd.name,
                "module": name,
                "root": root,
                "size": os.path.getsize(mod.__file__),
                "length": len(blob),
            }
        )
        blobs.append(blob)

    for name in ROOTS:
        visit(importlib.import_module(name).DESCRIPTOR)
    roots = [
        getattr(importlib.import_module(module), message).DESCRIPTOR
        for module, messages in NAMED.items()
        for message in messages
    ]
    for entry in files:
        if entry["name"].startswith("google/") and entry["name"] != DESCRIPTOR_PROTO:
            file = importlib.import_module(entry["module"]).DESCRIPTOR
            roots.extend(file.message_types_by_name.values())
    reached = _reached(roots)
    for entry in files:
        messages = importlib.import_module(entry["module"]).DESCRIPTOR.message_types_by_name
        deferred = [name for name, m in messages.items() if m.full_name not in reached]
        if deferred:
            entry["deferred"] = deferred
    # each root's distribution's metadata directory, beside its packages: its
    # name carries the version, which the sizes alone could miss
    header = {
        "distributions": distributions,
        "gencode": list(gencode),
        "files": files,
    }
    return header, blobs


def _reached(roots: Iterable[Any]) -> set[str]:
    """The full names of the messages ``roots`` (message descriptors) reach
    through their fields, each with its top-level message and every message
    nested in that one (a class is made with its nested ones)."""
    stack = list(roots)
    seen: set[str] = set()
    while stack:
        message = stack.pop()
        while message.containing_type is not None:
            message = message.containing_type
        if message.full_name in seen:
            continue
        nested = [message]
        while nested:
            inner = nested.pop()
            seen.add(inner.full_name)
            nested.extend(inner.nested_types)
            stack.extend(f.message_type for f in inner.fields if f.message_type is not None)
    return seen


def render(header: dict, blobs: list[bytes]) -> bytes:
    sys.path.insert(0, str(ROOT / "src"))
    from pyxds.xds.descriptors import MAGIC

    line = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + line + b"\n" + b"".join(blobs)


def main() -> int:
    from _generated import write_or_check

    return write_or_check(OUT, render(*collect()), "gen_descriptors.py")


if __name__ == "__main__":
    sys.exit(main())
