"""gRFC A21 (service config error handling) at the channel: what a service
config error from the resolver does, before and after a good config.

Sources: grpc/proposal A21-service-config-error-handling.md "Behavior on
receiving a new gRPC Config" (5.1, 5.2) and "Implementation" ("the resolver
always returns the list of addresses"); C-core
``ClientChannel::OnResolverResultChangedLocked`` (a config error with a
saved config: "Continuing to use previous service config"; without one:
TRANSIENT_FAILURE).  The non-wait_for_ready / wait_for_ready split before
any config is ``test_channel_picks.py::
test_wait_for_ready_rpc_queued_before_any_config_completes_when_config_arrives``.
"""

from __future__ import annotations

from test_channel_support import Harness, new_rpc, pick_blocking

from pyxds.lb.api import ConnectivityState, Endpoint, QueuePicker, Status
from pyxds.resolver.api import CallConfig, ConfigSelector, ResolverResult

UNAVAILABLE = __import__("grpc").StatusCode.UNAVAILABLE


class Selector(ConfigSelector):
    def __init__(self, timeout: float) -> None:
        self.config = CallConfig(timeout=timeout)

    def select(self, path, metadata):
        return self.config


def test_error_after_a_good_config_keeps_it_and_still_takes_the_addresses():
    """A21 5.1: "it should continue using that previous configuration";
    "Irrespective of whether the parsing on the service config failed or
    not, the resolver always returns the list of addresses": the LB policy
    (the same instance, its previous config) gets the new addresses, RPCs
    keep the previous selector's config, the channel does not fail."""
    harness = Harness()
    harness.start()
    good = Selector(7.0)
    harness.resolve([Endpoint(("10.0.0.1:80",))], good)
    policy = harness.policy
    harness.publish(QueuePicker(), ConnectivityState.CONNECTING)
    error = Status(UNAVAILABLE, "bad service config")
    harness.resolver.push(
        ResolverResult(
            endpoints=[Endpoint(("10.0.0.2:80",))],
            service_config_error=error,
            config_selector=Selector(1.0),
        )
    )
    core = harness.core
    core.serializer.run(lambda: None)
    assert core.selector is good
    assert harness.policy is policy
    assert [e.addresses for e in policy.updates[-1].endpoints] == [("10.0.0.2:80",)]
    assert policy.updates[-1].config == "driven"  # not pick_first
    assert core.state is ConnectivityState.CONNECTING
    assert core.no_config_status is None
    core.close()


def test_error_with_no_config_yet_fails_the_channel_until_a_good_one():
    """A21 5.2: "the channel will remain in state TRANSIENT_FAILURE until
    the resolver returns a valid response"; a non-wait_for_ready RPC fails
    with the resolver's reason meanwhile."""
    harness = Harness()
    harness.start()
    error = Status(UNAVAILABLE, "bad service config")
    harness.resolver.push(
        ResolverResult(endpoints=[Endpoint(("10.0.0.1:80",))], service_config_error=error)
    )
    core = harness.core
    core.serializer.run(lambda: None)
    assert core.state is ConnectivityState.TRANSIENT_FAILURE
    assert pick_blocking(new_rpc(core, "/svc/M", None, 5.0, False)) == error
    harness.resolve([Endpoint(("10.0.0.1:80",))], Selector(7.0))
    harness.publish(QueuePicker(), ConnectivityState.CONNECTING)
    assert core.state is ConnectivityState.CONNECTING
    assert core.no_config_status is None
    core.close()
