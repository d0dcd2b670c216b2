"""Rendering of ``pyxds inspect``'s model as a rich tree (one screen per dump)."""

from __future__ import annotations

from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.tree import Tree

from pyxds.cli.inspect_model import build

_STATUS_STYLE = {"ACKED": "green", "NACKED": "red", "DOES_NOT_EXIST": "red", "REQUESTED": "yellow"}
_UNBOUNDED = 1 << 20  # columns: wider than any line inspect prints
_STATE_STYLE = {"READY": "green", "TRANSIENT_FAILURE": "red", "CONNECTING": "yellow"}


def _status(node: dict[str, Any]) -> str:
    status = node.get("status", "")
    style = _STATUS_STYLE.get(status, "white")
    version = f" v{escape(node['version'])}" if node.get("version") else ""
    return f"[{style}]{escape(status)}{version}[/]"


def _cluster(tree: Tree, cluster: dict[str, Any]) -> None:
    head = f"[bold]Cluster[/] {escape(cluster['name'])} {_status(cluster)}"
    if "type" in cluster:
        head += f"  type {cluster['type']}, lb {escape(cluster['lb_policy'])}"
    branch = tree.add(head)
    if cluster.get("cannot_serve"):
        branch.add(f"[red]cannot serve: {escape(cluster['cannot_serve'])}[/]")
    if cluster.get("nack"):
        branch.add(f"[red]NACK: {escape(cluster['nack'])}[/]")
    for child in cluster.get("children", []):
        branch.add(f"child cluster {escape(child)}")
    if "eds" in cluster:
        branch.add(f"EDS {escape(cluster['eds']['name'])} {_status(cluster['eds'])}")
    for drop in cluster.get("drops", []):
        branch.add(f"drops category {escape(drop)}")
    for priority in cluster.get("priorities", []):
        p = branch.add(f"priority {priority['priority']}")
        for locality in priority["localities"]:
            weight = locality["weight"]
            name = escape(locality["locality"])
            if locality.get("ignored"):
                loc = p.add(f"[yellow]locality {name} IGNORED: {escape(locality['ignored'])}[/]")
            else:
                loc = p.add(f"locality {name} (weight {weight})")
            for endpoint in locality["endpoints"]:
                state = endpoint["state"]
                extra = f" weight {endpoint['weight']}" if endpoint.get("weight") else ""
                wrr = endpoint.get("wrr")
                if wrr is not None:
                    if wrr.get("no_weight"):
                        extra += f"  [yellow]wrr: no weight ({escape(wrr['no_weight'])})[/]"
                    else:
                        extra += f"  wrr weight {wrr.get('weight', 0):g} ({escape(wrr['source'])})"
                text = f"{escape(endpoint['address'])}  health {endpoint['health']}{extra}"
                if "why" in endpoint and state == "not used":
                    loc.add(f"[dim]{text}  not used: {escape(endpoint['why'])}[/]")
                elif "why" in endpoint:
                    style = _STATE_STYLE.get(state, "white")
                    loc.add(f"{text}  [{style}]{state}[/]  [dim]{escape(endpoint['why'])}[/]")
                else:
                    loc.add(f"{text}  [{_STATE_STYLE.get(state, 'white')}]{state}[/]")


def tree_of(model: dict[str, Any]) -> Tree:
    state = model.get("state") or ""
    status = "" if model.get("status") in (None, "OK") else str(model["status"])
    # The state line names what fails and why (the channel's status often
    # names neither: "TRANSIENT_FAILURE from XdsClusterManagerLb").
    why = [p for p in model.get("cannot_serve") or () if p not in status]
    tree = Tree(
        f"[bold]{escape(str(model.get('target')))}[/] "
        f"[{_STATE_STYLE.get(state, 'white')}]{state}[/]"
        + (f"  {escape(status)}" if status else "")
        + (f"  [red]{escape('; '.join(why))}[/]" if why else "")
    )
    listener = model.get("listener") or {}
    lis = tree.add(f"[bold]Listener[/] {escape(listener.get('name', ''))} {_status(listener)}")
    if listener.get("http_filters"):
        lis.add("filters " + escape(", ".join(listener["http_filters"])))
    rc = model.get("route_config")
    if rc:
        rcb = lis.add(f"[bold]RouteConfiguration[/] {escape(rc['name'])} {_status(rc)}")
        for vhost in rc.get("virtual_hosts", []):
            domains = escape(", ".join(vhost["domains"]))
            vh = rcb.add(f"virtual host {escape(vhost['name'])} [dim]({domains})[/]")
            for route in vhost["routes"]:
                vh.add(f"{escape(route['match'])} -> {escape(route['action'])}")
    for cluster in model.get("clusters", []):
        _cluster(tree, cluster)
    if model.get("nacks"):
        nacks = tree.add("[red bold]NACKs[/]")
        for nack in model["nacks"]:
            nacks.add(f"{nack['type']} {escape(nack['name'])}: {escape(nack['details'])}")
    if model.get("ignored_fields"):
        ignored = tree.add("[yellow]fields gRPC does not read (no effect)[/]")
        for item in model["ignored_fields"]:
            fields = escape(", ".join(item["fields"]))
            ignored.add(f"{item['type']} {escape(item['name'])}: {fields}")
    return tree


def print_whole(tree: Tree, out: TextIO) -> None:
    """Print ``tree`` with every line whole: rich would wrap a line longer than
    the terminal (80 columns off a terminal) mid-message, e.g. a channel status
    ``... TRANSIENT_FAILURE from`` / ``XdsClusterManagerLb``; the console is made
    as wide as the longest line instead (a terminal folds it, a file keeps it)."""
    console = Console(file=out, highlight=False, soft_wrap=False)
    widest = Measurement.get(console, console.options.update(width=_UNBOUNDED), tree).maximum
    console.width = max(console.width, widest)
    console.print(tree)


def render(dump: dict[str, Any], out: TextIO) -> None:
    print_whole(tree_of(build(dump)), out)
