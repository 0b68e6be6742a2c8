"""Dashboard panels: one module per panel, each exposing ``TITLE`` and ``render(ctx)``."""
