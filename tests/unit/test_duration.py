"""JSON durations read as grpcio 1.85's C-core reads them (``pyxds._duration``),
and the one error text every config that holds one gives, naming the field.

Each verdict and error text below was seen live on grpcio 1.85 (a
``methodConfig`` ``timeout`` given as ``grpc.service_config``: "errors
validating service config: [field:methodConfig[0].timeout error:...]"); the
verdicts are compared live for an LB policy's duration by
``tests/e2e/test_differential_node_lb_config.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pyxds._duration import MAX_SECONDS, DurationError, parse_duration
from pyxds.lb import LBConfigError, registry
from pyxds.resolver.service_config import parse_service_config
from pyxds.security.providers import FileWatcherProvider, validate_file_watcher_config

#: text -> seconds, as C-core reads them (its reader: json_object_loader.cc)
READ = {
    "1.5s": 1.5,
    "0s": 0.0,
    "-0s": 0.0,
    "1.000000000s": 1.0,
    "1.000000001s": 1.000000001,
    " 1.5s": 1.5,
    "1.5 s": 1.5,
    "\t1\ts": 1.0,
    "+1s": 1.0,
    "-0.5s": 0.5,  # the minus goes with the 0 seconds
    # the fraction is read as an integer too (blanks and a sign taken), and
    # scaled by its length in characters: " 5" is 2 long, so 0.05 s
    "1. 5s": 1.05,
    "1.+5s": 1.05,
    "1.-5s": 0.95,
    "1.-0s": 1.0,
    "0.-5s": -0.05,
    f"{MAX_SECONDS}s": float(MAX_SECONDS),
    f"{MAX_SECONDS}.999999999s": MAX_SECONDS + 0.999999999,
}

#: value -> C-core's words for why it is not a duration
REFUSED: list[tuple[Any, str]] = [
    ("1", "Not a duration (no s suffix)"),
    ("1.5", "Not a duration (no s suffix)"),
    ("1.5s ", "Not a duration (no s suffix)"),
    ("1S", "Not a duration (no s suffix)"),
    ("s", "Not a duration (not a number of seconds)"),
    (".5s", "Not a duration (not a number of seconds)"),
    ("-.5s", "Not a duration (not a number of seconds)"),
    ("1e3s", "Not a duration (not a number of seconds)"),
    ("0x10s", "Not a duration (not a number of seconds)"),
    ("1ms", "Not a duration (not a number of seconds)"),
    ("inf s", "Not a duration (not a number of seconds)"),
    ("nans", "Not a duration (not a number of seconds)"),
    ("\u0661s", "Not a duration (not a number of seconds)"),  # a non-ASCII digit
    ("99999999999999999999s", "Not a duration (not a number of seconds)"),  # past int64
    ("1.s", "Not a duration (not a number of nanoseconds)"),
    ("1..5s", "Not a duration (not a number of nanoseconds)"),
    ("1.- 5s", "Not a duration (not a number of nanoseconds)"),
    ("1.\u0665s", "Not a duration (not a number of nanoseconds)"),
    ("1.99999999999s", "Not a duration (not a number of nanoseconds)"),  # past int32
    ("1.0000000001s", "Not a duration (too many digits after decimal)"),
    ("1.-000000001s", "Not a duration (too many digits after decimal)"),
    ("-1s", "seconds must be in the range [0, 315576000000]"),
    (f"{MAX_SECONDS + 1}s", "seconds must be in the range [0, 315576000000]"),
    ("9223372036854775807s", "seconds must be in the range [0, 315576000000]"),
    (1, "is not a string"),
    (1.5, "is not a string"),
    (True, "is not a string"),
    (None, "is not a string"),
    ({"seconds": 1}, "is not a string"),  # proto3 JSON's object form neither
]


@pytest.mark.parametrize(("text", "seconds"), READ.items(), ids=list(map(repr, READ)))
def test_a_duration_is_read_as_grpcio_reads_it(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-9)


@pytest.mark.parametrize(("value", "problem"), REFUSED, ids=[repr(v) for v, _ in REFUSED])
def test_a_duration_grpcio_refuses_is_refused_in_its_words(value, problem):
    with pytest.raises(DurationError) as err:
        parse_duration(value)
    assert str(err.value).startswith(problem + ", got ")


@pytest.mark.parametrize("text", ["-0.5s", "-0s", "0.-5s", "1.-5s", "-0.000000001s"])
def test_non_negative_refuses_every_form_written_with_a_minus(text):
    """A50 "Validation" (outlier detection): durations must be non-negative."""
    with pytest.raises(DurationError, match="must be non-negative"):
        parse_duration(text, non_negative=True)
    assert parse_duration("1.5s", non_negative=True) == 1.5


def _wrr(text: str) -> Any:
    return registry.select([{"weighted_round_robin": {"blackoutPeriod": text}}])[1]


def _rls(text: str) -> Any:
    lookup = {
        "grpcKeybuilders": [{"names": [{"service": "s"}]}],
        "lookupService": "localhost:1",
        "cacheSizeBytes": 10,
        "lookupServiceTimeout": text,
    }
    return registry.select(
        [
            {
                "rls_experimental": {
                    "routeLookupConfig": lookup,
                    "childPolicy": [{"pick_first": {}}],
                    "childPolicyConfigTargetFieldName": "serviceName",
                }
            }
        ]
    )[1]


def _od(text: str) -> Any:
    config = {"interval": text, "childPolicy": [{"round_robin": {}}]}
    return registry.select([{"outlier_detection_experimental": config}])[1]


def _timeout(text: str) -> Any:
    return parse_service_config({"methodConfig": [{"name": [{}], "timeout": text}]})


def _refresh(text: str) -> list[str]:
    return validate_file_watcher_config(
        {"ca_certificate_file": "/x", "refresh_interval": text}, "c"
    )


@pytest.mark.parametrize(
    ("read", "field", "error"),
    [
        (_wrr, "weighted_round_robin.blackoutPeriod", LBConfigError),
        (_rls, "routeLookupConfig.lookupServiceTimeout", LBConfigError),
        (_od, "outlier_detection_experimental.interval", LBConfigError),
        (_timeout, "methodConfig[0].timeout", ValueError),
    ],
    ids=["weighted_round_robin", "rls", "outlier_detection", "service_config"],
)
def test_every_config_gives_the_same_words_naming_its_field(read, field, error):
    with pytest.raises(error) as err:
        read("1e3s")
    assert f'{field}: Not a duration (not a number of seconds), got "1e3s"' in str(err.value)
    read("1. 5s")  # and each takes what grpcio takes (1.05 s)


def test_refresh_interval_gives_the_same_words_naming_its_field():
    assert _refresh("1e3s") == [
        'c.refresh_interval: Not a duration (not a number of seconds), got "1e3s"'
    ]
    assert _refresh("nan s") and _refresh("inf s")  # float() took these before
    assert _refresh("1. 5s") == []
    assert (
        FileWatcherProvider(
            {"ca_certificate_file": "/x", "refresh_interval": "1. 5s"}
        ).refresh_interval
        == 1.0
    )
