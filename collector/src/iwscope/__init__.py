"""iwscope collector: ingest API, data model, workers and analysis."""

__version__ = "0.1.0"
