"""The one temperature rule: the sampling temperature a request-step was served at, and where it is applied.

The rule: a request-step's own temperature (the engine records it on every row), else its request's
(``requests.temperature``: a traffic driver's records, the ``sampling_params`` saved beside an SGLang
response), else its run's (``runs.temperature``: ``acceptscope ingest --temperature``), else unknown, kept
NULL (SGLang's dumps carry none). Whatever order the writes come in: a row given its run's temperature
before its request record was stored takes the request's when that arrives (so does a row whose own value
equals its run's: the engine writes the same value on a row and its request); any other stored value stays.

Where it is applied: where the data is written, and nowhere else. :class:`acceptscope.store.Store` calls
:func:`fill_batch` on every batch of request-steps before its INSERT and :func:`fill_from_requests` /
:func:`fill_stored` after a write that brings a request's or a run's temperature (``write_arrow``,
``update_run``); a file written before schema version 8 is filled once by :func:`fill_stored` on its first
read-write open (``summaries.ensure``), and a read-only open of such a file that still holds fillable rows
is refused (:func:`fillable`). Readers (the estimators, an exported Parquet lake, Spark) read the column as
stored: no reader joins ``requests`` or ``runs`` for it.

Why unknown stays NULL instead of being written as 1.0: a later ``ingest --temperature`` or request records
can still fill it, and the estimators say it is unknown (a note on the frame; a run whose temperatures are
unknown is not pooled with one whose are known for hazards). Where a number is needed, unknown reads as
sampled at T = 1, SGLang's default (:func:`as_served`).

The functions take an open DuckDB connection (the caller owns the transaction and the file lock); this
module imports nothing from the store.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

UNKNOWN_READS_AS = 1.0  # SGLang's default sampling temperature: an unknown one is read as sampled
UNKNOWN_NOTE = "temperature missing on some rows: treated as sampled (T>0)"  # the frame's note (unchanged text)


def as_served(t: Any) -> np.ndarray:
    """Temperatures as the estimators use them: a NULL/NaN (unknown) one read as :data:`UNKNOWN_READS_AS`."""
    t = np.asarray(t, np.float64)
    return np.where(np.isnan(t), UNKNOWN_READS_AS, t)


def _has_source(con: Any, run_ids: Sequence[str]) -> bool:
    """Whether a request record or a run row of ``run_ids`` carries a temperature (else nothing can fill)."""
    return bool(con.execute(
        "SELECT EXISTS (SELECT 1 FROM requests WHERE temperature IS NOT NULL AND run_id IN (SELECT UNNEST($ids))) "
        "OR EXISTS (SELECT 1 FROM runs WHERE temperature IS NOT NULL AND run_id IN (SELECT UNNEST($ids)))",
        {"ids": list(run_ids)}).fetchall()[0][0])


def fill_batch(con: Any, tbl: pa.Table) -> pa.Table:
    """A batch of ``request_steps`` (record-model schema) with its NULL temperatures filled from the
    stored ``requests`` (first) and ``runs``; row order and every other column unchanged. A batch with no
    NULL costs a null count; one whose runs have no temperature anywhere (an SGLang dump alone) two EXISTS
    probes on ``requests`` and ``runs`` more."""
    col = tbl.column("temperature")
    if col.null_count == 0:
        return tbl
    missing = pc.is_null(col)
    keys = tbl.select(["run_id", "rid"]).append_column("_i", pa.array(np.arange(tbl.num_rows, dtype=np.int64))) \
        .filter(missing)
    runs = pc.unique(keys.column("run_id")).drop_null().to_pylist()
    if not runs or not _has_source(con, runs):
        return tbl
    con.register("_acceptscope_t_keys", keys)
    try:
        got = con.execute(
            "SELECT k._i, coalesce(q.temperature, r.temperature) AS t FROM _acceptscope_t_keys k "
            "LEFT JOIN (SELECT run_id, rid, temperature FROM requests WHERE temperature IS NOT NULL "
            "AND run_id IN (SELECT UNNEST($ids))) q ON k.run_id = q.run_id AND k.rid = q.rid "
            "LEFT JOIN runs r ON k.run_id = r.run_id "
            "WHERE coalesce(q.temperature, r.temperature) IS NOT NULL", {"ids": runs}).fetchnumpy()
    finally:
        con.unregister("_acceptscope_t_keys")
    if not len(got["_i"]):
        return tbl
    t = np.array(pc.fill_null(col, np.nan).to_numpy(), np.float64)
    known = ~np.asarray(missing, bool)
    idx = np.asarray(got["_i"], np.int64)
    t[idx] = np.asarray(got["t"], np.float64)
    known[idx] = True
    filled = pa.array(t, pa.float64(), mask=~known)
    return tbl.set_column(tbl.schema.get_field_index("temperature"), tbl.schema.field("temperature"), filled)


def fill_from_requests(con: Any, requests: pa.Table) -> int:
    """Give the stored request-steps of the request records just written (``requests`` rows with a
    temperature; the stored record's value, which a repeated key does not replace) their request's
    temperature where they hold none, or only their run's (written before their request record, whichever
    order the writes came in). Returns rows changed."""
    if "temperature" not in requests.column_names or requests.column("temperature").null_count == requests.num_rows:
        return 0
    keys = requests.select(["run_id", "rid"]).filter(pc.is_valid(requests.column("temperature")))
    runs = pc.unique(keys.column("run_id")).drop_null().to_pylist()
    con.register("_acceptscope_t_requests", keys)
    try:
        n = con.execute(
            "UPDATE request_steps AS rs SET temperature = q.temperature FROM (SELECT q.run_id, q.rid, q.temperature, "
            "r.temperature AS run_t FROM requests q SEMI JOIN _acceptscope_t_requests k ON q.run_id = k.run_id "
            "AND q.rid = k.rid LEFT JOIN runs r ON q.run_id = r.run_id WHERE q.temperature IS NOT NULL) AS q "
            "WHERE rs.run_id = q.run_id AND rs.rid = q.rid AND (rs.temperature IS NULL OR rs.temperature = q.run_t) "
            "AND rs.temperature IS DISTINCT FROM q.temperature AND rs.run_id IN (SELECT UNNEST($ids))",
            {"ids": runs}).fetchall()
    finally:
        con.unregister("_acceptscope_t_requests")
    return int(n[0][0]) if n else 0


def _runs_clause(run_ids: Sequence[str] | None) -> tuple[str, dict]:
    if run_ids is None:
        return "", {}
    return " AND rs.run_id IN (SELECT UNNEST($ids))", {"ids": list(run_ids)}


def fill_stored(con: Any, run_ids: Sequence[str] | None = None) -> int:
    """Fill stored request-steps still NULL (of ``run_ids``; None: every run): the request's temperature,
    else the run's. A run's temperature set after its rows (``update_run``), and the migration of a file
    written before schema version 8. Returns rows filled."""
    if run_ids is not None and not list(run_ids):
        return 0
    where, params = _runs_clause(run_ids)
    a = con.execute(
        "UPDATE request_steps AS rs SET temperature = q.temperature FROM requests AS q "
        "WHERE rs.run_id = q.run_id AND rs.rid = q.rid AND rs.temperature IS NULL "
        "AND q.temperature IS NOT NULL" + where, params).fetchall()
    b = con.execute(
        "UPDATE request_steps AS rs SET temperature = r.temperature FROM runs AS r "
        "WHERE rs.run_id = r.run_id AND rs.temperature IS NULL AND r.temperature IS NOT NULL" + where,
        params).fetchall()
    return sum(int(x[0][0]) for x in (a, b) if x)


def fillable(con: Any) -> int:
    """Stored request-steps still NULL that the rule would fill (a file written before schema version 8,
    not yet opened read-write). Two small EXISTS first: a file with no temperature source costs no scan."""
    if not con.execute(
            "SELECT EXISTS (SELECT 1 FROM requests WHERE temperature IS NOT NULL) "
            "OR EXISTS (SELECT 1 FROM runs WHERE temperature IS NOT NULL)").fetchall()[0][0]:
        return 0
    return int(con.execute(
        "SELECT count(*) FROM request_steps rs LEFT JOIN (SELECT run_id, rid FROM requests WHERE temperature "
        "IS NOT NULL) q ON rs.run_id = q.run_id AND rs.rid = q.rid LEFT JOIN (SELECT run_id FROM runs WHERE "
        "temperature IS NOT NULL) r ON rs.run_id = r.run_id "
        "WHERE rs.temperature IS NULL AND (q.run_id IS NOT NULL OR r.run_id IS NOT NULL)").fetchall()[0][0])
