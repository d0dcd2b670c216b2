"""``xds_wrr_locality_experimental``: weighted_target over the EDS localities.

gRFC A52 ("xDS WRR Locality Load Balancer"): the policy the xDS
``WrrLocality`` extension maps to.  Config ``{"childPolicy": [...]}`` names
the endpoint-picking policy of each locality.  On every update it builds a
``weighted_target_experimental`` config with one target per locality, weighted
by the EDS locality weight, each target running ``childPolicy``.

Inputs per endpoint (set by the cds policy, :mod:`pyxds.lb.cds`):

* ``hierarchical_path``: after the priority level, ``(locality name,)``; the
  first element is the target name, so weighted_target's hierarchical split
  sends each endpoint to its locality's child.
* ``locality_weight``: the locality's EDS weight.  An endpoint without one
  (or with 0) adds no target, as in C-core (grpc-go and grpc-java fail the
  update instead; EDS drops zero-weight localities, so only a hand-made
  config gets here).  A52: when one locality
  carries several weights, the first one seen wins and the others are
  logged as a warning (once per update and locality).
* ``locality`` (a LocalityName) names the target when there is no path.

Rules:

* No endpoints at all: no child; report TRANSIENT_FAILURE with the reason the
  cds policy passed as ``resolution_note`` (e.g. "EDS resource X: all
  endpoints unhealthy"), never an anonymous "no children" (TRAPS.md, "Seen in
  grpcio 1.85.1's C-core").  The child (and its subchannels) is shut down.
* The generated config is parsed once per distinct (targets, childPolicy)
  and compared by value downstream, so the same localities twice change
  nothing below.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import grpc

from pyxds._values import dataclass
from pyxds.lb import registry
from pyxds.lb.api import (
    ConnectivityState,
    FailPicker,
    Helper,
    LoadBalancer,
    PolicyFactory,
    ResolverUpdate,
    Status,
)
from pyxds.lb.child_handler import ChildPolicyHandler
from pyxds.lb.errors import LBConfigError, expect_object
from pyxds.lb.hierarchy import PATH_KEY
from pyxds.lb.registry import PolicySelection

_log = logging.getLogger(__name__)

NAME = "xds_wrr_locality_experimental"
WEIGHTED_TARGET = "weighted_target_experimental"
LOCALITY_ATTRIBUTE = "locality"
LOCALITY_WEIGHT_ATTRIBUTE = "locality_weight"


@dataclass(frozen=True)
class XdsWrrLocalityConfig:
    """Parsed config: the child policy as canonical JSON text (to rebuild the
    weighted_target config) and as the validated selection."""

    child_policy_json: str
    child_policy: PolicySelection


class XdsWrrLocalityPolicy(LoadBalancer):
    """See the module docstring."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self._child: ChildPolicyHandler | None = None
        self._cache_key: tuple[Any, ...] | None = None
        self._cache_value: PolicySelection | None = None

    @property
    def child(self) -> LoadBalancer | None:
        """The weighted_target policy (introspection)."""
        return self._child.child if self._child is not None else None

    def update(self, update: ResolverUpdate) -> Status | None:
        config: XdsWrrLocalityConfig = update.config
        endpoints = update.endpoints
        if isinstance(endpoints, Status):
            if self._child is not None and self._cache_value is not None:
                return self._child.update(update.replace(config=self._cache_value))
            self._fail(endpoints)
            return None
        weights: dict[str, int] = {}
        #: locality -> weights discarded for it (A52: warned about)
        conflicts: dict[str, set[int]] = {}
        for endpoint in endpoints:
            attributes = endpoint.attributes
            path = attributes.get(PATH_KEY)
            if path:
                target = path[0]
            else:
                locality = attributes.get(LOCALITY_ATTRIBUTE)
                if locality is None:
                    continue
                target = str(locality)
            weight = attributes.get(LOCALITY_WEIGHT_ATTRIBUTE)
            if not weight:
                continue  # no weight, no target (C-core)
            first = weights.setdefault(target, weight)
            if first != weight:
                conflicts.setdefault(target, set()).add(weight)
        for target, discarded in conflicts.items():
            _log.warning(
                "xds_wrr_locality: locality %s has several weights; using the first, %d, "
                "and discarding %s",
                target,
                weights[target],
                ", ".join(map(str, sorted(discarded))),
            )
        if not weights:
            note = update.resolution_note or "no endpoints in any locality"
            self._fail(Status(grpc.StatusCode.UNAVAILABLE, note))
            return None
        try:
            selection = self._weighted_target_config(weights, config.child_policy_json)
        except LBConfigError as err:
            status = Status(grpc.StatusCode.INTERNAL, f"xds_wrr_locality: {err}")
            self._fail(status)
            return status
        if self._child is None:
            self._child = ChildPolicyHandler(self.helper)
        return self._child.update(update.replace(config=selection))

    def resolver_error(self, status: Status) -> None:
        if self._child is not None:
            self._child.resolver_error(status)
        else:
            self._fail(status)

    def exit_idle(self) -> None:
        if self._child is not None:
            self._child.exit_idle()

    def reset_backoff(self) -> None:
        if self._child is not None:
            self._child.reset_backoff()

    def shutdown(self) -> None:
        if self._child is not None:
            self._child.shutdown()
            self._child = None

    # -- internals -----------------------------------------------------
    def _fail(self, status: Status) -> None:
        self.shutdown()
        self._cache_key = self._cache_value = None
        self.helper.update_state(ConnectivityState.TRANSIENT_FAILURE, status, FailPicker(status))

    def _weighted_target_config(self, weights: dict[str, int], child_json: str) -> PolicySelection:
        key = (tuple(sorted(weights.items())), child_json)
        if key == self._cache_key and self._cache_value is not None:
            return self._cache_value
        child_policy = json.loads(child_json)
        targets = {name: {"weight": weight, "childPolicy": child_policy} for name, weight in key[0]}
        selection = registry.select_policy([{WEIGHTED_TARGET: {"targets": targets}}])
        self._cache_key, self._cache_value = key, selection
        return selection


class XdsWrrLocalityFactory(PolicyFactory):
    name = NAME

    def parse_config(self, json_config: Any) -> XdsWrrLocalityConfig:
        obj = expect_object(json_config, "")
        if "childPolicy" not in obj:
            raise LBConfigError("childPolicy", "required field missing")
        selection = registry.select_policy(obj["childPolicy"], "childPolicy")
        canonical = json.dumps(obj["childPolicy"], sort_keys=True, separators=(",", ":"))
        return XdsWrrLocalityConfig(canonical, selection)

    def build(self, helper: Helper) -> XdsWrrLocalityPolicy:
        return XdsWrrLocalityPolicy(helper)


registry.register(XdsWrrLocalityFactory())
