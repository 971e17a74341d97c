"""kwire: Kafka wire-protocol inspection (CLI, dataset schema and writer)."""

__version__ = "0.1.0"
