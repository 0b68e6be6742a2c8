"""The one stderr console every progress bar and message goes through, and the two helpers that make
user data safe to show on it.

It lives in the core (not in the CLI) so that ingest and audit can show progress without importing
the CLI layer. ``soft_wrap``: messages are never broken by inserted newlines at the terminal's width
(paths and run ids stay whole for grep and for tests at any COLUMNS); tables still fit the width.

User data (run ids, workloads, paths, a server's strings) reaches the terminal through :func:`plain`
(control characters such as ESC shown as ``?``: no title change, no screen clear) and, where the text
goes through rich markup, :func:`safe` (also ``rich.markup.escape``: a run id ``[/]x[/bold]`` prints
as itself instead of raising ``MarkupError``). Issue 30 found both.
"""

from __future__ import annotations

import re

from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape
from rich.text import Text

__all__ = ["console", "plain", "safe", "one_line"]



class _SafeConsole(Console):
    """A console whose every string (messages, table cells) has its control characters shown as ``?``
    and that prints a string that is not valid markup as plain text instead of raising ``MarkupError``:
    the safety net under :func:`safe`, for a site that forgot it."""

    def render_str(self, text: str, **kw) -> Text:  # type: ignore[override]
        text = plain(text, keep_newlines=True)
        try:
            return super().render_str(text, **kw)
        except MarkupError:
            return super().render_str(text, **dict(kw, markup=False))


console = _SafeConsole(stderr=True, soft_wrap=True)

# C0 and C1 controls, DEL, and the bidirectional overrides/isolates that reorder what a terminal shows
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def plain(text: object, keep_newlines: bool = False) -> str:
    """``text`` with every control character (ESC, BEL, CR, bidi overrides; newlines unless kept) and
    lone surrogate shown as ``?``: safe to print to a terminal as is."""
    s = text if isinstance(text, str) else str(text)
    if keep_newlines:  # (and tabs)
        return "\n".join("\t".join(_SURROGATE.sub("?", _CONTROL.sub("?", p)) for p in part.split("\t"))
                         for part in s.split("\n"))
    return _SURROGATE.sub("?", _CONTROL.sub("?", s))


def safe(text: object) -> str:
    """``text`` for a rich string that is parsed as markup: :func:`plain`, then markup-escaped."""
    return escape(plain(text))


def one_line(e: BaseException | str, limit: int = 400) -> str:
    """An error as one printable line of at most ``limit`` characters (a 130 KB run id is cut, and says so)."""
    text = e if isinstance(e, str) else (f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
    s = plain(" ".join(text.split()))
    if len(s) > limit:
        s = s[: limit - 30] + f"... ({len(s):,} characters)"
    return s
