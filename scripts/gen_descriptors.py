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

The bundle marks no messages: the loader makes each message class on first
use and names the ones upb makes on demand itself
(``descriptors._name_as_generated``; tests/unit/test_descriptors.py).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import pathlib
import re
import sys

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
    # each root's distribution's metadata directory, beside its packages: its
    # name carries the version, which the sizes alone could miss
    header = {
        "distributions": distributions,
        "gencode": list(gencode),
        "files": files,
    }
    return header, blobs


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
