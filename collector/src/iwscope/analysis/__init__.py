"""Analysis of IW experiments (placeholder surface; filled below)."""
