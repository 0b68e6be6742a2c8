"""Link a server run to the STS and SPS tables it served with, and its request-steps to their temperature.

``/server_info`` names the tables the server loaded (``speculative_dspark_confidence_sts_path``,
``speculative_dspark_sps_table_path``), as paths on the server's machine. The files a user
brings along are matched by base name: a table ingested from the run's own directory wins,
else the one table of that name in the store. A table ingested later (another ``acceptscope
ingest``) links then: every run whose link is still empty is looked at on every ingest.
``runs.sts_hash`` / ``sps_hash`` then reach the table's rows (``sts_tables``, ``sps_tables``),
and with them the temperatures the confidences in the dump were computed with.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterable, Optional

from acceptscope.domain.served_tables import TABLE_ARGS, named_tables


def _basename(path: str) -> str:
    return (PureWindowsPath(path) if "\\" in path else PurePosixPath(path)).name


def link_run_tables(store: Any, this_ingest: Iterable[str] = (), *, run_dirs: Optional[dict] = None,
                    temperature: Optional[float] = None) -> list[str]:
    """Fill empty ``runs.sts_hash`` / ``sps_hash`` from ingested tables; set ``temperature`` on the
    runs of ``this_ingest`` (the store fills their request-steps: :mod:`acceptscope.domain.temperature`).
    Returns one note per link made or missing (runs of this ingest)."""
    this_ingest = set(this_ingest)
    run_dirs = run_dirs or {}
    runs = store.query_arrow("SELECT run_id, sts_hash, sps_hash, config_json FROM runs").to_pylist()
    tables = {name: store.query_arrow(f"SELECT DISTINCT table_hash, source_path FROM {name}").to_pylist()
              for _, _, name, _ in TABLE_ARGS}
    notes: list[str] = []
    updates: dict[str, dict] = defaultdict(dict)
    for r in runs:
        named = named_tables(r["config_json"])
        for col, _, name, what in TABLE_ARGS:
            path = named.get(col)
            if path is None or r[col] is not None:
                continue
            base = _basename(path)
            cands = [t for t in tables[name] if t["source_path"] and Path(t["source_path"]).name == base]
            dirs = run_dirs.get(r["run_id"], set())
            local = {t["table_hash"] for t in cands if str(Path(t["source_path"]).parent) in dirs}
            hashes = local or {t["table_hash"] for t in cands}
            if len(hashes) == 1:
                updates[r["run_id"]][col] = next(iter(hashes))
                notes.append(f"run {r['run_id']}: linked the {what} table it served with ({path}) to "
                             f"{next(t['source_path'] for t in cands if t['table_hash'] in hashes)}")
            elif r["run_id"] in this_ingest:
                notes.append(f"run {r['run_id']}: served with the {what} table {path}, " +
                             ("which is not in the store: ingest that file to link it" if not hashes else
                              f"and {len(hashes)} different tables named {base} are in the store: ingest the "
                              "one it loaded from the run's own directory"))
    if temperature is not None:
        for rid in this_ingest:
            updates[rid]["temperature"] = float(temperature)
    for rid, values in updates.items():  # (a temperature set here fills the run's request-steps: the store's rule)
        store.update_run(rid, values)
    return notes
