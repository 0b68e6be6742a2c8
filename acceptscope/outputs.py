"""Every file and JSON document acceptscope writes goes through here: atomic files, strict JSON.

Why one place (issue 30): ``report --out`` killed mid-write left a 0-byte file, ENOSPC replaced a good
report with a torn one, ``calibrate --out`` under ``ulimit -f`` left a truncated STS table, and
``report --json`` printed ``NaN`` (invalid JSON). Here a file is written to a temporary file in the
same directory, flushed and fsynced, then renamed over the target (and the directory fsynced): a
reader sees the old file or the new one, never a part. A failed write removes its temporary file and
raises the ``OSError`` (the CLI says it in one line); the old file is untouched.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

__all__ = ["atomic_write", "atomic_file", "fsync_dir", "strict", "dumps_strict", "plain_links", "plain_link_text"]


def fsync_dir(path: str | Path) -> None:
    """Make a rename in ``path`` durable (best effort: some filesystems refuse a directory fsync)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | Path, mode: str = "w", encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path``; on a clean exit it replaces ``path`` whole.

    ``mode``: ``"w"`` (text) or ``"wb"``. The parent directory must exist (it is created when it does
    not). On any exception (a kill cannot run this; its temporary file is a hidden ``.name.*.tmp``
    that readers skip) the temporary file is removed and ``path`` is left as it was."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file mode must be 'w' or 'wb', not {mode!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": encoding, "newline": ""})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, 0o644 & ~_umask())
        except OSError:
            pass
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(target.parent)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def atomic_write(path: str | Path, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`); returns the path."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", encoding) as f:
        f.write(data)
    return Path(path)


def strict(obj: Any) -> Any:
    """``obj`` with every value JSON cannot hold made representable: NaN/inf -> None, numpy scalars and
    arrays -> Python numbers and lists, pandas' NA/NaT -> None, tuples and sets -> lists, other objects
    -> ``str``."""
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, (str, int, float, bool)) or k is None else k: strict(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [strict(v) for v in obj]
    tolist = getattr(obj, "tolist", None)  # numpy scalars and arrays
    if callable(tolist) and type(obj).__module__.startswith("numpy"):
        return strict(tolist())
    if type(obj).__name__ in ("NAType", "NaTType"):  # pandas' missing values (pandas is not imported here)
        return None
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    return str(obj)


def dumps_strict(obj: Any, indent: int | None = 2, sort_keys: bool = False) -> str:
    """Strict JSON text (RFC 8259: no ``NaN``/``Infinity``) of ``obj`` (see :func:`strict`)."""
    return json.dumps(strict(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


# plotly renders a subset of HTML in every text of a figure (names, titles, tick labels, hover text):
# an ``<a href>`` inside a run id or workload became a live link in the report and the dashboard
_LINK = re.compile(r"<(\s*/?\s*a\b)", re.IGNORECASE)


def plain_link_text(text: str) -> str:
    """``text`` with every ``<a ...>`` / ``</a>`` tag shown as text in a plotly figure (``&lt;a ...``)."""
    return _LINK.sub(r"&lt;\1", text)


def _unlink(obj: Any) -> tuple[Any, bool]:
    if isinstance(obj, str):
        new = plain_link_text(obj) if "<" in obj else obj
        return new, new is not obj
    if isinstance(obj, dict):
        changed = False
        out = {}
        for k, v in obj.items():
            out[k], c = _unlink(v)
            changed |= c
        return (out if changed else obj), changed
    if isinstance(obj, (list, tuple)) or getattr(obj, "dtype", None) == object:
        items = [_unlink(v) for v in obj]
        if any(c for _, c in items):
            return [v for v, _ in items], True
    return obj, False


def plain_links(fig: Any) -> Any:
    """Every link tag in a plotly figure's data and layout shown as plain text (in place); returns ``fig``.

    The one place figures are made link-free: the figure modules' layout helpers and the report call it."""
    spec = fig.to_plotly_json()
    new, changed = _unlink(spec)
    if changed:
        for trace, data in zip(fig.data, new["data"]):
            trace.update(data, overwrite=True)
        fig.update_layout(new["layout"], overwrite=True)
    return fig
