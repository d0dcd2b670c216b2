"""Differential: ``disabled`` HTTP filters and overrides of another filter's
type on xDS-enabled servers (A36, A39, A41), pyxds's servers against
grpcio 1.85's ``grpc.server(xds=True)`` on the same Listener.

A39 names neither ``HttpFilter.disabled`` nor ``FilterConfig.disabled``;
C-core 1.85 honours both on servers as on clients (Envoy's meaning), which
for RBAC decides whether an RPC is authorized at all: an RBAC filter
disabled in the listener authorizes nothing unless a route override turns
it on; a disabled ``FilterConfig`` as the most specific override turns it
off.  Every case here denies everything when RBAC applies, so OK means the
filter did not run.  The cases alternate OK / PERMISSION_DENIED so that each
new Listener is seen to take effect.  The client side is
``tests/e2e/test_differential_http_filters.py``.
"""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2
from test_xds_server_differential import outcome, pair, publish_both  # noqa: F401 (fixture)
from xds_server_fixtures import ECHO, listener_name, wait_until

from pyxds.server import builders as b
from pyxds.server import inbound as ib

DENY_ALL = {
    "all": ib.rbac_policy(permissions=[ib.any_rule()], principals=[ib.any_rule(principal=True)])
}
DENY = ib.rbac_per_route("DENY", DENY_ALL)
OTHER = b.fault_config(abort_grpc_status=14)  # another filter's type


def wrapped(disabled: bool, config):
    fc = route_components_pb2.FilterConfig(disabled=disabled)
    fc.config.Pack(config)
    return fc


#: (case, RBAC filter disabled in the listener, route overrides, virtual
#: host overrides, C-core 1.85's outcome), alternating
CASES = [
    ("listener filter disabled", True, {}, {}, "OK"),
    ("enabled by a route override", True, {"rbac": DENY}, {}, "PERMISSION_DENIED"),
    ("route FilterConfig disabled", False, {"rbac": wrapped(True, DENY)}, {}, "OK"),
    ("enabled by an entry of another type", True, {"rbac": OTHER}, {}, "PERMISSION_DENIED"),
    ("virtual host FilterConfig disabled", False, {}, {"rbac": wrapped(True, DENY)}, "OK"),
    (
        "another type over a disabled virtual host",
        False,
        {"rbac": OTHER},
        {"rbac": wrapped(True, DENY)},
        "PERMISSION_DENIED",
    ),
    ("disabled wrapper of another type", False, {"rbac": wrapped(True, OTHER)}, {}, "OK"),
]


def _listener(address: str, base_disabled: bool, route_over: dict, vh_over: dict):
    r = ib.route(prefix="/")
    for key, msg in route_over.items():
        r.typed_per_filter_config[key].Pack(msg)
    rc = ib.inbound_route_config("inbound", [r])
    for key, msg in vh_over.items():
        rc.virtual_hosts[0].typed_per_filter_config[key].Pack(msg)
    flt = ib.rbac_filter("rbac", "DENY", DENY_ALL)
    flt.disabled = base_disabled
    hcm = ib.inbound_hcm(rc, http_filters=[flt])
    return ib.server_listener(listener_name(address), address, [ib.filter_chain(hcm)])


def test_disabled_rbac_filters_and_overrides_agree_with_c_core(pair, control):  # noqa: F811
    ours, core = pair(with_pki=False)
    for name, base_disabled, route_over, vh_over, want in CASES:

        def make(address, d=base_disabled, r=route_over, v=vh_over):
            return _listener(address, d, r, v)

        publish_both(control, ours, core, make)
        for server in (ours, core):
            got = wait_until(lambda s=server, w=want: outcome(s.address, method=ECHO) == w, 20)
            assert got, (name, server.kind, outcome(server.address, method=ECHO))
