"""Suite-wide isolation: a test must not leave a live display on the shared console.

Why: every command prints through ``acceptscope.console.console``. A progress bar a command left running
(an exception past its ``with``, a thread still drawing) stays on that console's live stack, and every
later ``console.print`` of every later test goes to the stream it captured, not to the one ``CliRunner``
gave the next command: its output reads empty and an unrelated test fails. The display is stopped here
and the test that left it is named in a warning.
"""

from __future__ import annotations

import warnings

import pytest

from acceptscope.console import console


@pytest.fixture(autouse=True)
def _no_live_display_left(request):
    yield
    stack = getattr(console, "_live_stack", None)
    if stack:
        warnings.warn(f"{request.node.nodeid} left {len(stack)} live display(s) on the shared console; stopped",
                      RuntimeWarning, stacklevel=1)
        while stack:
            live = stack[-1]
            live.stop()
            if stack and stack[-1] is live:  # a display that was never started properly
                stack.pop()
