"""pyxds.channel."""
