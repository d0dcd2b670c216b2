"""Resolvers for non-xDS targets, so a pyxds channel also works without a
control plane (gRPC's naming doc, doc/naming.md):

* ``static:///host:port,host:port`` and ``ipv4:host:port,...`` /
  ``ipv6:[addr]:port,...``: a fixed address list;
* ``unix:path``, ``unix:///absolute/path`` and ``unix-abstract:name``: one
  Unix domain socket, given to the subchannel's grpcio channel as the
  target itself (so its ``:authority`` and errors are grpcio's own for it);
* ``dns:///host:port`` or a bare ``host:port``:
  :class:`pyxds.resolver.dns_target.DnsTargetResolver` (lookups off the
  serializer, rate-limited re-resolution, optional periodic refresh).

The LB policy is ``pick_first`` unless the channel option
``grpc.lb_policy_name`` (or a ``grpc.service_config`` JSON with
``loadBalancingConfig``) names another registered policy.
"""

from __future__ import annotations

from typing import Any

import grpc

from pyxds import _json
from pyxds._uri import unquote, urlsplit
from pyxds.lb.api import Endpoint
from pyxds.lb.errors import LBConfigError
from pyxds.lb.registry import PolicySelection, select_policy
from pyxds.resolver.api import DefaultConfigSelector, Resolver, ResolverArgs, ResolverResult
from pyxds.status import Status


def parse_addresses(text: str) -> list[str]:
    """``"a:1,[::1]:2"`` -> ``["a:1", "[::1]:2"]`` (empty items dropped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def scheme_of(target: str) -> str:
    """The URI scheme of a target ("" when it has none)."""
    head, sep, _ = target.partition(":")
    if not sep or not head or not head.replace("+", "").replace("-", "").isalnum():
        return ""
    return head.lower()


def parse_static_addresses(target: str) -> list[str]:
    """``static:///a:1,b:2``, ``ipv4:a:1,b:2`` or ``ipv6:[::1]:1`` -> addresses;
    ValueError naming the target when it names none or an item is not host:port."""
    scheme = scheme_of(target)
    rest = target[len(scheme) + 1 :]
    if rest.startswith("//"):
        rest = urlsplit(target).path.lstrip("/")
    addresses = parse_addresses(unquote(rest))
    literal = scheme in ("ipv4", "ipv6")
    if not addresses:
        if literal:  # C-core's words for an ipv4:/ipv6: target listing nothing
            raise ValueError("empty address list")
        raise ValueError(f"target {target!r} names no addresses")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()):
            if literal:
                raise TargetUriError(target)
            raise ValueError(f"target {target!r}: {address!r} is not host:port")
        if literal and not _is_ip_literal(scheme, host, port):
            raise TargetUriError(target)
    return addresses


class TargetUriError(ValueError):
    """An ``ipv4:``/``ipv6:`` target whose addresses are not IP literals
    with a port: C-core refuses the target itself (its channel fails every
    RPC with UNKNOWN and these words)."""

    def __init__(self, target: str) -> None:
        super().__init__(
            f"Failed to create channel to '{target}':the target uri is not valid: {target}"
        )


def _is_ip_literal(scheme: str, host: str, port: str) -> bool:
    """C-core's ipv4/ipv6 resolvers: an IPv4 literal, or a bracketed IPv6
    literal (with an optional %zone), and a port of at most 65535.  ``ipaddress``
    loads here: only ipv4:/ipv6: targets need it (issue 18, start-up)."""
    import ipaddress

    if int(port) > 65535:
        return False
    try:
        if scheme == "ipv4":
            ipaddress.IPv4Address(host)
        else:
            if not (host.startswith("[") and host.endswith("]")):
                return False
            ipaddress.IPv6Address(host[1:-1].partition("%")[0])
    except ValueError:
        return False
    return True


def lb_selection_from_options(options: Any) -> PolicySelection | Status:
    """The channel's LB policy from ``grpc.service_config`` / ``grpc.lb_policy_name``."""
    opts = dict(options or {})
    try:
        raw = opts.get("grpc.service_config")
        if raw:
            config = _json.loads(raw) if isinstance(raw, str | bytes) else raw
            lb_list = config.get("loadBalancingConfig")
            if lb_list:
                return select_policy(lb_list, "loadBalancingConfig")
            name = config.get("loadBalancingPolicy")
            if name:
                return select_policy([{str(name).lower(): {}}], "loadBalancingPolicy")
        name = opts.get("grpc.lb_policy_name")
    except (LBConfigError, ValueError, AttributeError) as err:
        return Status(grpc.StatusCode.UNAVAILABLE, f"invalid service config: {err}")
    if name:
        try:
            return select_policy([{name: {}}])
        except (LBConfigError, ValueError, AttributeError, TypeError):
            # C-core (grpcio 1.85): a grpc.lb_policy_name naming no registered
            # policy (the name as given: "ROUND_ROBIN" is none) or one that
            # needs a config is replaced by pick_first, the channel works
            pass
    return select_policy([{"pick_first": {}}])


#: the Unix domain socket schemes (gRPC's naming doc), as grpcio takes them
UNIX_SCHEMES = ("unix", "unix-abstract")


def unix_address(target: str) -> list[str]:
    """The one address of a ``unix:`` / ``unix-abstract:`` target: the target
    itself, which the subchannel's grpcio channel resolves as C-core does;
    none when it names no socket."""
    scheme = scheme_of(target)
    path = target[len(scheme) + 1 :]
    if path.startswith("//"):
        path = urlsplit(target).path
    return [target] if path else []


class StaticResolver(Resolver):
    """A fixed address list, delivered once (and again on re-resolution)."""

    def __init__(
        self,
        args: ResolverArgs,
        addresses: list[str] | None = None,
        target_error: Status | None = None,
    ) -> None:
        """``addresses`` None: the ones ``args.target`` names (a target that
        names none, or not as host:port, fails the channel with the reason);
        ``target_error``: the target is unusable, for that reason."""
        self._args = args
        self._target_error: Status | None = target_error
        if addresses is None:
            try:
                addresses = parse_static_addresses(args.target)
            except TargetUriError as err:
                self._target_error = Status(grpc.StatusCode.UNKNOWN, str(err))
                addresses = []
            except ValueError as err:
                self._target_error = Status(grpc.StatusCode.UNAVAILABLE, str(err))
                addresses = []
        self._addresses = addresses
        self._shutdown = False

    def _result(self) -> ResolverResult:
        if self._target_error is not None:
            error = self._target_error
            return ResolverResult(endpoints=error, service_config_error=error)
        selection = lb_selection_from_options(self._args.options)
        if isinstance(selection, Status):
            return ResolverResult(endpoints=selection, service_config_error=selection)
        if not self._addresses:
            return ResolverResult(
                endpoints=Status(grpc.StatusCode.UNAVAILABLE, "no addresses in target"),
                lb_policy=selection,
            )
        return ResolverResult(
            endpoints=[Endpoint((a,)) for a in self._addresses],
            lb_policy=selection,
            config_selector=DefaultConfigSelector(),
        )

    def start(self) -> None:
        self._deliver()

    def _deliver(self) -> None:
        result = self._result()
        self._args.serializer.run(lambda: None if self._shutdown else self._args.on_result(result))

    def request_reresolution(self) -> None:
        pass  # nothing new to learn

    def shutdown(self) -> None:
        self._shutdown = True

    def config_dump(self) -> dict[str, Any]:
        return {"resolver": "static", "addresses": list(self._addresses)}


def split_host_port(text: str, default_port: int = 443) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a bare host (``default_port``);
    ValueError in C-core's words when the port is not a number."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, None
    if port is None:
        return host, default_port
    if not (port.isascii() and port.isdigit()):  # a port over 65535: C-core takes it too
        raise ValueError(f"Failed to parse port in name: {text}")
    return host, int(port)


def build_builtin(scheme: str, target: str, args: ResolverArgs) -> Resolver | None:
    """A resolver for the non-xDS schemes, or None for an unknown scheme."""
    if scheme == "static":
        return StaticResolver(args, parse_addresses(urlsplit(target).path.lstrip("/")))
    if scheme in ("ipv4", "ipv6"):
        return StaticResolver(args)  # validated as C-core does (IP literals, ports)
    if scheme in UNIX_SCHEMES:
        addresses = unix_address(target)
        if not addresses:  # C-core's words for a unix: target naming no socket
            return StaticResolver(
                args, [], Status(grpc.StatusCode.UNAVAILABLE, "empty address list")
            )
        return StaticResolver(args, addresses)
    if scheme == "dns":
        from pyxds.resolver.dns_target import DnsTargetResolver

        host, port = split_host_port(urlsplit(target).path.lstrip("/"))
        return DnsTargetResolver(args, host, port)
    return None
