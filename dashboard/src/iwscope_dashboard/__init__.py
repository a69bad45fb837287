"""iwscope component."""
