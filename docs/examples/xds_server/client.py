"""A pyxds client of the xDS-enabled server (docs/xds-server.md): Hello is
served, Secret is refused by the server's RBAC filter."""

from __future__ import annotations

import grpc

import pyxds

with pyxds.insecure_channel("xds:///greeter") as channel:
    hello: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/demo.Greeter/Hello")
    secret: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/demo.Greeter/Secret")
    print(hello(b"world", timeout=10, wait_for_ready=True).decode())
    try:
        secret(b"", timeout=10)
    except grpc.RpcError as err:
        print(f"Secret: {err.code().name}: {err.details()}")
