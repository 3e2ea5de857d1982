"""specbench: a speculative-decoding research framework (its layers: docs/architecture.md)."""

__version__ = "0.1.0"
