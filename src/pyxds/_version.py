"""The pyxds version: one place, importable without loading anything else
(the bootstrap and the xDS client's node name it; ``import pyxds`` re-exports it)."""

__version__ = "0.1.0"
