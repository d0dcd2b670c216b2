"""pyxds.cli."""
