"""The LB policy registry and the service-config selection rule.

A28 ("the first known (registered) policy name in the list will be picked"),
as gRPC applies ``loadBalancingConfig``: walk the list, take the first entry
whose name is registered; if that entry's config fails validation the whole
list is invalid (no moving on); if no name is registered, that is an error
listing the names seen.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from pyxds.lb.api import PolicyFactory
from pyxds.lb.errors import LBConfigError, describe

_factories: dict[str, PolicyFactory] = {}
_lock = threading.Lock()
_builtins_loaded = False


def register(factory: PolicyFactory) -> None:
    """Register (or replace) a policy factory under ``factory.name``."""
    with _lock:
        _factories[factory.name] = factory


def unregister(name: str) -> None:
    with _lock:
        _factories.pop(name, None)


def get(name: str) -> PolicyFactory | None:
    """The factory registered under ``name``, or None."""
    _load_builtins()
    return _factories.get(name)


def names() -> list[str]:
    _load_builtins()
    return sorted(_factories)


def select(load_balancing_config_list: Any, path: str = "") -> tuple[PolicyFactory, Any]:
    """Pick the first registered policy of a ``loadBalancingConfig`` list.

    ``path`` is the JSON path of the list itself ("" for a top-level list).
    Returns ``(factory, parsed_config)``.  Raises :class:`LBConfigError`
    naming the JSON path when the list is malformed, when the chosen entry's
    config is invalid, or when no entry names a registered policy.
    """
    _load_builtins()
    if not isinstance(load_balancing_config_list, list):
        raise LBConfigError(path, f"expected array, got {describe(load_balancing_config_list)}")
    seen: list[str] = []
    for index, entry in enumerate(load_balancing_config_list):
        entry_path = f"{path}[{index}]"
        if not isinstance(entry, dict) or len(entry) != 1:
            raise LBConfigError(
                entry_path, f"expected an object with exactly one key, got {describe(entry)}"
            )
        ((name, config),) = entry.items()
        factory = _factories.get(name)
        if factory is None:
            seen.append(name)
            continue
        if config is None:
            config = {}
        try:
            return factory, factory.parse_config(config)
        except LBConfigError as err:
            # Factories raise paths relative to their own config object; the
            # outermost list (path "") is named by the policy alone, so that
            # errors read `priority_experimental.children["p0"].config[0]...`.
            raise err.under(f"{entry_path}.{name}" if path else name) from None
    listed = ", ".join(seen) if seen else "(empty list)"
    raise LBConfigError(path, f"no supported load balancing policy in list: {listed}")


def _load_builtins() -> None:
    """Import the built-in policies once so they register themselves."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    import importlib

    failures: list[BaseException] = []
    for module in (
        "pyxds.lb.pick_first",
        "pyxds.lb.round_robin",
        "pyxds.lb.ring_hash",
        "pyxds.lb.weighted_round_robin",
        "pyxds.lb.outlier_detection",
        "pyxds.lb.least_request",
        "pyxds.lb.priority",
        "pyxds.lb.weighted_target",
        "pyxds.lb.xds_wrr_locality",
        "pyxds.lb.xds_cluster_manager",
        "pyxds.lb.cds",
        "pyxds.lb.xds_cluster_impl",
        "pyxds.lb.xds_override_host",
        "pyxds.lb.xds_routing",
        "pyxds.lb.rls",
    ):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                failures.append(err)
        except Exception as err:  # import every module, then report the first failure
            failures.append(err)
    if failures:
        _builtins_loaded = False  # a later call retries (and raises again)
        raise failures[0]


@dataclass(frozen=True)
class PolicySelection:
    """A child policy chosen from a ``loadBalancingConfig`` list: the policy's
    registered name and its parsed (frozen, comparable) config.  Parents store
    these in their own parsed configs and hand them to a ChildPolicyHandler."""

    name: str
    config: Any

    @property
    def factory(self) -> PolicyFactory:
        factory = get(self.name)
        if factory is None:  # unregistered after parsing: a programming error
            raise LBConfigError(self.name, "policy is no longer registered")
        return factory


def select_policy(load_balancing_config_list: Any, path: str = "") -> PolicySelection:
    """:func:`select`, returning a :class:`PolicySelection`."""
    factory, config = select(load_balancing_config_list, path)
    return PolicySelection(factory.name, config)
