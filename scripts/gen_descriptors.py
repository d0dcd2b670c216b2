"""Generate ``src/pyxds/xds/descriptors.bin``: the serialized descriptors of
the xds-protos files a plain ``xds:`` config needs, so that pyxds loads them
without importing ~110 generated modules and packages
(``pyxds.xds.descriptors``; issue 18, start-up).

    .venv/bin/python scripts/gen_descriptors.py          # write it
    .venv/bin/python scripts/gen_descriptors.py --check  # exit 1 if out of date

The files are the dependency closure of ``ROOTS`` (the generated modules
pyxds's xDS client and resource parsers name at module level), in the
order their modules would import them, without protobuf's own files
(``EXTERNAL``: imported as modules at load).  Each entry records the
module's source size, which ``pyxds.xds.descriptors`` checks against the
installed module before using the bundle, and the header the name of
xds-protos's metadata directory (its version), which must sit beside the
packages.  Run this after changing
``ROOTS`` or upgrading xds-protos (tests/unit/test_descriptors.py runs
``--check``).
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
#: files from other distributions (protobuf's well-known types; the
#: ``google.rpc`` status, which googleapis-common-protos ships too)
EXTERNAL = ("google/protobuf/", "google/rpc/")

_GENCODE = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
    r"\s*(\d+),\s*(\d+),\s*(\d+),"
)


def _module_name(proto: str) -> str:
    return proto.removesuffix(".proto").replace("/", ".").replace("-", "_") + "_pb2"


def collect() -> tuple[dict, list[bytes]]:
    """The bundle's header and each file's bytes."""
    files: list = []
    external: list[str] = []
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
        if fd.name.startswith(EXTERNAL):
            external.append(name)
            return
        mod = sys.modules[name]
        assert mod.DESCRIPTOR is fd, name
        source = pathlib.Path(mod.__file__).read_text()
        found = _GENCODE.search(source)
        if found:
            gencode = max(gencode, tuple(int(v) for v in found.groups()))
        blob = fd.serialized_pb
        files.append(
            {
                "name": fd.name,
                "module": name,
                "size": os.path.getsize(mod.__file__),
                "length": len(blob),
            }
        )
        blobs.append(blob)

    for name in ROOTS:
        visit(importlib.import_module(name).DESCRIPTOR)
    # the distribution's metadata directory, beside its packages: its name
    # carries the version, which the sizes alone could miss
    version = importlib.metadata.version("xds-protos")
    header = {
        "distribution": f"xds_protos-{version}.dist-info",
        "external": external,
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
