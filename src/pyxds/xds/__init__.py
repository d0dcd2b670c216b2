"""pyxds.xds."""
