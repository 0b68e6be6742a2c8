"""The one stderr console every progress bar and message goes through.

It lives in the core (not in the CLI) so that ingest and audit can show progress without importing
the CLI layer. ``soft_wrap``: messages are never broken by inserted newlines at the terminal's width
(paths and run ids stay whole for grep and for tests at any COLUMNS); tables still fit the width.
"""

from __future__ import annotations

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)
