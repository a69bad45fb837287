"""iwscope dashboard: a multi-page Plotly Dash app over the collector's analysis module."""

__all__ = ["create_app"]


def __getattr__(name: str) -> object:
    # Lazy, so `iwscope --help` (which loads the CLI plugin) does not import Dash and the analysis.
    if name == "create_app":
        from iwscope_dashboard.app import create_app

        return create_app
    raise AttributeError(name)
