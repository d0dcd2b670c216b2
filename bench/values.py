"""Value classes: ``pyxds._values.dataclass`` against ``dataclasses.dataclass``
on the same class bodies, side by side (issue 18, start-up).

* define: the time to decorate one class (a fresh class body each time; the
  templates ``pyxds._values`` compiles once per shape are warm after the first
  round, as in a process that has defined a few classes, and are counted
  apart on a cold interpreter by ``--cold``);
* per object, the hot operations of an EDS update: constructing an
  ``EndpointAddress``-shaped class (5 fields, defaults) and an ``Endpoint``-
  shaped one (a factory, an ``init=False`` field, ``__post_init__``), ``==``,
  ``hash`` and ``<`` (``order=True``) on 3-field values.

Each figure is the median of ``--rounds`` rounds, the two decorators
alternating inside every round; ratios are pyxds / standard.

Run:  python bench/values.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable
from typing import Any

from pyxds import _values


def _bodies() -> dict[str, tuple[Callable[[], dict[str, Any]], dict[str, Any]]]:
    def endpoint_address() -> dict[str, Any]:
        return {
            "__annotations__": {
                "addresses": "tuple[str, ...]",
                "weight": "int",
                "health_status": "str",
                "hostname": "str",
                "hash_key": "str",
            },
            "weight": 1,
            "health_status": "UNKNOWN",
            "hostname": "",
            "hash_key": "",
        }

    def endpoint() -> dict[str, Any]:
        def __post_init__(self: Any) -> None:
            if not isinstance(self.addresses, tuple):
                object.__setattr__(self, "addresses", tuple(self.addresses))

        return {
            "__annotations__": {"addresses": "tuple", "attributes": "dict", "below": "object"},
            "attributes": dataclasses.field(default_factory=dict),
            "below": dataclasses.field(default=None, init=False, compare=False),
            "__post_init__": __post_init__,
        }

    def locality() -> dict[str, Any]:
        return {
            "__annotations__": {"region": "str", "zone": "str", "sub_zone": "str"},
            "region": "",
            "zone": "",
            "sub_zone": "",
        }

    return {
        "EndpointAddress": (endpoint_address, {"frozen": True, "slots": True}),
        "Endpoint": (endpoint, {"frozen": True, "slots": True}),
        "LocalityName": (locality, {"frozen": True, "slots": True, "order": True}),
    }


def _classes(decorator: Any) -> dict[str, Any]:
    return {
        name: decorator(**params)(type(name, (), make()))
        for name, (make, params) in _bodies().items()
    }


def _per_object(classes: dict[str, Any]) -> dict[str, Callable[[], object]]:
    address, endpoint, name = (
        classes["EndpointAddress"],
        classes["Endpoint"],
        classes["LocalityName"],
    )
    a1, a2 = address(("10.0.0.1:80",), 2), address(("10.0.0.1:80",), 2)
    n1, n2 = name("r", "z", "a"), name("r", "z", "b")
    attributes = {"weight": 1}
    return {
        "EndpointAddress(...)": lambda: address(
            ("10.0.0.1:80",), weight=3, health_status="HEALTHY"
        ),
        "Endpoint(...)": lambda: endpoint(("10.0.0.1:80",), attributes),
        "== (5 fields)": lambda: a1 == a2,
        "hash (3 fields)": lambda: hash(n1),
        "< (3 fields)": lambda: n1 < n2,
    }


def _define(decorator: Any) -> float:
    """Seconds to decorate the three bodies once."""
    bodies = [(make(), params) for make, params in _bodies().values()]
    start = timeit.default_timer()
    for namespace, params in bodies:
        decorator(**params)(type("C", (), namespace))
    return timeit.default_timer() - start


def _cold() -> None:
    """A fresh interpreter per decorator: the first definitions, templates
    compiled included."""
    code = (
        "import dataclasses, sys, timeit\n"
        "sys.path.insert(0, {here!r})\n"
        "import values\n"
        "from pyxds import _values\n"
        "decorator = {decorator}\n"
        "print(values._define(decorator) * 1e6)\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    seen: dict[str, list[float]] = {"standard": [], "pyxds": []}
    for _ in range(7):
        for name, decorator in (
            ("standard", "dataclasses.dataclass"),
            ("pyxds", "_values.dataclass"),
        ):
            out = subprocess.run(
                [sys.executable, "-c", code.format(here=here, decorator=decorator)],
                capture_output=True,
                text=True,
                check=True,
            )
            seen[name].append(float(out.stdout))
    std, ours = statistics.median(seen["standard"]), statistics.median(seen["pyxds"])
    print(f"  first 3 classes of a process   {std:8.0f} us {ours:8.0f} us  {ours / std:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cold", action="store_true", help="also time a fresh interpreter")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    standard, ours = (
        _per_object(_classes(dataclasses.dataclass)),
        _per_object(_classes(_values.dataclass)),
    )
    define: dict[str, list[float]] = {"standard": [], "pyxds": []}
    ops: dict[str, dict[str, list[float]]] = {name: {"standard": [], "pyxds": []} for name in ours}
    for _ in range(args.rounds):
        for tag, decorator in (("standard", dataclasses.dataclass), ("pyxds", _values.dataclass)):
            define[tag].append(min(_define(decorator) for _ in range(20)) * 1e6 / 3)
        for name in ours:
            for tag, table in (("standard", standard), ("pyxds", ours)):
                best = min(timeit.repeat(table[name], number=20000, repeat=3))
                ops[name][tag].append(best / 20000 * 1e9)
    print(f"{'':34} {'standard':>11} {'pyxds':>11}  ratio")
    std, mine = statistics.median(define["standard"]), statistics.median(define["pyxds"])
    print(f"  define one class (warm)        {std:8.0f} us {mine:8.0f} us  {mine / std:5.2f}")
    if args.cold:
        _cold()
    for name, seen in ops.items():
        std, mine = statistics.median(seen["standard"]), statistics.median(seen["pyxds"])
        print(f"  {name:<30} {std:8.0f} ns {mine:8.0f} ns  {mine / std:5.2f}")


if __name__ == "__main__":
    main()
