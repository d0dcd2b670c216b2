"""xDS-enabled servers share the process's XdsClient (one ADS stream: a
second one is what istio-agent drops, istio/istio#53532) while channel
targets keep one client each (A71)."""

from __future__ import annotations

from pyxds.xds.client import SERVER_SCOPE, XdsClient

BOOT = {
    "xds_servers": [{"server_uri": "127.0.0.1:1", "channel_creds": [{"type": "insecure"}]}],
    "node": {"id": "scope-test"},
    "server_listener_resource_name_template": "grpc/server/%s",
}


def other_boot(node):
    return {**BOOT, "node": {"id": node}}


def test_a_server_joins_the_client_of_an_open_channel_target():
    channel, release_channel = XdsClient.get_or_create(BOOT, "xds:/a")
    server, release_server = XdsClient.get_or_create(BOOT, SERVER_SCOPE)
    try:
        assert server is channel
        assert channel.scopes == ("xds:/a", SERVER_SCOPE)
        assert (channel, ("xds:/a", SERVER_SCOPE)) in XdsClient.instances()
    finally:
        release_server()
        release_channel()
    assert channel._closed


def test_a_channel_target_takes_over_a_client_only_servers_use():
    server, release_server = XdsClient.get_or_create(other_boot("t1"), SERVER_SCOPE)
    channel, release_channel = XdsClient.get_or_create(other_boot("t1"), "xds:/a")
    second, release_second = XdsClient.get_or_create(other_boot("t1"), "xds:/b")
    try:
        assert channel is server
        assert channel.scope == "xds:/a"  # the channel's target names it (CSDS)
        assert second is not server  # A71: another target, another client
    finally:
        release_second()
        release_channel()
        assert not server._closed  # the server still holds it
        release_server()
    assert server._closed


def test_another_bootstrap_gets_its_own_client():
    a, release_a = XdsClient.get_or_create(other_boot("t2"), SERVER_SCOPE)
    b, release_b = XdsClient.get_or_create(other_boot("t3"), SERVER_SCOPE)
    try:
        assert a is not b
    finally:
        release_a()
        release_b()


def test_two_servers_share_one_client_and_release_it_once_each():
    a, release_a = XdsClient.get_or_create(other_boot("t4"), SERVER_SCOPE)
    b, release_b = XdsClient.get_or_create(other_boot("t4"), SERVER_SCOPE)
    assert a is b
    release_a()
    release_a()  # idempotent
    assert not a._closed
    release_b()
    assert a._closed


def test_a_released_target_no_longer_names_the_shared_client():
    _channel, release_channel = XdsClient.get_or_create(other_boot("t5"), "xds:/a")
    server, release_server = XdsClient.get_or_create(other_boot("t5"), SERVER_SCOPE)
    release_channel()
    try:
        assert server.scopes == (SERVER_SCOPE,) and server.scope == SERVER_SCOPE
        again, release_again = XdsClient.get_or_create(other_boot("t5"), "xds:/c")
        assert again is server  # a client only servers use is taken over again
        release_again()
    finally:
        release_server()


def test_a_shortened_timer_gets_a_client_of_its_own_and_the_default_is_a57s_15_s():
    """Tests shorten the does-not-exist timer of the client a server makes
    (``resource_timeout``); such a client is never shared with callers
    that keep A57's 15 s, and callers asking for the same timer share it."""
    plain, release_plain = XdsClient.get_or_create(other_boot("t6"), "xds:/a")
    short, release_short = XdsClient.get_or_create(
        other_boot("t6"), SERVER_SCOPE, resource_timeout=0.5
    )
    again, release_again = XdsClient.get_or_create(
        other_boot("t6"), SERVER_SCOPE, resource_timeout=0.5
    )
    try:
        assert short is not plain and again is short
        assert plain._resource_timeout == 15.0
        assert short._resource_timeout == 0.5
    finally:
        release_again()
        release_short()
        release_plain()
    assert short._closed and plain._closed
