"""The channel's own service config (``service_config=`` /
``grpc.service_config``): gRPC's service config JSON (doc/service_config.md,
gRFC A6 for ``retryPolicy`` and ``retryThrottling``).

:func:`parse_service_config` validates the whole document up front and
raises ``ValueError`` naming the JSON path of the first problem, so a bad
config fails at channel creation, never later on the RPC path.

Used fields:

* ``loadBalancingConfig`` / ``loadBalancingPolicy``: the LB policy (read by
  the static/DNS resolvers through the ``grpc.service_config`` option).
* ``methodConfig[]``: ``name`` ({service, method} entries), ``timeout``,
  ``waitForReady``, ``retryPolicy``, ``maxRequestMessageBytes``,
  ``maxResponseMessageBytes``.  An RPC takes the entry naming its exact
  service and method, else the one naming its service (no method), else
  the default (empty service) - gRPC's precedence.
* ``retryThrottling``: ``maxTokens``, ``tokenRatio`` (A6 token bucket).
* ``healthCheckConfig.serviceName``: client-side health checking (gRFC
  A17), applied by the channel (:mod:`pyxds.channel.health_check`: the
  petiole policies' pick_first children, unless ``grpc.inhibit_health_checking``).

A ``grpc.service_config`` channel option
that fails validation makes the channel fail every RPC with
INVALID_ARGUMENT, wait_for_ready or not, for every target (xds: too), as
C-core's lame channel does.

:class:`MethodConfigSelector` is the ConfigSelector of a non-xDS channel
with such a config: per RPC, one dict lookup for a precomputed CallConfig.
For ``xds:`` targets the xDS config wins (the xds resolver's selector is
used as is), as in gRPC.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Literal, Union

import grpc

from pyxds import _json
from pyxds._duration import DurationError, parse_duration
from pyxds._values import dataclass
from pyxds.resolver.api import CallConfig, ConfigSelector
from pyxds.resolver.retry_policy import MAX_ATTEMPTS_CAP, RetryPolicy, RetryThrottle

__all__ = ["MethodConfig", "MethodConfigSelector", "ServiceConfig", "parse_service_config"]

#: a JSON number, also accepted as a string (proto3 JSON mapping, as C-core)
_NUMBER = re.compile(r"^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$", re.ASCII)
_CODES_BY_NAME = {code.name: code for code in grpc.StatusCode}
_CODES_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}
#: C-core's bound on ``maxRequestMessageBytes`` / ``maxResponseMessageBytes``
#: (a uint32: grpcio 1.85 rejects 4294967296 "failed to parse non-negative number")
_MAX_MESSAGE_BYTES = 2**32 - 1
#: C-core keeps durations in whole milliseconds: a methodConfig ``timeout``
#: under 1 ms is 0, no timeout (grpcio 1.85: "0.0005s" never ends an RPC)
_MIN_TIMEOUT = 0.001


@dataclass(frozen=True, slots=True)
class MethodConfig:
    """One ``methodConfig`` entry as applied to an RPC."""

    timeout: float | None = None
    wait_for_ready: bool | None = None
    retry_policy: RetryPolicy | None = None
    max_request_bytes: int | None = None
    max_response_bytes: int | None = None


@dataclass(frozen=True)
class ServiceConfig:
    """A validated service config (module docstring)."""

    raw: Mapping[str, Any]
    #: (service, method) -> MethodConfig; ("", "") the default, (s, "") a service
    methods: Mapping[tuple[str, str], MethodConfig] = field(default_factory=dict)
    retry_throttle: RetryThrottle | None = None

    @property
    def json(self) -> str:
        return json.dumps(self.raw)

    def subchannel_config(self) -> str | None:
        """The methodConfig message-size limits alone, as the JSON service
        config of the subchannels' grpcio channels (C-core enforces them
        there with its own words); None when there are none."""
        entries = []
        for entry in self.raw.get("methodConfig", ()):
            sizes = {
                k: entry[k]
                for k in ("maxRequestMessageBytes", "maxResponseMessageBytes")
                if k in entry
            }
            if sizes:
                entries.append({"name": entry.get("name", [{}]), **sizes})
        return json.dumps({"methodConfig": entries}) if entries else None


def _fail(path: str, message: str) -> ValueError:
    return ValueError(f"invalid service config: {path}: {message}")


def _duration(value: Any, path: str) -> float:
    """A JSON duration as grpcio 1.85 reads one (:mod:`pyxds._duration`)."""
    try:
        return parse_duration(value)
    except DurationError as err:
        raise _fail(path, str(err)) from None


def _int(value: Any, path: str) -> int:
    if isinstance(value, bool):
        raise _fail(path, "must be an integer")
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int):
        return value
    # a JSON number with a fraction or exponent (2.0, 1e3) is not an integer:
    # C-core rejects it too
    raise _fail(path, "must be an integer")


def _number(value: Any, path: str, problem: str) -> float:
    """A JSON number, or a string holding one (C-core accepts both, as the
    proto3 JSON mapping does), greater than 0; ValueError saying ``problem``
    otherwise."""
    if isinstance(value, str) and _NUMBER.match(value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _fail(path, problem)
    return float(value)


def _code(value: Any, path: str) -> grpc.StatusCode:
    if isinstance(value, str) and value.upper() in _CODES_BY_NAME:
        return _CODES_BY_NAME[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool) and value in _CODES_BY_VALUE:
        return _CODES_BY_VALUE[value]
    raise _fail(path, f"unknown status code {value!r}")


def _retry_policy(rp: Any, path: str) -> RetryPolicy:
    """A6 "Validation of retryPolicy"."""
    if not isinstance(rp, dict):
        raise _fail(path, "must be an object")
    for key in ("maxAttempts", "initialBackoff", "maxBackoff", "backoffMultiplier"):
        if key not in rp:
            raise _fail(f"{path}.{key}", "field not present")
    attempts = _int(rp["maxAttempts"], f"{path}.maxAttempts")
    if attempts < 2:
        raise _fail(f"{path}.maxAttempts", "must be greater than 1")
    initial = _duration(rp["initialBackoff"], f"{path}.initialBackoff")
    if initial <= 0:
        raise _fail(f"{path}.initialBackoff", "must be greater than 0")
    maximum = _duration(rp["maxBackoff"], f"{path}.maxBackoff")
    if maximum <= 0:
        raise _fail(f"{path}.maxBackoff", "must be greater than 0")
    multiplier = _number(
        rp["backoffMultiplier"], f"{path}.backoffMultiplier", "must be a number greater than 0"
    )
    codes = rp.get("retryableStatusCodes")
    if not isinstance(codes, list) or not codes:
        raise _fail(f"{path}.retryableStatusCodes", "must be a non-empty list")
    parsed = frozenset(_code(c, f"{path}.retryableStatusCodes[{i}]") for i, c in enumerate(codes))
    return RetryPolicy(
        max_attempts=min(attempts, MAX_ATTEMPTS_CAP),
        initial_backoff=initial,
        max_backoff=maximum,
        backoff_multiplier=multiplier,
        retryable_codes=parsed,
    )


def _method_config(entry: Any, path: str) -> tuple[list[tuple[str, str]], MethodConfig]:
    if not isinstance(entry, dict):
        raise _fail(path, "must be an object")
    # C-core takes a JSON null as an absent field here (name, service,
    # method, timeout, waitForReady), unlike a null methodConfig
    names = entry.get("name")
    if names is None:
        names = []
    if not isinstance(names, list):
        raise _fail(f"{path}.name", "must be a list")
    keys = []
    for i, name in enumerate(names):
        if not isinstance(name, dict):
            raise _fail(f"{path}.name[{i}]", "must be an object")
        service = name.get("service") or ""
        method = name.get("method") or ""
        if not isinstance(service, str) or not isinstance(method, str):
            raise _fail(f"{path}.name[{i}]", "service and method must be strings")
        if method and not service:
            raise _fail(f"{path}.name[{i}]", "method name given without a service")
        keys.append((service, method))
    kwargs: dict[str, Any] = {}
    if entry.get("timeout") is not None:
        timeout = _duration(entry["timeout"], f"{path}.timeout")
        if timeout >= _MIN_TIMEOUT:
            kwargs["timeout"] = timeout
    if entry.get("waitForReady") is not None:
        if not isinstance(entry["waitForReady"], bool):
            raise _fail(f"{path}.waitForReady", "must be a boolean")
        kwargs["wait_for_ready"] = entry["waitForReady"]
    if "retryPolicy" in entry:
        kwargs["retry_policy"] = _retry_policy(entry["retryPolicy"], f"{path}.retryPolicy")
    for key, arg in (
        ("maxRequestMessageBytes", "max_request_bytes"),
        ("maxResponseMessageBytes", "max_response_bytes"),
    ):
        if key in entry:
            value = _int(entry[key], f"{path}.{key}")
            if value < 0:
                raise _fail(f"{path}.{key}", "must not be negative")
            if value > _MAX_MESSAGE_BYTES:
                raise _fail(f"{path}.{key}", f"must be at most {_MAX_MESSAGE_BYTES}")
            kwargs[arg] = value
    if "retryPolicy" in entry and "hedgingPolicy" in entry:
        raise _fail(path, "retryPolicy and hedgingPolicy are mutually exclusive")
    return keys, MethodConfig(**kwargs)


#: A ``service_config`` argument: JSON text (str or bytes), a dict, or None.
ServiceConfigSource = Union[str, bytes, dict[str, Any], None]


def parse_service_config(raw: ServiceConfigSource) -> ServiceConfig:
    """Validate a service config (a dict, or JSON text); ValueError naming
    the JSON path of the first problem."""
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode()
    if isinstance(raw, str):
        try:
            raw = _json.loads(raw)
        except ValueError as err:
            raise ValueError(f"invalid service config: not JSON: {err}") from None
    if not isinstance(raw, dict):
        raise _fail("$", "must be a JSON object")
    from pyxds.lb.errors import LBConfigError
    from pyxds.lb.registry import select_policy

    # C-core validates both LB fields whenever present: an empty or null
    # loadBalancingConfig names no known policy, and loadBalancingPolicy must
    # name a registered policy that needs no config, even when
    # loadBalancingConfig is there too and wins
    if "loadBalancingConfig" in raw:
        # the registry refuses a null config up to the chosen entry, known
        # policy or not, as grpcio 1.85 does ("child entry should be of type
        # object"), and names the field from the top
        try:
            select_policy(raw["loadBalancingConfig"], "loadBalancingConfig")
        except LBConfigError as err:
            raise _fail(err.path or "loadBalancingConfig", err.problem) from None
        except (ValueError, AttributeError, TypeError) as err:
            raise _fail("loadBalancingConfig", str(err)) from None
    policy = raw.get("loadBalancingPolicy")
    if policy is not None and not isinstance(policy, str):
        raise _fail("loadBalancingPolicy", "must be a string")
    if policy:
        try:
            select_policy([{policy.lower(): {}}])
        except (LBConfigError, ValueError, AttributeError, TypeError) as err:
            raise _fail("loadBalancingPolicy", f"{policy!r}: {err}") from None
    health = raw.get("healthCheckConfig")
    if health is not None:
        if not isinstance(health, dict):
            raise _fail("healthCheckConfig", "must be an object")
        name = health.get("serviceName")
        if name is not None and not isinstance(name, str):
            raise _fail("healthCheckConfig.serviceName", "must be a string")
    methods: dict[tuple[str, str], MethodConfig] = {}
    entries = raw.get("methodConfig", [])  # null: not a list, as in C-core
    if not isinstance(entries, list):
        raise _fail("methodConfig", "must be a list")
    for i, entry in enumerate(entries):
        keys, config = _method_config(entry, f"methodConfig[{i}]")
        for j, key in enumerate(keys):
            if key in methods:
                raise _fail(f"methodConfig[{i}].name[{j}]", "duplicate method config name")
            methods[key] = config
    throttle = None
    if "retryThrottling" in raw:
        rt = raw["retryThrottling"]
        path = "retryThrottling"
        if not isinstance(rt, dict):
            raise _fail(path, "must be an object")
        if "maxTokens" not in rt:
            raise _fail(f"{path}.maxTokens", "field not present")
        tokens = _int(rt["maxTokens"], f"{path}.maxTokens")
        if not 0 < tokens <= 1000:
            raise _fail(f"{path}.maxTokens", "must be in (0, 1000]")
        problem = "must be a number greater than 0"
        ratio = _number(rt.get("tokenRatio"), f"{path}.tokenRatio", problem)
        if int(ratio * 1000) == 0:
            # A6: "Decimal places beyond 3 are ignored": 0.0004 is 0 (C-core
            # rejects it the same way)
            raise _fail(f"{path}.tokenRatio", problem + " (decimals beyond 3 ignored)")
        throttle = RetryThrottle(tokens, ratio)
    return ServiceConfig(raw, methods, throttle)


class MethodConfigSelector(ConfigSelector):
    """Per-RPC methodConfig lookup for a non-xDS channel (module docstring).
    ``base``'s CallConfig (the resolver's selector) supplies the rest."""

    def __init__(self, config: ServiceConfig, base: ConfigSelector) -> None:
        self.config = config
        self.base = base
        self._cache: dict[str, CallConfig | None] = {}
        self._methods = config.methods

    def _lookup(self, path: str) -> MethodConfig | None:
        service, _, method = path.lstrip("/").partition("/")
        methods = self._methods
        return methods.get((service, method)) or methods.get((service, "")) or methods.get(("", ""))

    def select(self, path: str, metadata: Sequence[tuple[str, str | bytes]]) -> CallConfig:
        base = self.base.select(path, metadata)
        cached: CallConfig | Literal[False] | None = self._cache.get(path, False)
        if cached is False:
            mc = self._lookup(path)
            cached = None
            if mc is not None:
                cached = CallConfig(
                    call_attributes=base.call_attributes,
                    timeout=mc.timeout,
                    on_committed=base.on_committed,
                    status=base.status,
                    no_config=base.no_config,
                    retry_policy=mc.retry_policy,
                    filters=base.filters,
                    wait_for_ready=mc.wait_for_ready,
                )
            if len(self._cache) < 4096:
                self._cache[path] = cached
        if cached is None or base.status is not None or base.on_committed is not None:
            if cached is None:
                return base
            # a resolver selector with per-RPC state: merge without caching
            return CallConfig(
                call_attributes=base.call_attributes,
                timeout=cached.timeout,
                on_committed=base.on_committed,
                status=base.status,
                no_config=base.no_config,
                retry_policy=cached.retry_policy,
                filters=base.filters,
                wait_for_ready=cached.wait_for_ready,
            )
        return cached


def from_channel_args(
    options: Sequence[tuple[str, Any]] | None, service_config: ServiceConfigSource = None
) -> tuple[tuple[tuple[str, Any], ...], ServiceConfig | None, tuple[tuple[str, Any], ...]]:
    """A channel's (options, service config, extra subchannel options).

    ``service_config`` (dict or JSON text) is validated (ValueError naming
    the JSON path) and replaces a ``grpc.service_config`` option; without
    it that option is used when valid (an invalid one makes the channel
    fail every RPC: ``ChannelCore.lame_status``).  The extra subchannel
    options carry the methodConfig message-size limits to the subchannels' grpcio
    channels."""
    opts = tuple(options or ())
    parsed: ServiceConfig | None = None
    if service_config is not None:
        parsed = parse_service_config(service_config)
        opts = (
            *((k, v) for k, v in opts if k != "grpc.service_config"),
            ("grpc.service_config", parsed.json),
        )
    else:
        raw = dict(opts).get("grpc.service_config")
        if raw is not None:
            try:
                parsed = parse_service_config(raw)
            except ValueError:
                parsed = None
    extra: tuple[tuple[str, Any], ...] = ()
    if parsed is not None:
        sizes = parsed.subchannel_config()
        if sizes is not None:
            extra = (("grpc.service_config", sizes),)
    return opts, parsed, extra
