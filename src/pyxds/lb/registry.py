"""The LB policy registry and the service-config selection rule.

A28 ("the first known (registered) policy name in the list will be picked"),
as gRPC applies ``loadBalancingConfig``: walk the list (each entry up to the
chosen one must hold an object, as in grpcio 1.85), take the first entry
whose name is registered; if that entry's config fails validation the whole
list is invalid (no moving on); if no name is registered, that is an error
listing the names seen.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pyxds._values import dataclass
from pyxds.lb.api import PolicyFactory
from pyxds.lb.errors import LBConfigError, describe, drop_nulls

_log = logging.getLogger(__name__)
_factories: dict[str, PolicyFactory] = {}
_lock = threading.Lock()

#: The built-in policies by registered name, each loaded (it registers
#: itself) the first time its name is asked for: a channel loads the policies
#: its config names, not all of them (start-up, issue 18).
BUILTINS: dict[str, str] = {
    "pick_first": "pyxds.lb.pick_first",
    "round_robin": "pyxds.lb.round_robin",
    "ring_hash_experimental": "pyxds.lb.ring_hash",
    "weighted_round_robin": "pyxds.lb.weighted_round_robin",
    "outlier_detection_experimental": "pyxds.lb.outlier_detection",
    "least_request_experimental": "pyxds.lb.least_request",
    "priority_experimental": "pyxds.lb.priority",
    "weighted_target_experimental": "pyxds.lb.weighted_target",
    "xds_wrr_locality_experimental": "pyxds.lb.xds_wrr_locality",
    "xds_cluster_manager_experimental": "pyxds.lb.xds_cluster_manager",
    "cds_experimental": "pyxds.lb.cds",
    "xds_cluster_impl_experimental": "pyxds.lb.xds_cluster_impl",
    "xds_override_host_experimental": "pyxds.lb.xds_override_host",
    "xds_routing_experimental": "pyxds.lb.xds_routing",
    "rls_experimental": "pyxds.lb.rls",
}
_loaded: set[str] = set()
#: held while a built-in module loads: two threads loading at once (a
#: channel's policies and :func:`load_ahead`) must not each put back a
#: snapshot of the registrations taken while the other's module was
#: registering (a user's registration would be lost)
_loading = threading.RLock()

#: What every ``xds:`` channel's tree is made of (A74/A75: the cluster
#: manager, cds, priority, xds_cluster_impl, outlier_detection,
#: xds_override_host, xds_wrr_locality, weighted_target) and the default
#: endpoint policy (round_robin of pick_first), in the order a first config
#: needs them (a CDS resource's policy is checked as it is decoded, the tree
#: is built once the endpoints come): what :func:`load_ahead` loads while
#: the first ADS responses are on their way.
XDS_TREE = (
    "round_robin",
    "pick_first",
    "xds_cluster_manager_experimental",
    "cds_experimental",
    "outlier_detection_experimental",
    "xds_cluster_impl_experimental",
    "xds_override_host_experimental",
    "priority_experimental",
    "xds_wrr_locality_experimental",
    "weighted_target_experimental",
)


def register(factory: PolicyFactory) -> None:
    """Register (or replace) a policy factory under ``factory.name``.  A
    user's registration stands even when the built-in of that name loads
    later."""
    with _lock:
        _factories[factory.name] = factory


def unregister(name: str) -> None:
    with _lock:
        _factories.pop(name, None)


def get(name: str) -> PolicyFactory | None:
    """The factory registered under ``name``, or None."""
    factory = _factories.get(name)
    if factory is None and name in BUILTINS:
        _load_builtin(BUILTINS[name])
        factory = _factories.get(name)
    return factory


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
        if not isinstance(config, dict):
            # Checked before the name is looked up, as grpcio 1.85 does: an
            # entry's config is an object even when its policy is unknown, and
            # null is not an empty object ({"pick_first": null} sets no policy
            # in proto3 JSON; C-core: "child entry should be of type object").
            raise LBConfigError(
                f"{entry_path}.{name}" if path else name,
                f"expected object, got {describe(config)}",
            )
        factory = get(name)
        if factory is None:
            if config is not None and not isinstance(config, dict):
                # C-core checks every entry it passes over: an unknown
                # policy's config must still be an object (grpcio 1.85:
                # "child entry should be of type object")
                raise LBConfigError(
                    f"{entry_path}.{name}", f"expected object, got {describe(config)}"
                )
            seen.append(name)
            continue
        try:
            # A member set to null is a member not there (C-core's loader).
            return factory, factory.parse_config(drop_nulls(config))
        except LBConfigError as err:
            # Factories raise paths relative to their own config object; the
            # outermost list (path "") is named by the policy alone, so that
            # errors read `priority_experimental.children["p0"].config[0]...`.
            raise err.under(f"{entry_path}.{name}" if path else name) from None
    listed = ", ".join(seen) if seen else "(empty list)"
    raise LBConfigError(path, f"no supported load balancing policy in list: {listed}")


def load_ahead(names: tuple[str, ...] = XDS_TREE) -> None:
    """Load the built-in policies of ``names`` now, as :func:`get` would
    when first asked (a user's registration stands); a failure is left for
    :func:`get` to raise where the policy is used.  Run on a thread of its
    own while the first xDS resources are on their way (issue 18, start-up:
    the loading then overlaps the wait instead of following it)."""
    for name in names:
        module = BUILTINS.get(name)
        if module is not None:
            try:
                _load_builtin(module)
            except Exception:  # get() raises it again where it matters
                _log.debug("loading %s ahead failed", module, exc_info=True)


def _load_builtin(module: str) -> None:
    """Import one built-in policy module (it registers its policies); a
    name registered before (a user's policy) keeps its registration."""
    if module in _loaded:
        return
    import importlib

    with _loading:
        if module in _loaded:
            return
        with _lock:
            before = dict(_factories)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
        with _lock:
            _factories.update(before)
            _loaded.add(module)


def _load_builtins() -> None:
    """Import every built-in policy (what :func:`names` lists)."""
    failures: list[BaseException] = []
    for module in BUILTINS.values():
        try:
            _load_builtin(module)
        except Exception as err:  # import every module, then report the first failure
            failures.append(err)
    if failures:
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
