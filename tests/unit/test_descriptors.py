"""``pyxds.xds.descriptors``: the xds-protos files a plain config needs load
from a bundle of their serialized descriptors instead of ~110 generated
modules and packages (issue 18, start-up), and only where the bundle is
what those modules hold; otherwise pyxds imports the modules as before.

What a program sees either way (decoding, ACK/NACK, CSDS, class identity,
module names, pickling, the symbol database) is compared across import
orders by tests/unit/test_proto_loading.py; that a plain first RPC loads
no generated module of xds-protos, by tests/e2e/test_lazy_loading.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.service.discovery.v3 import discovery_pb2

from pyxds.xds import descriptors

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: the installed xds-protos's and protobuf's metadata directories, as the
#: bundle names them
INSTALLED = {
    f"{name.replace('-', '_')}-{importlib.metadata.version(name)}.dist-info"
    for name in ("xds-protos", "protobuf")
}
#: the bundle was written from the installed releases (after a new release a
#: fresh install differs until scripts/gen_descriptors.py is run again; the
#: first test below holds that pyxds then imports the modules)
CURRENT = set(descriptors.read()[0]["distributions"].values()) <= INSTALLED
needs_current_bundle = pytest.mark.skipif(
    not CURRENT, reason=f"the bundle is not from the installed {sorted(INSTALLED)}"
)


def _python(code: str) -> Any:
    """The JSON a fresh interpreter on this tree's source prints last."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_bundle_is_in_sync_with_the_installed_xds_protos() -> None:
    """Written from the installed release and up to date; or, where another
    release is installed (a fresh install after xds-protos ships a new one),
    not used at all: the modules are imported as before."""
    if not CURRENT:
        assert descriptors._load() == {}
        pytest.skip(f"the bundle is not from the installed {INSTALLED}: it is not used")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_descriptors.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


@needs_current_bundle
def test_the_bundle_holds_each_files_bytes_as_its_generated_module_does() -> None:
    import importlib

    header, blobs = descriptors.read()
    assert len(header["files"]) == len(blobs) >= 60
    for entry, blob in zip(header["files"], blobs, strict=True):
        generated = importlib.import_module(entry["module"])
        assert generated.DESCRIPTOR.name == entry["name"]
        assert generated.DESCRIPTOR.serialized_pb == blob, entry["name"]
    # protobuf's own files too: importing their modules would load protobuf's
    # pure-Python runtime
    names = {e["name"] for e in header["files"]}
    assert {"google/protobuf/descriptor.proto", "google/rpc/status.proto"} <= names


def test_a_stand_in_answers_with_the_generated_modules_names() -> None:
    stand_in = descriptors.module("envoy.config.cluster.v3.cluster_pb2")
    assert stand_in.Cluster is cluster_pb2.Cluster
    assert stand_in.Cluster.EDS == cluster_pb2.Cluster.EDS
    assert stand_in.DESCRIPTOR is cluster_pb2.DESCRIPTOR
    assert stand_in.__name__ == "envoy.config.cluster.v3.cluster_pb2"
    with pytest.raises(AttributeError, match="no attribute 'NotAMessage'"):
        stand_in.NotAMessage  # noqa: B018
    request = descriptors.module("envoy.service.discovery.v3.discovery_pb2").DiscoveryRequest
    assert request is discovery_pb2.DiscoveryRequest


@needs_current_bundle
def test_a_program_that_never_imports_the_modules_gets_their_classes_and_names() -> None:
    """No generated module (of xds-protos or protobuf) is imported, nor
    protobuf's pure-Python runtime; the classes carry the module's names
    (pickling finds the module, which then loads and hands back the very
    same class, now in the symbol database)."""
    out = _python(
        """
        import json, pickle, sys
        from pyxds.xds.resources import CLUSTER
        from pyxds.xds.descriptors import module
        Cluster = module("envoy.config.cluster.v3.cluster_pb2").Cluster
        c = Cluster(name="c", type=Cluster.EDS)
        c.eds_cluster_config.eds_config.ads.SetInParent()
        ok = CLUSTER.decode(c.SerializeToString()).error is None
        tops = ("envoy", "udpa", "validate", "xds", "google.rpc")
        generated = sorted(
            m for m in sys.modules
            if m.startswith(tops) or m.endswith("_pb2")
            or m in ("google.protobuf.descriptor_pool", "google.protobuf.text_format")
        )
        names = [Cluster.__module__, Cluster.__qualname__, type(c.eds_cluster_config).__qualname__]
        again = pickle.loads(pickle.dumps(c))
        from envoy.config.cluster.v3 import cluster_pb2
        from google.protobuf import symbol_database
        symbol = symbol_database.Default().GetSymbol("envoy.config.cluster.v3.Cluster")
        registered = symbol is Cluster
        print(json.dumps({"ok": ok, "generated": generated, "registered": registered,
                          "names": names, "same": cluster_pb2.Cluster is Cluster and again == c}))
        """
    )
    assert out["ok"] and out["registered"] and out["same"]
    assert out["generated"] == []
    assert out["names"] == [
        "envoy.config.cluster.v3.cluster_pb2",
        "Cluster",
        "Cluster.EdsClusterConfig",
    ]


@needs_current_bundle
def test_a_files_enums_and_extensions_come_when_a_stand_in_first_asks_for_a_name() -> None:
    """Loading the bundle puts no file's enums, extensions or message names
    together (a first RPC asks for 8 of its 75 files); a stand-in's first
    name does, for its file alone, and they are the generated module's."""
    out = _python(
        """
        import json
        from pyxds.xds import descriptors
        base = descriptors.module("envoy.config.core.v3.base_pb2")
        validate = descriptors.module("validate.validate_pb2")
        names = descriptors._loaded()
        def filled():
            return sorted(n for n, got in names.items() if "__unfilled__" not in got)
        before = filled()
        got = [base.RoutingPriority.Name(1), base.HIGH, base._ROUTINGPRIORITY.full_name,
               validate.rules.full_name, validate.RULES_FIELD_NUMBER]
        after = filled()
        from envoy.config.core.v3 import base_pb2
        from validate import validate_pb2
        want = [base_pb2.RoutingPriority.Name(1), base_pb2.HIGH,
                base_pb2._ROUTINGPRIORITY.full_name, validate_pb2.rules.full_name,
                validate_pb2.RULES_FIELD_NUMBER]
        print(json.dumps({"before": before, "after": after, "got": got, "want": want}))
        """
    )
    assert out["before"] == []
    assert out["after"] == ["envoy.config.core.v3.base_pb2", "validate.validate_pb2"]
    assert out["got"] == out["want"]
    assert out["got"][:2] == ["HIGH", 1]


def test_a_lookup_while_another_thread_fills_the_file_waits_for_every_name() -> None:
    """The xDS resolver's load-ahead thread and the caller's thread look
    names up at once: one that comes while another thread puts a file's names
    together gets the name (waiting for the fill), never an AttributeError
    from a half-filled file."""
    out = _python(
        """
        import json, threading
        from pyxds.xds import descriptors
        base = descriptors.module("envoy.config.core.v3.base_pb2")
        assert descriptors._loaded(), "bundle not usable"
        fill = descriptors._add_names
        seen = {}
        def other():
            try:
                seen["got"] = base.HIGH
            except Exception as e:
                seen["got"] = repr(e)
        def filling(namespace, file):
            t = threading.Thread(target=other)
            t.start()
            t.join(0.5)  # a lookup that does not wait has answered by now
            seen["waited"] = t.is_alive()
            fill(namespace, file)
            seen["thread"] = t
        descriptors._add_names = filling
        first = base.DEFAULT
        seen.pop("thread").join(10)
        print(json.dumps({"first": first, **seen}))
        """
    )
    assert out == {"first": 0, "got": 1, "waited": True}


def test_a_lookup_while_another_thread_makes_the_class_waits_for_it() -> None:
    """As for a file's names: a lookup of a message class another thread is
    making gets the class, never an AttributeError."""
    out = _python(
        """
        import json, threading
        from pyxds.xds import descriptors
        base = descriptors.module("envoy.config.core.v3.base_pb2")
        assert descriptors._loaded(), "bundle not usable"
        base.DEFAULT  # the file's names in: what is left is making a class
        make = descriptors._make_classes
        seen = {}
        def other():
            try:
                seen["got"] = base.Locality.DESCRIPTOR.full_name
            except Exception as e:
                seen["got"] = repr(e)
        def making(*args, **kwargs):
            t = threading.Thread(target=other)
            t.start()
            t.join(0.5)  # a lookup that does not wait has answered by now
            seen["waited"] = t.is_alive()
            make(*args, **kwargs)
            seen["thread"] = t
        descriptors._make_classes = making
        first = base.Locality.DESCRIPTOR.full_name
        seen.pop("thread").join(10)
        print(json.dumps({"first": first, **seen}))
        """
    )
    name = "envoy.config.core.v3.Locality"
    assert out == {"first": name, "got": name, "waited": True}


def test_the_runtime_version_is_protobufs_without_loading_its_version_module() -> None:
    """The bundle's runtime check reads the version ``runtime_version``
    holds, and a program whose first RPC uses the bundle never loads that
    module (its enum class cost ~0.9 M instructions)."""
    out = _python(
        """
        import json, sys
        from pyxds.xds import descriptors
        usable = descriptors._loaded() != {}
        loaded = "google.protobuf.runtime_version" in sys.modules
        from google.protobuf import runtime_version as r
        print(json.dumps({"usable": usable, "loaded": loaded,
                          "read": descriptors.runtime_version(),
                          "module": [r.MAJOR, r.MINOR, r.PATCH]}))
        """
    )
    assert out["read"] == out["module"]
    assert out["loaded"] is False or not out["usable"]


def test_a_version_string_not_read_as_n_n_n_asks_the_version_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import google.protobuf
    from google.protobuf import runtime_version as r

    monkeypatch.setattr(google.protobuf, "__version__", "unknown")
    assert descriptors.runtime_version() == (r.MAJOR, r.MINOR, r.PATCH)
    monkeypatch.setattr(google.protobuf, "__version__", "99.1.2rc1")
    assert descriptors.runtime_version() == (99, 1, 2)


def _bundle_with(tmp_path: pathlib.Path, change) -> str:
    """A copy of the bundle with its header changed by ``change``."""
    header, blobs = descriptors.read()
    change(header)
    path = tmp_path / "descriptors.bin"
    line = json.dumps(header).encode()
    path.write_bytes(descriptors.MAGIC + line + b"\n" + b"".join(blobs))
    return str(path)


def _older_runtime(header: dict) -> None:
    header["gencode"] = [99, 0, 0]


def _another_release(header: dict) -> None:
    header["files"][3]["size"] += 1


def _another_distribution(header: dict) -> None:
    header["distributions"]["envoy"] = "xds_protos-0.0.1.dist-info"


def _another_protobuf(header: dict) -> None:
    header["distributions"]["google.protobuf"] = "protobuf-0.0.1.dist-info"


def _missing_module(header: dict) -> None:
    header["files"][-1]["module"] = "envoy.no_such_package.v3.gone_pb2"


@pytest.mark.parametrize(
    "change",
    [_older_runtime, _another_distribution, _another_protobuf, _another_release, _missing_module],
    ids=[
        "runtime-older-than-the-generated-code",
        "another-xds-protos-release",
        "another-protobuf-release",
        "a-module-of-another-size",
        "a-module-missing",
    ],
)
def test_a_bundle_that_is_not_what_the_modules_hold_is_not_used(
    change, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(descriptors, "PATH", _bundle_with(tmp_path, change))
    assert descriptors._load() == {}


@needs_current_bundle
def test_a_missing_or_foreign_bundle_or_another_runtime_is_not_used(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.protobuf.internal import api_implementation

    monkeypatch.setattr(descriptors, "PATH", str(tmp_path / "absent.bin"))
    assert descriptors._load() == {}
    (tmp_path / "other.bin").write_bytes(b"something else\n")
    monkeypatch.setattr(descriptors, "PATH", str(tmp_path / "other.bin"))
    assert descriptors._load() == {}
    monkeypatch.undo()
    assert descriptors._load() != {}  # the real one, as a control
    monkeypatch.setattr(api_implementation, "Type", lambda: "python")
    assert descriptors._load() == {}


def test_without_the_bundle_a_stand_in_imports_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(descriptors, "_namespaces", {})
    stand_in = descriptors.module("envoy.config.cluster.v3.cluster_pb2")
    assert stand_in.Cluster is cluster_pb2.Cluster
    # a module the bundle does not hold is imported too
    router = descriptors.module("envoy.extensions.filters.http.router.v3.router_pb2")
    assert router.Router.DESCRIPTOR.full_name == "envoy.extensions.filters.http.router.v3.Router"


def test_without_the_bundle_a_fresh_program_answers_the_same() -> None:
    """A program where the bundle is unusable imports the generated modules
    and decodes as one that uses it."""
    code = """
        import json, sys
        from pyxds.xds import descriptors
        if sys.argv[-1] == "off":
            descriptors._namespaces = {}
        from pyxds.xds.resources import CLUSTER
        Cluster = descriptors.module("envoy.config.cluster.v3.cluster_pb2").Cluster
        c = Cluster(name="c", type=Cluster.EDS)
        c.eds_cluster_config.eds_config.ads.SetInParent()
        bad = Cluster(name="d", type=Cluster.STATIC)
        got = [repr(CLUSTER.decode(m.SerializeToString())) for m in (c, bad)]
        loaded = "envoy.config.cluster.v3.cluster_pb2" in sys.modules
        print(json.dumps({"got": got, "loaded": loaded}))
        """
    on = _python(code)
    off = _python(code.replace('sys.argv[-1] == "off"', "True"))
    assert on["got"] == off["got"]
    assert "error=None" in on["got"][0] and "error=None" not in on["got"][1]
    assert (on["loaded"], off["loaded"]) == (False, True)


_MADE = """
def made():
    from google.protobuf import message
    out, stack = {}, list(message.Message.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        out[cls.DESCRIPTOR.full_name] = [cls.__module__, cls.__qualname__]
    return out
"""


@needs_current_bundle
def test_decoding_makes_only_the_classes_it_reaches_each_named_as_its_generated_module() -> None:
    """Decoding a resource of each type makes the classes of the messages it
    reads, not the bundle's other ~400 (the option and annotation schemas, a
    collection beside the cluster); those upb makes on demand for a field
    carry the generated module's names, as those a stand-in is asked for
    do; pickling finds them, and the modules imported afterwards hand back
    those very classes."""
    from pyxds.server import builders as b

    resources = {
        "LISTENER": b.listener("l"),
        "ROUTE_CONFIG": b.route_config(
            "r", [b.virtual_host("v", routes=[b.route("/", cluster="c")])]
        ),
        "CLUSTER": b.cluster("c"),
        "ENDPOINTS": b.endpoints("c", [b.locality("r", "z", endpoints=["10.0.0.1:80"])]),
    }
    hexed = {kind: m.SerializeToString().hex() for kind, m in resources.items()}
    out = _python(
        _MADE
        + f"""
import json, pickle
from pyxds.xds import descriptors, resources
errors = [
    getattr(resources, kind).decode(bytes.fromhex(data)).error
    for kind, data in {hexed!r}.items()
]
decoded = made()
rules = descriptors.module("validate.validate_pb2").FieldRules
entry = descriptors.module("envoy.data.accesslog.v3.accesslog_pb2").HTTPAccessLogEntry
cluster_pb2 = descriptors.module("envoy.config.cluster.v3.cluster_pb2")
collection = cluster_pb2.ClusterCollection
r = rules(string={{"min_len": 2}})
c = collection()
c.entries.inline_entry.name = "x"
again = pickle.loads(pickle.dumps(r)) == r and pickle.loads(pickle.dumps(c)) == c
asked = made()
from validate import validate_pb2
from envoy.config.cluster.v3 import cluster_pb2 as generated
from envoy.config.core.v3 import address_pb2
same = validate_pb2.FieldRules is rules and generated.ClusterCollection is collection and (
    generated.Cluster is cluster_pb2.Cluster
) and address_pb2.SocketAddress.DESCRIPTOR.full_name in decoded
print(json.dumps({{"errors": [str(e) for e in errors if e], "decoded": decoded,
                  "asked": asked, "again": again, "same": same,
                  "socket_address": [address_pb2.SocketAddress.__module__,
                                     address_pb2.SocketAddress.__qualname__]}}))
"""
    )
    assert out["errors"] == []
    decoded, asked = out["decoded"], out["asked"]
    # the messages decoding reads, some of them only through a field (upb's)
    assert {
        "envoy.config.listener.v3.Listener",
        "envoy.config.cluster.v3.Cluster",
        "envoy.config.endpoint.v3.ClusterLoadAssignment",
        "envoy.config.core.v3.SocketAddress",
    } <= set(decoded)
    assert len(decoded) < 150  # of the bundle's ~450
    assert not {
        "validate.FieldRules",
        "google.protobuf.FileOptions",
        "envoy.config.cluster.v3.ClusterCollection",
        "envoy.data.accesslog.v3.HTTPAccessLogEntry",
    } & set(decoded)
    for full_name, (module, qualname) in asked.items():
        assert module.endswith("_pb2"), (full_name, module)
        assert full_name.endswith("." + qualname), (full_name, qualname)
    assert asked["envoy.config.core.v3.SocketAddress"] == [
        "envoy.config.core.v3.address_pb2",
        "SocketAddress",
    ]
    assert asked["envoy.config.cluster.v3.Cluster.EdsClusterConfig"] == [
        "envoy.config.cluster.v3.cluster_pb2",
        "Cluster.EdsClusterConfig",
    ]
    assert asked["validate.FieldRules"] == ["validate.validate_pb2", "FieldRules"]
    assert asked["envoy.data.accesslog.v3.HTTPAccessLogEntry"][0] == (
        "envoy.data.accesslog.v3.accesslog_pb2"
    )
    assert out["again"] and out["same"]
    assert out["socket_address"] == ["envoy.config.core.v3.address_pb2", "SocketAddress"]


@needs_current_bundle
def test_with_an_init_subclass_of_protobufs_own_every_class_is_made_at_load() -> None:
    """A program (or library) that gave protobuf's ``Message`` an
    ``__init_subclass__`` keeps it: pyxds then makes every class of the
    bundle at load, as the generated modules would, so that upb never
    makes one on demand (named after the running code's module)."""
    out = _python(
        _MADE
        + """
import json
from google.protobuf import message
seen = []
message.Message.__init_subclass__ = classmethod(lambda cls, **kw: seen.append(cls))
from pyxds.xds import descriptors
cluster = descriptors.module("envoy.config.cluster.v3.cluster_pb2").Cluster
c = cluster.FromString(cluster(name="c").SerializeToString())
print(json.dumps({"made": made(), "kept": len(seen),
                  "eds": type(c.eds_cluster_config).__module__}))
"""
    )
    made = out["made"]
    assert len(made) > 400
    assert out["kept"] == len(made)  # the program's own hook saw each class
    assert all(module.endswith("_pb2") for module, _ in made.values())
    assert out["eds"] == "envoy.config.cluster.v3.cluster_pb2"


def test_a_module_size_is_the_size_stat_gives(tmp_path: pathlib.Path) -> None:
    """The bundle check reads each module's size from the end of the open
    file (cheaper than ``os.stat``): the same number, and -1 (no size a
    module has) for a file that is not there."""
    module = tmp_path / "m_pb2.py"
    module.write_bytes(b"x = 1\n" * 1000)
    assert descriptors._size(str(module)) == os.stat(module).st_size == 6000
    module.write_bytes(b"")
    assert descriptors._size(str(module)) == 0
    assert descriptors._size(str(tmp_path / "absent_pb2.py")) == -1
