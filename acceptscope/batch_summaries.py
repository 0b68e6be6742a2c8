"""Summary rows of one appended batch computed in numpy from its Arrow columns, for ``summaries.add``.

Why: every append folds its batch into the per-run summaries in the writer's transaction, and the SQL
that defines them (``summaries.agg_sql``) has DuckDB convert the batch's Arrow columns once per
statement and unnest the per-position lists. On a server dump's ingest that fold was ~12% of the CPU.
Here the same rows come from bincounts over integer group codes: ``sum_cells`` (run x workload x
window), ``sum_requests`` (run x request x workload), ``sum_positions`` (run x workload x draft
position) and ``sum_reliability`` (x position x variant x bin).

Each function returns the rows the SQL gives on the same batch (keys and counts exactly; float sums
added in row order, so their last bits may differ, as DuckDB's own do with its thread count) or None
outside the plain case (the caller then runs the SQL): ragged or NULL-holding lists for the positions,
a window span or a batch too large for exact float64 integer sums, a confidence outside [0, 1].
``tests/test_summaries.py`` holds each equal to the SQL on messy batches.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import schema
from acceptscope.arrow_columns import one_array

__all__ = ["Groups", "cells_rows", "positions_rows", "reliability_rows", "requests_rows"]

_MAX_ROWS = 1 << 21  # rows per bincount: integer sums (|value| < 2**31) stay exact in float64 below 2**53
_MAX_SPAN = 1 << 12  # window values a batch may spread over before the SQL takes it
_REL_MAX_CELLS = 1 << 22  # dense accumulator cells (groups x positions x variants x bins) past which the SQL runs


class Groups:
    """Per row of a batch, the index of its (run_id, workload or '?') in :attr:`names`; ``code`` is None
    when every row is in the first group (one run, one workload: no dictionary encoding). Worked out once
    per batch and shared by the forms, as are the batch's columns joined into one array (:meth:`array`: a
    writer's batch comes in many chunks, and each join is a copy) and its integer columns (:meth:`ints`)."""

    def __init__(self, tbl: pa.Table):
        self._tbl, self._ints, self._arrays = tbl, {}, {}  # (integer columns and the survival matrix; arrays)
        run, wl = self.array("run_id"), pc.fill_null(self.array("workload"), "?")
        self.n_rows = len(run)
        if not len(run):
            self.names, self.code = [], None
            return
        first = (run[0].as_py(), wl[0].as_py())
        if pc.all(pc.equal(run, first[0])).as_py() and pc.all(pc.equal(wl, first[1])).as_py():
            self.names, self.code = [first], None
            return
        run, wl = pc.dictionary_encode(run), pc.dictionary_encode(wl)
        rd, wd = run.dictionary.to_pylist(), wl.dictionary.to_pylist()
        pair = np.asarray(run.indices, dtype=np.int64) * len(wd) + np.asarray(wl.indices, dtype=np.int64)
        used, self.code = np.unique(pair, return_inverse=True)
        self.names = [(rd[q // len(wd)], wd[q % len(wd)]) for q in used]

    def array(self, name: str) -> pa.Array:
        """The batch's column ``name`` as one Array, joined once."""
        if name not in self._arrays:
            self._arrays[name] = one_array(self._tbl.column(name))
        return self._arrays[name]

    def ints(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """(values with NULL as 0, validity or None when every value is there) of the batch's integer column."""
        if name not in self._ints:
            col = self.array(name)
            if col.null_count == 0:
                self._ints[name] = np.asarray(col, dtype=np.int64), None
            else:
                self._ints[name] = np.asarray(pc.fill_null(col, 0), dtype=np.int64), np.asarray(pc.is_valid(col))
        return self._ints[name]

    def survival(self) -> tuple[np.ndarray, np.ndarray | None] | None:
        """:func:`_fixed_width` of the batch's survival lists, worked out once for the forms that read them."""
        if "survival" not in self._ints:
            self._ints["survival"] = _fixed_width(self.array("survival"))
        return self._ints["survival"]

    def codes(self) -> np.ndarray:
        """``code`` with zeros for one group."""
        return np.zeros(self.n_rows, dtype=np.int64) if self.code is None else self.code

    def run_and_workload(self, g: np.ndarray) -> tuple[pa.Array, pa.Array]:
        """The run_id and workload columns of summary rows of groups ``g``."""
        return (pa.array([self.names[i][0] for i in g], pa.string()),
                pa.array([self.names[i][1] for i in g], pa.string()))


def _table(t: schema.Table, cols: list) -> pa.Table:
    return pa.Table.from_arrays([pa.array(c, f.type) if not isinstance(c, pa.Array) else c
                                 for c, f in zip(cols, t.arrow_schema)], schema=t.arrow_schema)


def _count_sums(groups: Groups, key: np.ndarray, size: int) -> list[np.ndarray]:
    """Per key (0..size-1) the columns ``summaries._COUNTS`` defines: the row count, then the sums and counts
    of acc_len, window, correct_drafts, ceiling + 1, acc_len where a ceiling is, cap_trim (float64: exact
    integers below 2**53, which ``_MAX_ROWS`` keeps)."""
    rows = np.bincount(key, minlength=size)

    def count(valid: np.ndarray | None) -> np.ndarray:
        return rows if valid is None else np.bincount(key, weights=valid, minlength=size)

    def total(values: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
        return np.bincount(key, weights=values if valid is None else np.where(valid, values, 0), minlength=size)

    acc, acc_ok = groups.ints("acc_len")
    win, win_ok = groups.ints("window")
    cd, cd_ok = groups.ints("correct_drafts")
    ceil, ceil_ok = groups.ints("ceiling")
    trim, trim_ok = groups.ints("cap_trim")
    both = acc_ok if ceil_ok is None else ceil_ok if acc_ok is None else acc_ok & ceil_ok
    no_ceiling = ceil_ok is not None and not ceil_ok.any()  # (a compact batch)
    zero = np.zeros(size)
    return [rows, total(acc, acc_ok), count(acc_ok), total(win, win_ok), count(win_ok), total(cd, cd_ok), count(cd_ok),
            zero if no_ceiling else total(ceil + 1, ceil_ok), zero if no_ceiling else count(ceil_ok),
            zero if no_ceiling else total(acc, both), total(trim, trim_ok), count(trim_ok)]


def cells_rows(tbl: pa.Table, groups: Groups) -> pa.Table | None:
    """``sum_cells`` rows of a batch: per (run, workload, window or -1) the row count and the sums and
    counts of acc_len, window, correct_drafts, ceiling + 1, acc_len where a ceiling is, cap_trim."""
    n = tbl.num_rows
    if n == 0 or n > _MAX_ROWS:
        return None
    win, win_ok = groups.ints("window")
    w = win if win_ok is None else np.where(win_ok, win, -1)
    lo, hi = int(w.min()), int(w.max())
    span = hi - lo + 1
    if span > _MAX_SPAN:
        return None
    key = w - lo if groups.code is None else groups.code * span + (w - lo)
    sums = _count_sums(groups, key, len(groups.names) * span)
    nz = np.flatnonzero(sums[0])
    g, r = np.divmod(nz, span)
    run, wl = groups.run_and_workload(g)
    return _table(schema.SUM_CELLS, [run, wl, (r + lo).astype(np.int32)]
                  + [np.rint(x[nz]).astype(np.int64) for x in sums])


def _fixed_width(surv: pa.Array) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(the non-NULL lists as a (rows, width) array of their own float type, which rows have one or None for
    all) when every list has one width and no NULL element (SGLang's: gamma each); None otherwise, and for
    width 0. A view of the list values where no row is NULL: no float64 copy (~22 MB of fresh pages for a
    400k-row flush of gamma 7); the forms add in float64 (``dtype=``), as SQL's sum of a FLOAT does."""
    has = None if surv.null_count == 0 else np.asarray(pc.is_valid(surv))
    lens = np.asarray(pc.fill_null(pc.list_value_length(surv), 0), dtype=np.int64)
    lens = lens if has is None else lens[has]
    if not len(lens) or not lens[0] or (lens != lens[0]).any():
        return None
    vals = (surv if has is None else surv.filter(pa.array(has))).flatten()
    if vals.null_count or len(vals) != len(lens) * int(lens[0]):
        return None
    return np.asarray(vals).reshape(len(lens), int(lens[0])), has


def requests_rows(tbl: pa.Table, groups: Groups) -> pa.Table | None:
    """``sum_requests`` rows of a batch: per (run, rid, workload) the counts of :func:`cells_rows`, and
    the sum and count of 1 + the row's survival sum (its expected accepted length), each row's list added
    left to right and the rows in order. None where a rid is NULL or the survival lists are ragged or
    hold a NULL element (the SQL then)."""
    n = tbl.num_rows
    rid = groups.array("rid")
    if n == 0 or n > _MAX_ROWS or rid.null_count:
        return None
    surv = groups.array("survival")
    fixed = None if surv.null_count == n else groups.survival()
    if fixed is None and surv.null_count < n:
        return None
    enc = pc.dictionary_encode(rid)
    nr = len(enc.dictionary)
    key = np.asarray(enc.indices, dtype=np.int64)
    if groups.code is None:  # one group: every dictionary entry occurs, so the codes are the keys already
        used = np.arange(nr)
    else:
        used, key = np.unique(groups.code * nr + key, return_inverse=True)
    size = len(used)
    x_sum, x_n = np.zeros(size), np.zeros(size)
    if fixed is not None:
        s, has = fixed
        x = s[:, 0].astype(np.float64)
        for k in range(1, s.shape[1]):
            x += s[:, k]
        x += 1.0
        rows_with = key if has is None else key[has]
        x_sum, x_n = np.bincount(rows_with, weights=x, minlength=size), np.bincount(rows_with, minlength=size)
    sums = _count_sums(groups, key, size)
    g, r = np.divmod(used, nr)
    run, wl = groups.run_and_workload(g)
    return _table(schema.SUM_REQUESTS, [run, enc.dictionary.take(pa.array(r)), wl]
                  + [np.rint(c).astype(np.int64) for c in sums] + [x_sum, x_n.astype(np.int64)])


def positions_rows(tbl: pa.Table, groups: Groups) -> pa.Table | None:
    """``sum_positions`` rows of a batch whose survival lists all have one length and no NULL element
    (SGLang's: gamma each): per (run, workload, position k) the rows with a list, the sum of survival_k,
    and the rows with ceiling >= k, with a ceiling, with window >= k, with window >= k and
    correct_drafts >= k, with window >= k and a correct_drafts (counts from per-group histograms)."""
    n = tbl.num_rows
    if n == 0 or n > _MAX_ROWS:
        return None
    surv = groups.array("survival")
    if surv.null_count == n or not pc.max(pc.list_value_length(surv)).as_py():
        return _table(schema.SUM_POSITIONS, [[] for _ in schema.SUM_POSITIONS.columns])  # no position reached
    fixed = groups.survival()
    if fixed is None:
        return None
    s, has = fixed
    width = s.shape[1]
    ng = len(groups.names)
    code = groups.codes() if has is None else groups.codes()[has]
    rows = np.bincount(code, minlength=ng)
    if ng == 1:
        sum_s = s.sum(axis=0, dtype=np.float64)[None, :]
    else:  # each group's rows in their order, summed row by row
        order = np.argsort(code, kind="stable")
        present = rows > 0
        sum_s = np.zeros((ng, width))
        sum_s[present] = np.add.reduceat(s[order], (np.cumsum(rows) - rows)[present], axis=0, dtype=np.float64)

    def column(name: str) -> tuple[np.ndarray, np.ndarray]:
        values, valid = groups.ints(name)
        valid = np.ones(n, dtype=bool) if valid is None else valid
        return (values, valid) if has is None else (values[has], valid[has])

    def at_least(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """(groups, width): rows with ``valid`` and ``values >= k`` for k = 1..width."""
        v = np.clip(values, 0, width)
        hist = np.bincount(code[valid] * (width + 1) + v[valid], minlength=ng * (width + 1)).reshape(ng, width + 1)
        return np.cumsum(hist[:, ::-1], axis=1)[:, ::-1][:, 1:]

    ceil, ceil_ok = column("ceiling")
    win, win_ok = column("window")
    cd, cd_ok = column("correct_drafts")
    per_row = np.repeat(rows[:, None], width, axis=1)
    n_emp = np.repeat(np.bincount(code[ceil_ok], minlength=ng)[:, None], width, axis=1)
    counts = [per_row, at_least(ceil, ceil_ok), n_emp, at_least(win, win_ok),
              at_least(np.minimum(win, cd), win_ok & cd_ok), at_least(win, win_ok & cd_ok)]
    g = np.flatnonzero(rows)
    run, wl = groups.run_and_workload(np.repeat(g, width))
    k = np.tile(np.arange(1, width + 1, dtype=np.int32), len(g))
    n_k, emp, n_emp, reached, acc_given, n_acc_given = (c[g].ravel().astype(np.int64) for c in counts)
    return _table(schema.SUM_POSITIONS, [run, wl, k, n_k, sum_s[g].ravel(), n_k, emp, n_emp, reached, acc_given,
                                         n_acc_given])


def reliability_rows(con: duckdb.DuckDBPyConnection, tbl: pa.Table, groups: Groups, n_bins: int) -> pa.Table | None:
    """``sum_reliability`` rows of a batch from its list offsets and values, not an unnest in SQL: keys
    and counts exactly; ``sum_p`` added in row, position order; the logit's sigmoid is DuckDB's own
    expression over the flat values. None outside the plain case: a label outside [0, 1], a ceiling
    past 2**20, or a dense accumulator too large. Works a record batch at a time (memory: one batch)."""
    if tbl.num_rows == 0:
        return None
    max_len = int(pc.max(pc.list_value_length(tbl["confidence"])).as_py() or 0)
    if max_len == 0:
        return _rel_table([], [], [], [], [], [], [], [])
    mm = pc.min_max(tbl["ceiling"]).as_py()
    if mm["max"] is not None and mm["max"] > (1 << 20):
        return None
    size = 2 * n_bins * max_len
    if len(groups.names) * size > _REL_MAX_CELLS:
        return None
    acc_p = np.zeros(len(groups.names) * size)
    acc_h = np.zeros(len(acc_p), dtype=np.int64)
    acc_n = np.zeros(len(acc_p), dtype=np.int64)
    start = 0
    for rb in tbl.to_batches(max_chunksize=1 << 17):
        n = rb.num_rows
        start += n
        ceil, conf = rb.column("ceiling"), rb.column("confidence")
        ok = np.asarray(pc.and_(pc.is_valid(ceil), pc.is_valid(conf)))
        if not ok.any():
            continue
        c_np = np.asarray(pc.fill_null(ceil, -1)).astype(np.int64)
        offs = np.asarray(conf.offsets, dtype=np.int64)
        lens = offs[1:] - offs[:-1]
        m = np.where(ok, np.clip(np.minimum(lens, c_np + 1), 0, None), 0)  # labelled positions per row
        if not m.any():
            continue
        code = None if groups.code is None else groups.code[start - n:start]
        vals = conf.values.slice(offs[0], offs[-1] - offs[0]).to_numpy(zero_copy_only=False)
        width = int(lens[0])
        row = np.repeat(np.arange(n), m)  # (row, position) order: a row's labelled positions are its first m
        k0 = np.arange(len(row)) - np.repeat(np.cumsum(m) - m, m)  # 0-based position
        if width and (lens == width).all():  # fixed-width lists (gamma): no gather of the offsets
            p = vals[row * width + k0]
        else:
            p = vals[offs[row] - offs[0] + k0]
        y = k0 < c_np[row]  # label: ceiling >= k
        base = k0 * (2 * n_bins) if code is None else code[row] * size + k0 * (2 * n_bins)
        variants = [(0, p, None)]
        lg = rb.column("confidence_logit")
        if lg.null_count < n:
            lo = np.asarray(lg.offsets, dtype=np.int64)
            have = np.asarray(pc.is_valid(lg))[row] & (k0 < (lo[1:] - lo[:-1])[row])
            z = lg.values.slice(lo[0], lo[-1] - lo[0]).take(pa.array(lo[row[have]] - lo[0] + k0[have]))
            con.register("_summarise_z", pa.table({"z": z}))
            try:
                raw = con.execute("SELECT 1 / (1 + exp(-z)) FROM _summarise_z").fetchnumpy()
            finally:
                con.unregister("_summarise_z")
            z = next(iter(raw.values()))  # (a NULL logit element: a masked value, dropped as NaN)
            variants.append((1, np.asarray(z.filled(np.nan) if np.ma.isMaskedArray(z) else z), have))
        for v, p, sel in variants:
            p = p.astype(np.float64)  # (c::DOUBLE)
            b, yy = (base, y) if sel is None else (base[sel], y[sel])
            keep = np.isfinite(p)
            if not keep.all():
                p, b, yy = p[keep], b[keep], yy[keep]
            if len(p) and (p.min() < 0 or p.max() > 1):
                return None
            key = b + (v * n_bins) + np.minimum(np.floor(p * n_bins).astype(np.int64), n_bins - 1)
            acc_p += np.bincount(key, weights=p, minlength=len(acc_p))
            acc_h += np.bincount(key[yy], minlength=len(acc_h))
            acc_n += np.bincount(key, minlength=len(acc_n))
    nz = np.flatnonzero(acc_n)
    g, r = np.divmod(nz, size)
    k0, r = np.divmod(r, 2 * n_bins)
    v, b = np.divmod(r, n_bins)
    run, wl = groups.run_and_workload(g)
    return _rel_table(run, wl, (k0 + 1).astype(np.int32), np.where(v == 0, "after", "before"), b.astype(np.int32),
                      acc_p[nz], acc_h[nz], acc_n[nz])


def _rel_table(run, wl, k, variant, b, sum_p, hits, n) -> pa.Table:
    return _table(schema.SUM_RELIABILITY, [run, wl, k, variant, b, sum_p, hits, n])
