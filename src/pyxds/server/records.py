"""What the management server saw from its clients: requests, ACKs and NACKs.

A27 / the xDS protocol: a request that carries a ``response_nonce`` answers the
response with that nonce; with ``error_detail`` set it is a NACK (and its
``version_info`` is the last version the client accepted), without it an ACK.
"""

from __future__ import annotations

from pyxds._values import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """One DiscoveryRequest as received."""

    node_id: str
    type_url: str
    version_info: str
    nonce: str
    resource_names: tuple[str, ...]
    error_message: str | None
    stream_id: int
    has_node: bool


@dataclass(frozen=True)
class AckRecord:
    """A client accepted the response with ``nonce`` (its version is ``version_info``)."""

    node_id: str
    type_url: str
    version_info: str
    nonce: str
    resource_names: tuple[str, ...]
    stream_id: int = 0


@dataclass(frozen=True)
class NackRecord:
    """A client rejected the response with ``nonce``.

    ``version_info`` is the version the client still uses (the last it ACKed);
    ``rejected_version`` is the version of the rejected response when the server
    still knows the nonce, else None. ``error_message`` is the client's
    ``error_detail.message``.
    """

    node_id: str
    type_url: str
    version_info: str
    nonce: str
    error_message: str
    resource_names: tuple[str, ...]
    rejected_version: str | None = None
    stream_id: int = 0
