"""The docs' small self-contained Python blocks run as shown (round 17).

The blocks that need nothing but pyxds (a fake helper, an in-memory metric
reader) run here for real, in the order a reader runs a page; the blocks
that quote a docs/examples file quote it as it is (the file is what the
e2e tests run). Blocks that need a control plane and backends were run by
hand for the round 17 report; test_docs_names.py checks their names.
"""

from __future__ import annotations

import pathlib
import textwrap
from typing import Any

import pytest
from test_docs_names import PYTHON, ROOT, Block

from pyxds import metrics
from pyxds.lb import registry


def page_blocks(page: str) -> list[Block]:
    return [b for b in PYTHON if b.page == page]


def quoted(page: str, first_line: str) -> Block:
    (block,) = [b for b in page_blocks(page) if b.text.startswith(first_line)]
    return block


@pytest.fixture
def unregister():
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


def test_the_lb_policies_page_example_policy_runs_as_shown(unregister):
    """lb-policies.md: the example_random policy, its registry.select and its
    FakeHelper test, run one after the other in one namespace."""
    blocks = page_blocks("docs/lb-policies.md")
    assert len(blocks) == 3
    namespace: dict[str, Any] = {}
    unregister.append("example_random")
    for block in blocks:
        exec(compile(block.text, str(block), "exec"), namespace)
    assert registry.get("example_random") is not None


@pytest.mark.parametrize(
    ("page", "first_line", "example"),
    [
        ("docs/custom-policy.md", "@dataclass(frozen=True)", "least_recent_policy.py"),
        ("docs/custom-resolver.md", "def _publish(", "address_book_resolver.py"),
    ],
)
def test_a_block_quoting_an_example_file_quotes_it_as_it_is(page, first_line, example):
    text = (pathlib.Path(ROOT) / "docs" / "examples" / example).read_text(encoding="utf-8")
    block = quoted(page, first_line)
    # The block is the file's text, dedented (a method quoted out of its class).
    assert any(
        textwrap.indent(block.text, indent, lambda line: bool(line.strip())) in text
        for indent in ("", "    ")
    ), f"{block} no longer quotes docs/examples/{example}"


@pytest.fixture
def my_gauge():
    yield "my.gauge"
    metrics.disable()
    metrics.INSTRUMENTS.pop("my.gauge", None)
    metrics._observers.pop("my.gauge", None)


def test_the_policy_author_metrics_block_exports_its_gauge(my_gauge):
    """observability.md "For policy authors": the declared gauge is exported
    once enabled by name; the counter and histogram calls are accepted."""
    sdk = pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from pyxds.testing import FakeHelper

    (block,) = [b for b in page_blocks("docs/observability.md") if "my.gauge" in b.text]
    reader = InMemoryMetricReader()
    namespace: dict[str, Any] = {
        "helper": FakeHelper(),
        "locality": "{region=r}",
        "weight": 2.0,
        "value": 7,
        "labels": {"grpc.target": "xds:///svc"},
    }
    exec(compile(block.text, str(block), "exec"), namespace)
    metrics.enable(sdk.MeterProvider(metric_readers=[reader]), enable_metrics=[my_gauge])
    data = reader.get_metrics_data()
    points = [
        (point.value, dict(point.attributes))
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == my_gauge
        for point in metric.data.data_points
    ]
    assert points == [(7, {"grpc.target": "xds:///svc"})]


def test_observing_an_undeclared_metric_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"unknown metric 'not.declared'.*INSTRUMENTS"):
        metrics.observe("not.declared", list)
