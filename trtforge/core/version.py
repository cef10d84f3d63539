"""trtforge's version: one place, read by the package front door, manifests and the CLI."""

__version__ = "0.1.0"
