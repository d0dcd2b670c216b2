"""The layers of docs/architecture.md, checked on the imports of the source.

Config flows down: xds -> resolver -> lb -> channel; xDS-enabled servers
(``pyxds.serving``) sit beside the channel on the xDS client.  The xDS client knows
nothing above it (the exceptions: CDS validation asks the LB registry
whether a policy config is valid, gRFC A52, and RDS validation whether a
cluster specifier plugin's generated config is, as C-core's parser does);
the resolver and the LB policies never reach into the channel (the xDS LB
policies do read the resolver's XdsConfig, A74); production code never
imports ``pyxds.testing``; no two channel modules import each other.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "pyxds"

# (importing package, imported package, modules allowed to do it anyway)
FORBIDDEN = [
    (
        "xds",
        "pyxds.lb",
        {
            "xds/resources/cluster.py",
            "xds/resources/lb_policy.py",
            "xds/resources/cluster_specifier.py",
        },
    ),
    ("xds", "pyxds.resolver", set()),
    ("xds", "pyxds.channel", set()),
    ("resolver", "pyxds.channel", set()),
    ("lb", "pyxds.channel", set()),
    # xDS-enabled servers sit beside the channel: nothing below imports
    # them, and they use neither the channel nor the LB policies.
    ("xds", "pyxds.serving", set()),
    ("resolver", "pyxds.serving", set()),
    ("lb", "pyxds.serving", set()),
    ("channel", "pyxds.serving", set()),
    ("serving", "pyxds.channel", set()),
    ("serving", "pyxds.lb", set()),
]


def _runtime_nodes(tree: ast.AST):
    """Every node, but those under ``if TYPE_CHECKING:`` (never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports when it runs, at module level or inside
    functions (imports for type checkers only do not count)."""
    names: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules(package: str) -> list[pathlib.Path]:
    return sorted((SRC / package).rglob("*.py"))


@pytest.mark.parametrize(("package", "banned", "allowed"), FORBIDDEN)
def test_a_lower_layer_never_imports_a_higher_one(package, banned, allowed):
    offenders = []
    for path in _modules(package):
        rel = path.relative_to(SRC).as_posix()
        if rel in allowed:
            continue
        bad = sorted(n for n in _imports(path) if n == banned or n.startswith(banned + "."))
        if bad:
            offenders.append(f"{rel}: {bad}")
    assert not offenders, offenders


def test_production_code_never_imports_the_testing_package():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("testing/"):
            continue
        if any(n == "pyxds.testing" or n.startswith("pyxds.testing.") for n in _imports(path)):
            offenders.append(rel)
    assert not offenders, offenders


def test_the_status_type_is_shared_from_below_every_layer():
    from pyxds import status
    from pyxds.lb import api

    assert api.Status is status.Status and api.OK_STATUS is status.OK_STATUS
    for package in ("xds", "resolver"):
        for path in _modules(package):
            assert "pyxds.lb.api.Status" not in _imports(path), path


def test_no_two_channel_modules_import_each_other():
    graph = {
        path.stem: {
            n.split(".")[2]
            for n in _imports(path)
            if n.startswith("pyxds.channel.") and n.count(".") >= 2
        }
        for path in _modules("channel")
    }
    cycles = sorted(
        (a, b) for a, deps in graph.items() for b in deps if a < b and a in graph.get(b, set())
    )
    assert not cycles, cycles
