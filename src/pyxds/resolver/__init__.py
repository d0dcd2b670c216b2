"""pyxds.resolver."""
