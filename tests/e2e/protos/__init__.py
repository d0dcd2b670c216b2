"""Generated test protos (regenerate: see protos/README.md)."""
