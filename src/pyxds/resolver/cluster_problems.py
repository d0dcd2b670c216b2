"""Why a cluster of an XdsConfig cannot serve RPCs, in one set of words.

A config can be valid (ACKed) and still leave a cluster with nothing to pick
from: every locality without ``load_balancing_weight`` (ignored, gRFC A27
"ClusterLoadAssignment Proto"), every endpoint UNHEALTHY or DRAINING (A27
health status), the EDS resource missing, the CDS resource missing or an
aggregate with no leaf (A74/A75).  The client then fails RPCs to that cluster
UNAVAILABLE, and C-core's text ("no children in weighted_target policy")
names neither the cluster nor the cause (TRAPS.md, "Seen in grpcio 1.85.1's
C-core").

The words here are the ones every layer uses, so a user who reads one finds
the others: the RPC error appends ``cluster NAME: no endpoints: CAUSE`` to
C-core's words (:mod:`pyxds.resolver.dependency_manager`), ``channel.
config_dump()`` lists :func:`cluster_problems` under ``cannot_serve`` (and
``pyxds inspect`` prints them on its state line), and ``pyxds serve``'s lint
(:mod:`pyxds.server.lint`) ends a warning with the same sentence.
"""

from __future__ import annotations

from pyxds.resolver.xds_config import ClusterConfig, EndpointConfig, XdsConfig
from pyxds.status import Status
from pyxds.xds.resources.types import ClusterLoadAssignment


def no_endpoints_words(cluster_name: str, cla: ClusterLoadAssignment) -> str:
    """``cluster NAME: no endpoints: CAUSE`` for a cluster whose EDS data
    leaves no usable endpoint (e.g. "locality without weight ignored")."""
    return f"cluster {cluster_name}: no endpoints: {cla.no_endpoints_reason}"


def cluster_problems(config: XdsConfig) -> list[str]:
    """One line per cluster of ``config`` that cannot serve RPCs, by name.

    A cluster in error (a Status: does not exist, NACKed before any data, an
    aggregate without leaves) says its status; a leaf without endpoint data
    says the resolution note (EDS missing, DNS failed); a leaf whose data has
    no usable endpoint says why (:func:`no_endpoints_words`).  Connection
    failures are not config problems and are not listed (the subchannels
    show them).
    """
    out = []
    for name in sorted(config.clusters):
        value = config.clusters[name]
        if isinstance(value, Status):
            out.append(f"cluster {name}: {value.details}")
            continue
        if not isinstance(value, ClusterConfig) or not isinstance(value.children, EndpointConfig):
            continue  # an aggregate with leaves: the leaves are listed themselves
        endpoints = value.children
        if endpoints.endpoints is None:
            note = endpoints.resolution_note or "no endpoint data"
            note = note.replace(f" (cluster {name}: no endpoints)", "")
            out.append(f"cluster {name}: no endpoints: {note}")
        elif endpoints.endpoints.endpoint_count == 0:
            out.append(no_endpoints_words(name, endpoints.endpoints))
    return out
