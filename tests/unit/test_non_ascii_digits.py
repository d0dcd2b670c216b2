"""Bad input: strings such as "¹" or "²³" pass ``str.isdigit()`` but not
``int()``.  Every place that reads a number from text (LB config JSON, a
service config, a server's pushback trailer, fault headers, targets) treats
them as malformed, with its own error, never a ValueError from ``int()``."""

from __future__ import annotations

import pytest

from pyxds.channel.retry import pushback_of
from pyxds.lb.errors import LBConfigError
from pyxds.lb.registry import select
from pyxds.resolver.fault_filter import _uint
from pyxds.resolver.service_config import parse_service_config
from pyxds.resolver.static_resolver import parse_static_addresses, split_host_port

SUPERSCRIPT = "\u00b9"  # isdigit() is True, int() raises


def test_pushback_of_a_non_ascii_digit_stops_retries_like_any_malformed_value():
    stop = pushback_of([("grpc-retry-pushback-ms", "x")])
    assert pushback_of([("grpc-retry-pushback-ms", SUPERSCRIPT)]) == stop
    assert pushback_of([("grpc-retry-pushback-ms", "-" + SUPERSCRIPT)]) == stop
    assert pushback_of([("grpc-retry-pushback-ms", "250")]) == 0.25


def test_fault_header_with_a_non_ascii_digit_is_not_a_number():
    assert _uint(SUPERSCRIPT) is None
    assert _uint(" 12 ") == 12


def test_ring_hash_min_ring_size_non_ascii_digit_is_an_lb_config_error():
    with pytest.raises(LBConfigError, match="minRingSize"):
        select([{"ring_hash_experimental": {"minRingSize": SUPERSCRIPT}}])


def test_service_config_integer_field_non_ascii_digit_names_the_path():
    raw = {
        "methodConfig": [
            {
                "name": [{"service": "s"}],
                "maxRequestMessageBytes": SUPERSCRIPT,
            }
        ]
    }
    with pytest.raises(ValueError, match=r"methodConfig\[0\]\.maxRequestMessageBytes"):
        parse_service_config(raw)


def test_static_target_with_a_non_ascii_digit_port_is_not_host_port():
    with pytest.raises(ValueError, match="is not host:port"):
        parse_static_addresses(f"static:///127.0.0.1:{SUPERSCRIPT}")
    with pytest.raises(ValueError, match="the target uri is not valid"):
        parse_static_addresses(f"ipv4:127.0.0.1:{SUPERSCRIPT}")


def test_dns_target_with_a_non_ascii_digit_port_fails_to_parse_in_c_cores_words():
    with pytest.raises(ValueError, match="Failed to parse port in name: localhost:"):
        split_host_port(f"localhost:{SUPERSCRIPT}")


FULLWIDTH_ONE = "\uff11"  # int() reads it as 1; C-core's Duration reader does not


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"outlier_detection_experimental": {"interval": FULLWIDTH_ONE + "s"}}, "interval"),
        (
            {"weighted_round_robin": {"blackoutPeriod": FULLWIDTH_ONE + "s"}},
            "blackoutPeriod",
        ),
    ],
)
def test_lb_config_duration_with_a_non_ascii_digit_is_an_lb_config_error(config, field):
    """grpcio 1.85 refuses "\uff11s" (a fullwidth 1) as a Duration; int() would
    have read it as 1 s."""
    if "outlier_detection_experimental" in config:
        config["outlier_detection_experimental"]["childPolicy"] = [{"round_robin": {}}]
    with pytest.raises(LBConfigError, match=field):
        select([config])


def test_service_config_duration_and_number_with_a_non_ascii_digit_are_refused():
    """grpcio 1.85 refuses a methodConfig timeout of "\uff11s"; a fullwidth
    backoffMultiplier string is no number either."""
    with pytest.raises(ValueError, match=r"methodConfig\[0\]\.timeout"):
        parse_service_config({"methodConfig": [{"name": [{}], "timeout": FULLWIDTH_ONE + "s"}]})
    retry = {
        "maxAttempts": 2,
        "initialBackoff": "1s",
        "maxBackoff": "1s",
        "backoffMultiplier": FULLWIDTH_ONE,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    with pytest.raises(ValueError, match="backoffMultiplier"):
        parse_service_config({"methodConfig": [{"name": [{}], "retryPolicy": retry}]})
