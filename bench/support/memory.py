"""This process's memory as /proc/self/status reports it: the benches' one reader of it."""

from __future__ import annotations


def status_mb(field: str) -> float:
    """A memory line of /proc/self/status (``VmHWM``: peak RSS of this process since exec) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)
