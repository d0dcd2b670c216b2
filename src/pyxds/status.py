"""The gRPC status every layer shares (docs/architecture.md, "Layers").

It lives below the xDS client, the resolver, the LB policies and the channel
so that none of them borrows it from another layer; ``pyxds.lb.api`` re-exports
it under its pinned name.
"""

from __future__ import annotations

import grpc

from pyxds._values import dataclass

__all__ = ["Status", "OK_STATUS"]


@dataclass(frozen=True, slots=True)
class Status:
    """A gRPC status: code plus human-readable details."""

    code: grpc.StatusCode
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.code is grpc.StatusCode.OK

    def __str__(self) -> str:
        name = self.code.name if hasattr(self.code, "name") else str(self.code)
        return f"{name}: {self.details}" if self.details else name


OK_STATUS = Status(grpc.StatusCode.OK)
