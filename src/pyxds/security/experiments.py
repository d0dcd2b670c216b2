"""The environment switches of xDS security features, read as C-core reads
them (``IsExperimentEnvVarEnabled``): unset means the default; set, the
value is true only if it is one of ``1 t true y yes`` (any case), and false
for ``0 f false n no`` *and for anything else* (an unparsable value turns a
default-on feature off, as C-core).

* ``GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE`` (A87, default off): the
  ``file_watcher`` provider reads ``spiffe_bundle_map_file``.
* ``GRPC_EXPERIMENTAL_XDS_SNI`` (A101, default on in grpcio 1.85): the
  Cluster's ``sni``, ``auto_host_sni`` and ``auto_sni_san_validation`` are
  read (otherwise ignored, as before A101).

Read when used (a bootstrap or Cluster being parsed), not cached.
"""

from __future__ import annotations

import os

SPIFFE_ENV = "GRPC_EXPERIMENTAL_XDS_MTLS_SPIFFE"
SNI_ENV = "GRPC_EXPERIMENTAL_XDS_SNI"

_TRUE = frozenset({"1", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "f", "false", "n", "no"})


def env_enabled(name: str, default: bool = False) -> bool:
    """C-core's ``IsExperimentEnvVarEnabled(name, default)``."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.lower() in _TRUE


def spiffe_enabled() -> bool:
    """A87's switch (off unless set true)."""
    return env_enabled(SPIFFE_ENV)


def sni_enabled() -> bool:
    """A101's switch (on unless set to something other than true)."""
    return env_enabled(SNI_ENV, default=True)
