"""``pyxds inspect --server ADDRESS``: the Listener an xDS-enabled server
listening on ADDRESS gets, and what pyxds would do with it (gRFC A36).

Subscribes to the Listener named by the bootstrap's
``server_listener_resource_name_template`` (``%s`` = ADDRESS, e.g.
``0.0.0.0:50051``) and its RDS resources, as :func:`pyxds.xds_server` does,
and prints: the Listener's CSDS status (ACKED, NACKED with the reason,
DOES_NOT_EXIST), its filter chains (match, transport: plaintext, TLS or mTLS
with the provider instances, routes with their actions, HTTP filters with
each RBAC filter's action and policies) and the verdict: served (with which
transport) or not, and why.  ``--json`` prints the model.  Exit 1 with one
line when the control plane cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from pyxds.cli.errors import USAGE, CliError


def _match_text(chain: Any) -> str:
    text = str(chain.match)
    return "any connection" if text == "{}" else text


def _transport(tls: Any) -> str:
    if tls is None:
        return "plaintext"
    mode = "mTLS (client certificate required)" if tls.require_client_certificate else "TLS"
    ca = f", CA {tls.ca.instance_name!r}" if tls.ca is not None else ""
    return f"{mode}: identity {tls.identity.instance_name!r}{ca}"


def _routes(route_config: Any) -> list[dict[str, Any]]:
    from pyxds.status import Status
    from pyxds.xds.resources.types import NonForwardingAction

    if route_config is None or isinstance(route_config, Status):
        return []
    out = []
    for vh in route_config.virtual_hosts:
        routes = []
        for route in vh.routes:
            spec = route.match.path_specifier
            match = (
                f'prefix "{spec.prefix}"'
                if hasattr(spec, "prefix")
                else f'path "{spec.path}"'
                if hasattr(spec, "path")
                else f"regex {spec.regex_str}"
            )
            action = (
                "serve (non_forwarding_action)"
                if isinstance(route.action, NonForwardingAction)
                else "fail UNAVAILABLE (unsupported action)"
            )
            overrides = [name for name, _, _ in route.filter_overrides]
            routes.append({"match": match, "action": action, "overrides": overrides})
        out.append({"name": vh.name, "domains": list(vh.domains), "routes": routes})
    return out


def _chain(chain: Any, config: Any) -> dict[str, Any]:
    hcm = chain.hcm
    router = config.router_for(chain) if config is not None else None
    rc = router.route_config if router is not None else hcm.route_config
    filters = []
    for flt in hcm.http_filters:
        item: dict[str, Any] = {"name": flt.name, "type": flt.type_url.rsplit(".", 1)[-1]}
        if flt.rbac is not None:
            item["action"] = flt.rbac.action or "none (no rules)"
            item["policies"] = [p.name for p in flt.rbac.policies]
        filters.append(item)
    from pyxds.status import Status

    return {
        "name": chain.name,
        "match": _match_text(chain),
        "transport": _transport(chain.tls),
        "routes": hcm.route_config_name or "(inline)",
        "route_status": rc.details if isinstance(rc, Status) else "ok",
        "virtual_hosts": _routes(rc),
        "http_filters": filters,
    }


def build(entry: dict[str, Any] | None, outcome: Any, address: str, name: str) -> dict[str, Any]:
    """The model: CSDS entry of the Listener and the watch's outcome."""
    from pyxds.cli.inspect_model import rejected
    from pyxds.serving.listener_watch import ServingConfig

    model: dict[str, Any] = {
        "address": address,
        "listener": name,
        "status": (entry or {}).get("client_status", "REQUESTED"),
        "version": (entry or {}).get("version_info", ""),
    }
    if entry is not None and rejected(entry):
        model["nack"] = entry["error_state"].get("details", "")
    if isinstance(outcome, ServingConfig):
        listener = outcome.listener
        model["listener_address"] = listener.address
        model["filter_chains"] = [_chain(c, outcome) for c in listener.filter_chains]
        if listener.default_filter_chain is not None:
            model["default_filter_chain"] = _chain(listener.default_filter_chain, outcome)
        security = outcome.security
        if security.refusal is not None:
            model["verdict"] = f"not served: {security.refusal}"
        else:
            model["verdict"] = f"served: {_transport(security.tls)}"
        model["config_errors"] = outcome.config_errors()
    elif outcome is not None:
        model["verdict"] = f"not served: {outcome.details}"
    else:
        model["verdict"] = "not served: waiting for the Listener"
    return model


def render(model: dict[str, Any], out: Any) -> None:
    from rich.markup import escape
    from rich.tree import Tree

    from pyxds.cli.inspect_view import print_whole

    served = model["verdict"].startswith("served")
    tree = Tree(
        f"[bold]xDS server {escape(model['address'])}[/] "
        f"[{'green' if served else 'red'}]{escape(model['verdict'])}[/]"
    )
    style = {"ACKED": "green", "NACKED": "red", "DOES_NOT_EXIST": "red"}.get(
        model["status"], "yellow"
    )
    version = f" v{escape(model['version'])}" if model["version"] else ""
    lis = tree.add(
        f"[bold]Listener[/] {escape(model['listener'])} [{style}]{model['status']}{version}[/]"
    )
    if model.get("nack"):
        lis.add(f"[red]NACK: {escape(model['nack'])}[/]")
    if "listener_address" in model:
        lis.add(f"address {escape(model['listener_address'])}")
    chains = list(model.get("filter_chains", []))
    if "default_filter_chain" in model:
        chains.append({**model["default_filter_chain"], "name": "(default)"})
    for chain in chains:
        head = f"filter chain {escape(chain['name'] or '')} [dim]{escape(chain['match'])}[/]"
        branch = lis.add(head)
        branch.add(f"transport {escape(chain['transport'])}")
        filters = branch.add("http filters")
        for flt in chain["http_filters"]:
            text = f"{escape(flt['name'])} ({escape(flt['type'])})"
            if "action" in flt:
                policies = ", ".join(flt["policies"]) or "no policy"
                text += f" {flt['action']}: {escape(policies)}"
            filters.add(text)
        routes = branch.add(
            f"routes {escape(chain['routes'])}"
            + ("" if chain["route_status"] == "ok" else f" [red]{escape(chain['route_status'])}[/]")
        )
        for vh in chain["virtual_hosts"]:
            v = routes.add(
                f"virtual host {escape(vh['name'])} [dim]({escape(', '.join(vh['domains']))})[/]"
            )
            for route in vh["routes"]:
                extra = (
                    f" [dim]overrides {', '.join(route['overrides'])}[/]"
                    if route["overrides"]
                    else ""
                )
                v.add(f"{escape(route['match'])} -> {escape(route['action'])}{extra}")
    for warning in model.get("config_errors", []):
        tree.add(f"[yellow]{escape(warning)}[/]")
    print_whole(tree, out)


def run(args: argparse.Namespace, source: Any, bootstrap: Any, uri: str) -> int:
    from pyxds.serving.filter_chains import parse_ip
    from pyxds.serving.listener_watch import ListenerWatch, listener_resource_name
    from pyxds.serving.ports import resolve_listening_address
    from pyxds.xds.client import XdsClient

    try:
        ips, port = resolve_listening_address(args.server)
    except ValueError as err:
        raise CliError(f"--server: {err}, e.g. 0.0.0.0:50051", USAGE) from None
    if args.template == "":
        raise CliError(
            "--template '': expected a Listener name template, "
            "e.g. 'grpc/server?xds.resource.listening_address=%s'",
            USAGE,
        )
    template = args.template or getattr(bootstrap, "server_listener_resource_name_template", None)
    if not template:
        raise CliError(
            "the bootstrap has no server_listener_resource_name_template "
            "(an xDS-enabled server needs it to name its Listener); pass --template",
            USAGE,
        )
    address = f"[{ips[0]}]:{port}" if ips[0].version == 6 else f"{ips[0]}:{port}"
    name = listener_resource_name(template, address)
    outcomes: list[Any] = []
    client = XdsClient(bootstrap)
    local = None if ips[0].is_unspecified else parse_ip(str(ips[0]))
    watch = ListenerWatch(client, name, address, local, outcomes.append)
    watch.start()
    try:
        deadline = time.monotonic() + args.timeout
        while True:
            dump = client.dump()
            entry = next(
                (
                    e
                    for e in dump.get("generic_xds_configs", [])
                    if e.get("type_url", "").endswith("Listener") and e.get("name") == name
                ),
                None,
            )
            status = (entry or {}).get("client_status", "REQUESTED")
            outcome = outcomes[-1] if outcomes else None
            if status != "REQUESTED" and (outcome is not None or status == "NACKED"):
                break
            if outcome is not None and "no responses received" in str(
                getattr(outcome, "details", "")
            ):
                raise CliError(
                    f"cannot reach the control plane at {uri}; is it running? "
                    "check server_uri in the bootstrap"
                )
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        model = build(entry, outcomes[-1] if outcomes else None, address, name)
        if args.json:
            print(json.dumps(model, indent=2, default=str))
        else:
            render(model, sys.stdout)
        return 0
    finally:
        watch.stop()
        client.close()
