"""The xDS protos a plain config needs, loaded without their generated
``_pb2`` modules (issue 18, start-up).

A first ``xds:`` RPC needs the Listener, RouteConfiguration, Cluster,
ClusterLoadAssignment and discovery messages: 67 generated modules of
xds-protos (envoy, xds, udpa, validate) and ~45 packages above them, and 8
of protobuf's own files (well-known types, ``google/rpc/status.proto``).
Importing them costs ~10 ms of CPU more than the descriptors themselves:
finding ~110 modules, and unmarshaling code objects that are mostly option
blocks a upb runtime never runs.  And importing any generated module loads
protobuf's pure-Python runtime (``descriptor_pool`` imports
``python_message``, which imports ``text_format``, the Python decoder and
encoder, ``pickle``...: ~8 ms), which a upb program does not otherwise use.
``descriptors.bin`` (written by ``scripts/gen_descriptors.py`` from the
installed packages) holds the serialized ``FileDescriptorProto`` of each
of those files, as the module holds it, in dependency order;
``module(name)`` gives a stand-in whose names are the generated module's,
loaded on the first name asked for.

What the load does is what importing the modules does, minus the modules
and the pure-Python runtime: each file's bytes go to upb's default pool
(``AddSerializedFile``; bytes equal to a file already there add nothing,
so a program may import the generated modules before or after); then each
file's messages, enums and extensions are made as protobuf's ``builder``
makes them for the module (the same metaclass, ``__module__`` and
``__qualname__``; a class the pool has already is that class, so a module
imported later hands back the very classes pyxds holds).  A module already
imported is used as it is.  The classes go into protobuf's symbol database
if a program has loaded it; one that loads it later finds a class there
once its generated module is imported (which registers it).

It is used only where it is known to be what the modules hold: the upb
runtime, a runtime not older than the generated code, for each package
root the distribution release the bundle was written from (its metadata
directory beside the packages: xds-protos, protobuf), and each module's
source file of the size recorded then (another release, or another
distribution's copy of a file, differs).  Otherwise, or if the pool
refuses a file, every stand-in imports its module: slower, the same
answers.

A file's names (its enums' wrappers and values, extensions, services) are
put together when a stand-in first asks for one of them, not at load; and
a message's class is made when a stand-in is first asked for it, not at
load: a plain first RPC reads 24 of the bundle's 451 messages, and making
a class is most of what loading costs (~80k instructions each: ~29 M of a
fresh program's first RPC when the 333 classes its named messages reach
through fields were made at load).  A message the program reaches
through a field (``cluster.eds_cluster_config``) gets its class from upb
on demand, which names it after the module of the Python code running
then; so while the bundle is in use, a class made for
one of its messages is given the generated module's ``__module__`` and
``__qualname__`` as it is made (:func:`_name_as_generated`, protobuf's
``Message.__init_subclass__``; nothing else about any class changes).  A
program that had loaded ``symbol_database`` before gets every class at
load, registered there, as before.
``tests/unit/test_proto_loading.py`` holds the answers equal whether a
program imports the modules before pyxds, after it, or never;
``tests/unit/test_descriptors.py`` the bundle, the fallback and the names.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from typing import Any

#: the bundle's first line (its format)
MAGIC = b"pyxds descriptors 1\n"
#: the bundle, next to this module
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "descriptors.bin")

_lock = threading.Lock()
#: module name -> its names (a generated module's globals, or the module's
#: ``__dict__``); None until loaded, {} when the bundle cannot be used
_namespaces: dict[str, dict[str, Any]] | None = None
#: in the names of a file: its top-level messages whose classes are not made
#: yet, by name (see the module docstring; a stand-in never looks a dunder up)
_UNMADE = "__unmade__"
#: in the names of a file until a stand-in first asks for one: its file
#: descriptor, whose enums, extensions, services and messages are not in
#: the names yet (:func:`_fill`)
_UNFILLED = "__unfilled__"
#: proto file name -> generated module name, of the bundle's files (set at
#: load; what :func:`_name_as_generated` names classes after)
_modules: dict[str, str] = {}
#: protobuf's ``Message``, once :func:`_name_as_generated` is installed on it
_base: list[type] = []


class _Generated:
    """Stands in for a generated ``_pb2`` module: ``stand_in.Cluster`` is
    ``cluster_pb2.Cluster``.  Each name is looked up once, then kept."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy, pickle and inspect probes
            raise AttributeError(attr)
        value = _lookup(self.__name__, attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<stand-in for generated module {self.__name__!r}>"


def module(name: str) -> Any:
    """A stand-in for the generated module ``name`` (loading nothing yet)."""
    return _Generated(name)


def _lookup(name: str, attr: str) -> Any:
    namespace = _loaded().get(name)
    if namespace is None:  # not in the bundle, or the bundle is not usable
        return getattr(importlib.import_module(name), attr)
    if _UNFILLED in namespace:
        _fill(namespace)
    if attr not in namespace and attr in namespace.get(_UNMADE, ()):
        _make_unmade(name, attr)
    try:
        return namespace[attr]
    except KeyError:
        raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None


def _make_unmade(name: str, attr: str) -> None:
    """The class of the top-level message ``attr`` of module ``name``, into
    the module's names (a class nested in it is made when first named, as a
    field's: ``Cluster.EdsClusterConfig`` is upb's, named as generated)."""
    with _lock:
        namespace = (_namespaces or {})[name]
        unmade = namespace.get(_UNMADE, {})
        desc = unmade.get(attr)
        if desc is not None:
            _make_classes([(name, [desc])], {name: namespace}, nested=False)
            # after the class is in: a lookup on another thread that finds
            # it no longer unmade finds it made (else it waits on the lock)
            del unmade[attr]
        if not unmade:
            namespace.pop(_UNMADE, None)


def _fill(namespace: dict[str, Any]) -> None:
    """The names of a file a stand-in first asks for, as its generated
    module has them: a first RPC asks for 8 of the bundle's 75 files, whose
    enum wrappers, extensions and name maps were ~1.3 M instructions at
    load (issue 18, start-up)."""
    with _lock:
        file = namespace.get(_UNFILLED)
        if file is not None:
            _add_names(namespace, file)
            namespace[_UNMADE] = dict(file.message_types_by_name.items())
            # last: another thread's lookup that no longer sees the mark
            # finds every name (one that still sees it waits on the lock)
            del namespace[_UNFILLED]


def _add_names(namespace: dict[str, Any], file: Any) -> None:
    """Into a file's names: its enums (wrapper, descriptor, values),
    extensions and services, as its generated module holds them."""
    from google.protobuf.internal import enum_type_wrapper

    for enum_name, enum in file.enum_types_by_name.items():
        namespace["_" + enum_name.upper()] = enum
        namespace[enum_name] = enum_type_wrapper.EnumTypeWrapper(enum)
        for value in enum.values:
            namespace[value.name] = value.number
    for ext_name, extension in file.extensions_by_name.items():
        namespace[ext_name.upper() + "_FIELD_NUMBER"] = extension.number
        namespace[ext_name] = extension
    for service_name, service in file.services_by_name.items():
        namespace["_" + service_name.upper()] = service


def _name_as_generated(cls: Any, /, **kwargs: Any) -> None:
    """protobuf's ``Message.__init_subclass__`` while the bundle is in use:
    a class made for one of the bundle's messages gets the generated
    module's ``__module__`` and ``__qualname__`` (upb makes the class a
    field needs on demand, named after the running code's module)."""
    desc = cls.__dict__.get("DESCRIPTOR")
    file: Any = getattr(desc, "file", None)
    module = _modules.get(getattr(file, "name", ""))
    if module is not None and cls.__module__ != module:
        package = file.package
        cls.__module__ = module
        cls.__qualname__ = desc.full_name[len(package) + 1 :] if package else desc.full_name
        symbols = sys.modules.get("google.protobuf.symbol_database")
        if symbols is not None:  # loaded by the program: as the modules would
            symbols.Default().RegisterMessage(cls)
    base: Any = _base[0]
    super(base, cls).__init_subclass__(**kwargs)


def _name_classes_as_generated(header: dict[str, Any]) -> bool:
    """Install :func:`_name_as_generated` (False: protobuf's ``Message``
    has an ``__init_subclass__`` of its own: every class is then made at
    load, and upb never makes one on demand)."""
    from google.protobuf import message

    base = message.Message
    hook = base.__dict__.get("__init_subclass__")
    if hook is not None and getattr(hook, "__func__", None) is not _name_as_generated:
        return False
    _modules.update((entry["name"], entry["module"]) for entry in header["files"])
    _base[:] = [base]
    base.__init_subclass__ = classmethod(_name_as_generated)  # type: ignore[assignment, method-assign]
    return True


def _loaded() -> dict[str, dict[str, Any]]:
    global _namespaces
    if _namespaces is None:
        with _lock:
            if _namespaces is None:
                _namespaces = _load()
    return _namespaces


def read(path: str | None = None) -> tuple[dict[str, Any], list[bytes]]:
    """The bundle's header (``distributions``: each package root's
    distribution; ``gencode``: the generated code's protobuf version;
    ``files``: per file, its proto ``name``, ``module``, package ``root``,
    ``size`` of the module's source and ``length`` of its bytes) and each
    file's serialized descriptor."""
    import json

    path = PATH if path is None else path
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC):
        raise ValueError(f"{path}: not a pyxds descriptors bundle")
    end = data.index(b"\n", len(MAGIC))
    header = json.loads(data[len(MAGIC) : end])
    blobs, at = [], end + 1
    for entry in header["files"]:
        blobs.append(data[at : at + entry["length"]])
        at += entry["length"]
    if at != len(data):
        raise ValueError(f"{path}: {len(data) - at} bytes past the last file")
    return header, blobs


def _usable(header: dict[str, Any]) -> bool:
    """Whether the bundle holds what the installed modules hold (see the
    module docstring)."""
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() != "upb":
        return False
    major, minor, patch = header["gencode"]
    if runtime_version() < (major, minor, patch):
        return False  # the modules raise VersionError: let them
    dirs: dict[str, str] = {}
    releases: set[str] = set()  # metadata directories found
    for entry in header["files"]:
        root = entry["root"]
        if root not in dirs:
            found = _package_dir(root)
            if found is None:
                return False
            # the release the bundle was written from (same version, same
            # bytes; two releases' files can differ in a byte, not in size),
            # looked for once per site and distribution
            site = found
            for _ in range(root.count(".") + 1):
                site = os.path.dirname(site)
            release = os.path.join(site, header["distributions"][root])
            if release not in releases:
                if not os.path.isdir(release):
                    return False
                releases.add(release)
            dirs[root] = found + os.sep
        # the module's path under its root's directory (os.path.join per
        # file was a third of this check: issue 18, start-up)
        rest = entry["module"][len(root) + 1 :].replace(".", os.sep)
        if _size(dirs[root] + rest + ".py") != entry["size"]:
            return False
    return True


def _size(path: str) -> int:
    """The size of the file at ``path``, -1 if it cannot be opened: the end
    of the open file, where ``os.stat`` made a ``stat_result`` (~9k
    instructions; ~4k this way, 75 files on a first RPC: issue 18,
    start-up)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return -1
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


#: the leading ``major.minor.patch`` of a release string
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def runtime_version() -> tuple[int, int, int]:
    """protobuf's runtime version, as ``runtime_version`` holds it
    (``MAJOR``, ``MINOR``, ``PATCH``): read from the package's
    ``__version__``, the same release string, without importing that
    module, whose ``Domain`` enum class was ~0.9 M instructions of a fresh
    program's first RPC (issue 18, start-up); imported where the string
    does not start with ``N.N.N``."""
    import google.protobuf

    release = _RELEASE.match(getattr(google.protobuf, "__version__", ""))
    if release is not None:
        return int(release[1]), int(release[2]), int(release[3])
    from google.protobuf import runtime_version as runtime

    return runtime.MAJOR, runtime.MINOR, runtime.PATCH


def _package_dir(package: str) -> str | None:
    """The directory of ``package``, found without importing it (its parent
    package, if any, is imported)."""
    loaded = sys.modules.get(package)
    locations = getattr(loaded, "__path__", None)
    if locations is None:
        from importlib.machinery import PathFinder

        parent, _, name = package.rpartition(".")
        path = None
        if parent:
            path = getattr(importlib.import_module(parent), "__path__", None)
            if path is None:
                return None
        spec = PathFinder.find_spec(name if parent else package, path)
        locations = spec.submodule_search_locations if spec is not None else None
    return next(iter(locations), None) if locations else None


def _load() -> dict[str, dict[str, Any]]:
    try:
        header, blobs = read()
    except (OSError, ValueError, KeyError):
        return {}
    if not _usable(header):
        return {}
    # upb's pool (checked above; no type stubs: imported by name)
    pool = importlib.import_module("google._upb._message").default_pool
    try:
        files = [pool.AddSerializedFile(blob) for blob in blobs]
    except Exception:  # a different file of that name is in the pool
        return {}
    namespaces: dict[str, dict[str, Any]] = {}
    lazy = "google.protobuf.symbol_database" not in sys.modules and _name_classes_as_generated(
        header
    )
    eager: list[tuple[str, list[Any]]] = []
    for entry, file in zip(header["files"], files, strict=True):
        name = entry["module"]
        imported = sys.modules.get(name)
        if imported is not None:
            namespaces[name] = imported.__dict__
            continue
        namespace: dict[str, Any] = {"DESCRIPTOR": file}
        namespaces[name] = namespace
        if lazy:
            namespace[_UNFILLED] = file
        else:
            _add_names(namespace, file)
            eager.append((name, list(file.message_types_by_name.values())))
    _make_classes(eager, namespaces)
    return namespaces


def _make_classes(
    files: list[tuple[str, list[Any]]], namespaces: dict[str, dict[str, Any]], nested: bool = True
) -> None:
    """The classes of top-level messages and (``nested``) their nested ones
    (``files``: module name and message descriptors) into the module's
    names, as
    protobuf's builder
    (google/protobuf/internal/builder.py) makes them for the module, minus
    its imports: the symbol database pulls in the pure-Python runtime.  The
    classes go into the symbol database if the program has loaded it."""
    from google.protobuf import message

    # the metaclass protobuf's builder uses with upb (no type stubs: by name)
    meta = importlib.import_module("google.protobuf.pyext.cpp_message").GeneratedProtocolMessageType
    made: list[Any] = []

    def message_class(module_name: str, desc: Any, prefix: str) -> Any:
        body = {
            name: message_class(module_name, inner, prefix + desc.name + ".")
            for name, inner in (desc.nested_types_by_name.items() if nested else ())
        }
        body.update(DESCRIPTOR=desc, __module__=module_name, __qualname__=prefix + desc.name)
        made.append(meta(desc.name, (message.Message,), body))
        return made[-1]

    for name, messages in files:
        namespace = namespaces[name]
        for desc in messages:
            namespace[desc.name] = message_class(name, desc, "")
    symbols = sys.modules.get("google.protobuf.symbol_database")
    if symbols is not None:  # loaded by the program: as the modules would
        database = symbols.Default()
        for made_class in made:
            database.RegisterMessage(made_class)
