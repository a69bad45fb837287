"""iwprobe: the iwscope measurement agent (probe and instrumented origin), stdlib only."""

__version__ = "0.1.0"
