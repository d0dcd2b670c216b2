"""pyxds: gRPC's client-side xDS stack in pure Python."""

__version__ = "0.1.0"
