"""The accumulator every executor runs: one run's sums over chunks of whole requests.

Why one: the in-memory path (the run as one chunk), the streamed path (chunks of a DuckDB scan) and the
Spark executors (chunks of a partition, :meth:`RunAccumulator.state` shipped to the driver and
:meth:`RunAccumulator.merge`-d there) add the same chunks to the same class, so an estimator written
here (or registered in :mod:`estimators.registry`) reaches every executor with no further wiring.

Per chunk: the tail estimator's walk and per-block predictions, reduced before the next chunk to

* tail: per-(group, request) sufficient statistics (:func:`estimators.bootstrap.request_stats`) or,
  for big runs, the keyed bootstrap's per-replicate partial sums, plus per-group hazard-refit shifts;
* utilization: per-group sums, per-position sums, the window histogram, a per-request table;
* trim counters: sums; calibration: the rows of a stable hash-sample of requests;
* every registered estimator's own sums (:mod:`estimators.registry`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from acceptscope.estimators.bootstrap import (add_sums, aggregate_from_sums, aggregate_stats, group_codes,
                                              replicate_sums, request_stats, row_request_keys, shift_sums, uniforms)
from acceptscope.estimators.calibration import CalData, calibration_data
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.registry import Chunk, RunInfo, registered
from acceptscope.estimators.tail import observation_statement
from acceptscope.estimators.utilization import UtilizationResult
from acceptscope.estimators.bands import batch_band

GROUPINGS = ((), ("workload",), ("band",))
FOLD_CHUNKS = 32  # per-chunk group sums (utilization, windows, refit shifts) are added up every this many chunks


def aggregate_specs(n_boot: int, seed: int) -> list[tuple]:
    """The tail aggregates (grouping, n_boot, target, seed) the results read: the tail summary (400
    replicates, seed 0), the figures (200, seed 0) and the utilization intervals per grouping. A
    big run keeps only these, as per-replicate partial sums (memory flat in its rows)."""
    return sorted({((), 400, "run", 0), *((g, 200, "run", 0) for g in GROUPINGS),
                   *((g, n_boot, "run", seed) for g in GROUPINGS)})


def grouping_sums(st: pd.DataFrame, g: tuple, specs) -> list[tuple]:
    """(spec, :func:`estimators.bootstrap.replicate_sums` part) of every spec of grouping ``g`` over the
    per-request statistics ``st``. Specs that differ only in their number of replicates share one call:
    replicate ``i``'s draws are keyed by (request, ``i``, seed) and each replicate's sums are its own row,
    so the first 200 rows of 400 replicates are the 200-replicate part exactly (tested)."""
    out = []
    mine = [sp for sp in specs if sp[0] == g]
    for target, seed in dict.fromkeys((sp[2], sp[3]) for sp in mine):
        same = [sp for sp in mine if (sp[2], sp[3]) == (target, seed)]
        top = max(sp[1] for sp in same)
        part = replicate_sums(st, list(g), n_boot=top, target=target, seed=seed)
        out += [(sp, part if sp[1] == top else first_replicates(part, sp[1])) for sp in same]
    return out


def first_replicates(part: dict, n_boot: int) -> dict:
    """A :func:`estimators.bootstrap.replicate_sums` part cut to its first ``n_boot`` replicates."""
    return dict(part, num=part["num"][:n_boot].copy(), den=None if part["den"] is None else part["den"][:n_boot].copy())


def identified_bounds(counts: dict) -> dict:
    """The run's mean ceiling (drafts per block) as the telemetry proves it, whatever the hazard model:
    each block between its window-and-walk floor and gamma (or its first known rejection)."""
    n = max(counts["n"], 1)
    return {"mean_ceiling_lo": counts["sum_bound_lo"] / n, "mean_ceiling_hi": counts["sum_bound_hi"] / n}


def fold_sums(parts: list[pd.DataFrame], by: list[str]) -> list[pd.DataFrame]:
    """Per-group sum rows of several chunks as one frame (bounded memory over many chunks)."""
    d = pd.concat(parts, ignore_index=True)
    return [d.groupby(by, dropna=False, sort=False).sum().reset_index() if by else d.sum().to_frame().T]


@dataclass
class StreamTail:
    """The tail estimator's result over a streamed run: sums, not blocks (see module docstring)."""

    counts: dict
    stats: dict  # grouping (tuple) -> per-(group, request) statistics (runs up to ``sample_rows``)
    shifts: dict  # grouping -> per-group hazard-refit shifts (or absent)
    gamma: int
    levels: tuple
    hazard_info: dict
    notes: list[str] = field(default_factory=list)
    sums: dict = field(default_factory=dict)  # (grouping, n_boot, target, seed) -> [replicate partial sums]
    blocks: pd.DataFrame | None = None  # per-block predictions, kept when the run was one chunk
    advice: list = field(default_factory=list)  # the audit that reaches target widths (estimators.audit_size)

    def summary(self) -> dict:
        c = self.counts
        recorded = c["n_truth"] == c["n"]
        return dict(n_request_steps=int(c["n"]), n_censored=int(c["n_censored"]),
                    censored_by_mode={k: int(v) for k, v in c["modes"].items() if v},
                    mean_ceiling=c["sum_mean"] / max(c["n"], 1), mean_accept_length=c["sum_mean"] / max(c["n"], 1) + 1,
                    greedy_resolved=int(c["greedy_resolved"]), n_resolved=int(c["resolved"]),
                    n_unresolved=int(c["n_censored"] - c["resolved"]),
                    identified=identified_bounds(c),
                    ceiling="recorded" if recorded else "estimated",
                    statement=observation_statement(int(c["n"]), int(c["n_censored"]), int(c["resolved"]),
                                                    c["sum_truth"] / max(c["n"], 1) if recorded else None,
                                                    self.notes),
                    hazard=self.hazard_info, notes=self.notes, audit_advice=self.advice)

    def aggregate(self, by: list[str] | str | None = None, level: float = 0.95, n_boot: int = 400,
                  target: str = "run", seed: int = 0) -> pd.DataFrame:
        by = [by] if isinstance(by, str) else list(by or [])
        key = tuple(by)
        spec = (key, n_boot, target, seed)
        if spec in self.sums:
            out = aggregate_from_sums(self.sums[spec], level=level, shift=self.shifts.get(key))
        elif key in self.stats:
            out = aggregate_stats(self.stats[key], by, level=level, n_boot=n_boot, target=target, seed=seed,
                                  shift=self.shifts.get(key))
        else:
            raise ValueError(f"streamed tail results keep the groupings {[list(g) for g in self.stats]} and the "
                             f"aggregates (grouping, n_boot, target, seed) {sorted(self.sums)}, not {spec}")
        if not by and target == "run" and len(out):  # the run's interval inside what the telemetry proves
            ident = identified_bounds(self.counts)
            out["lo"] = out["lo"].clip(lower=ident["mean_ceiling_lo"])
            out["hi"] = out["hi"].clip(upper=ident["mean_ceiling_hi"])
        return out

    def to_json(self) -> dict:
        return dict(summary=self.summary(), aggregate=self.aggregate().to_dict("records"))


class StepSizes:
    """Batch size per decode step ``(rank, epoch, forward_ct)``, looked up per request-step: one sorted
    int64 key and one float per step (16 bytes; a pandas MultiIndex Series took several times that,
    and a ``steps`` row is ~1/batch of a run's request-steps, so this is the part that grows)."""

    def __init__(self, d: pd.DataFrame):
        d = d.drop_duplicates(["rank", "epoch", "forward_ct"])  # the first row of a key wins, as before
        cols = [d[c].to_numpy(np.int64) for c in ("rank", "epoch", "forward_ct")]
        self.lo = [int(c.min()) if c.size else 0 for c in cols]
        self.span = [int(c.max()) - lo + 1 if c.size else 1 for c, lo in zip(cols, self.lo)]
        if self.span[0] * self.span[1] * self.span[2] >= 1 << 62:  # never in practice: keys far apart
            self._series = d.set_index(["rank", "epoch", "forward_ct"])["bs"]
            return
        self._series = None
        key = self._key(*cols)
        order = np.argsort(key, kind="stable")
        self.keys, self.bs = key[order], d["bs"].to_numpy(float)[order]

    def _key(self, rank, epoch, fct) -> np.ndarray:
        (r0, e0, f0), (_, E, F) = self.lo, self.span
        return ((rank.astype(np.int64) - r0) * E + (epoch.astype(np.int64) - e0)) * F + (fct.astype(np.int64) - f0)

    def lookup(self, rank, epoch, fct) -> np.ndarray:
        """Batch sizes of these decode steps (NaN where the step is not in the table)."""
        if self._series is not None:
            return self._series.reindex(pd.MultiIndex.from_arrays([rank, epoch, fct])).to_numpy(float)
        out = np.full(len(rank), np.nan)
        inside = np.ones(len(rank), bool)
        for v, lo, sp in zip((rank, epoch, fct), self.lo, self.span):
            v = np.asarray(v, np.int64)
            inside &= (v >= lo) & (v < lo + sp)
        if not self.keys.size or not inside.any():
            return out
        k = self._key(*(np.asarray(v)[inside] for v in (rank, epoch, fct)))
        at = np.minimum(np.searchsorted(self.keys, k), self.keys.size - 1)
        hit = self.keys[at] == k
        sub = np.full(k.size, np.nan)
        sub[hit] = self.bs[at[hit]]
        out[inside] = sub
        return out


class RunAccumulator:
    """Sums of one run over its chunks."""

    def __init__(self, run_id: str, gamma: int, est, exact: bool, steps: pd.DataFrame, hazard_boot: int, seed: int,
                 cal_fraction: float, temperatures, step_rows: pd.DataFrame | None = None, keep_per_request: bool = True,
                 specs=(), keep_stats: bool = True, gather=None, estimators: dict | None = None):
        self.run_id, self.G, self.est, self.exact = run_id, gamma, est, exact
        self.gather = gather  # SGLang's pg p/q extending the walk (in-memory runs only; see estimators.tail)
        self.hazard_boot, self.seed = hazard_boot, seed
        self.cal_fraction, self.temperatures = cal_fraction, temperatures
        self.counts = dict(n=0, n_censored=0, sum_mean=0.0, greedy_resolved=0, modes={}, resolved=0, n_truth=0,
                           sum_truth=0.0, sum_bound_lo=0.0, sum_bound_hi=0.0, sum_sens_lo=0.0, sum_sens_hi=0.0,
                           n_requests=0, n_open_requests=0)
        self.stats = {g: [] for g in GROUPINGS}
        self.shifts = {g: [] for g in GROUPINGS}
        self.util = {g: [] for g in GROUPINGS}
        self.pos = np.zeros((3, gamma))  # accepted, ceiling_reached, verified
        self.windows: list[pd.DataFrame] = []
        self.per_request: list[pd.DataFrame] = []
        self.labels: dict[str, dict] = {}  # group column -> label -> code (see _compact)
        self.keep_per_request = keep_per_request
        # the keyed bootstrap: per-replicate partial sums of ``specs`` added chunk by chunk (memory flat in
        # rows); the per-(group, request) statistics too only when ``keep_stats`` (any aggregate, small runs)
        self.specs, self.keep_stats = tuple(specs), keep_stats
        self.sums: dict = {}  # spec -> one replicate_sums part (the chunks so far, added up)
        self.trim = dict(request_steps=0, trimmed=0, regret=0, window_tokens=0, delivered=0, ceiling_tokens=0.0)
        self.cal: list = []
        self.cal_req: list[tuple[np.ndarray, np.ndarray]] = []  # (run_id, rid) of each calibration row
        self.notes: list[str] = []
        self.chunks = 0
        self.last_frame = self.last_tail = None  # the one chunk's frame and tail walk (exact planner audit)
        # the registered estimators (estimators.registry): each gets every chunk, merged like the sums here
        info = RunInfo(run_id=run_id, gamma=gamma, exact=exact, seed=seed)
        self.extra = {name: cls(info) for name, cls in (registered() if estimators is None else estimators).items()}
        # batch size per decode step: the steps table, else (as run_all) the run's request rows per step
        self._bs = StepSizes(steps if len(steps) else step_rows)
        self.bs_note = None if len(steps) else "batch size taken as the number of request rows per step (no steps table)"

    def add(self, tbl: pa.Table) -> None:
        self.chunks += 1
        frame = BlockFrame.from_request_steps(tbl, gamma=self.G)
        G, n = self.G, frame.n
        kw = {"gather": self.gather} if self.gather is not None else {}
        tail = self.est.estimate(frame, hazard_boot=0 if self.exact else self.hazard_boot, seed=self.seed, **kw)
        for note in tail.notes:  # the frame's, then the hazard model's (levels it was not trained on)
            if note.split(" ")[0].isdigit():
                continue  # per-chunk counts (discontinuities): not repeated per chunk
            if note not in self.notes:
                self.notes.append(note)
        b = tail.blocks
        df = frame.pandas_columns(("run_id", "rid", "rank", "epoch", "forward_ct"))  # not the whole lazy frame.df
        b["band"] = batch_band(self._bs.lookup(df["rank"].to_numpy(), df["epoch"].to_numpy(), df["forward_ct"].to_numpy()))
        keys = row_request_keys(b["run_id"], b["rid"])
        cens = b["censored"].to_numpy(bool)
        c = self.counts
        c["n"] += n
        c["n_censored"] += int(cens.sum())
        c["sum_mean"] += float(b["mean"].sum())
        for m, v in b.loc[cens, "mode"].value_counts().items():
            c["modes"][m] = c["modes"].get(m, 0) + int(v)
        c["greedy_resolved"] += int((cens & (b["mode"].to_numpy() == "greedy") & b["resolved"].to_numpy(bool)).sum())
        c["resolved"] += int((cens & b["resolved"].to_numpy(bool)).sum())
        rid = pd.factorize(b["rid"])[0]  # a chunk holds whole requests of one run
        c["n_requests"] += int(rid.max()) + 1 if n else 0
        c["n_open_requests"] += int(np.unique(rid[cens & ~b["resolved"].to_numpy(bool)]).size)
        if "truth" in b:
            t = b["truth"].to_numpy(float)
            c["n_truth"] += int((~np.isnan(t)).sum())
            c["sum_truth"] += float(np.nansum(t))
        c["sum_bound_lo"] += float(b["bound_lo"].sum())
        c["sum_bound_hi"] += float(b["bound_hi"].sum())
        # the unobserved-position band's ends (audit-size advice): band_* where an audit's posterior rode on the refits
        c["sum_sens_lo"] += float(b["band_lo" if "band_lo" in b else "sens_lo"].sum())
        c["sum_sens_hi"] += float(b["band_hi" if "band_hi" in b else "sens_hi"].sum())
        deltas = tail._boot["means"] - b["mean"].to_numpy(float)[None, :] if tail._boot else None
        # ceiling for utilization: exact where recorded, else the estimate
        if self.exact:
            ceil = frame.ceiling.astype(float)
            reach = (np.arange(G)[None, :] < frame.ceiling[:, None]).sum(0).astype(float)
        else:
            ceil = b["mean"].to_numpy(float)
            reach = (1 - np.cumsum(tail.pmf, 1)[:, :G]).sum(0)
        acc = frame.correct + 1
        # model-free bounds of each block's ceiling (what the telemetry proves; exact where recorded)
        blo, bhi = (ceil, ceil) if self.exact else (b["bound_lo"].to_numpy(float), b["bound_hi"].to_numpy(float))
        fold = self.chunks % FOLD_CHUNKS == 0
        for g in GROUPINGS:
            by = list(g)
            st = request_stats(b, by, keys=keys)
            for sp, part in grouping_sums(st, g, self.specs):
                self.sums[sp] = add_sums([self.sums[sp], part]) if sp in self.sums else part
            if self.keep_stats:
                self.stats[g].append(self._compact(st, g))
            if deltas is not None:
                self.shifts[g].append(shift_sums(b, by, deltas))
                if fold:
                    self.shifts[g] = fold_sums(self.shifts[g], by)
            gc, groups = group_codes(b, by)
            ng = len(groups)
            u = pd.DataFrame({name: np.bincount(gc, weights=w, minlength=ng) for name, w in (
                ("n", None), ("window", frame.window), ("committed", acc), ("ceiling_tokens", ceil + 1),
                ("bound_lo", blo), ("bound_hi", bhi), ("correct", frame.correct))})  # one frame, not 7 column inserts
            self.util[g].append(pd.concat([groups, u], axis=1) if by else u)
            if fold:
                self.util[g] = fold_sums(self.util[g], by)
        self.pos[0] += (np.arange(G)[None, :] < frame.correct[:, None]).sum(0)
        self.pos[1] += reach
        self.pos[2] += (np.arange(G)[None, :] < frame.window[:, None]).sum(0)
        base = pd.DataFrame({"workload": b["workload"].to_numpy(), "window": frame.window})
        self.windows.append(base.groupby(["workload", "window"], dropna=False).size().rename("count").reset_index())
        if fold:
            self.windows = fold_sums(self.windows, ["workload", "window"])
        if self.keep_per_request:
            self.per_request.append(self._per_request(df, rid, acc, ceil, frame.window))
        t = self.trim
        trimmed = frame.window < G
        t["request_steps"] += n
        t["trimmed"] += int(trimmed.sum())
        t["regret"] += int((trimmed & (frame.correct == frame.window)).sum())
        t["window_tokens"] += int(frame.window.sum())
        t["delivered"] += int(acc.sum())
        t["ceiling_tokens"] += float((ceil + 1).sum())
        if self.exact and self.cal_fraction > 0:
            pick = uniforms(keys, 0, self.seed, stream=4) < self.cal_fraction
            if pick.any():
                try:
                    d = calibration_data(frame, "realized", temperatures=self.temperatures)
                except ValueError:
                    d = None
                if d is not None:
                    ok = frame.has_truth & np.isfinite(frame.logits(self.temperatures)[0]).all(1)
                    sel = pick[ok]
                    self.cal.append((d.z[sel], d.y[sel], keys[ok][sel], d.notes))
                    self._tag_calibration_rows(tbl)
        chunk = Chunk(frame=frame, blocks=b, ceiling=ceil, exact=self.exact)
        for e in self.extra.values():
            e.add(chunk)
        # the exact planner audit of a one-chunk run needs them; a later chunk frees them (bounded memory)
        self.last_frame, self.last_tail = (frame, tail) if self.chunks == 1 else (None, None)

    @staticmethod
    def _per_request(df: pd.DataFrame, rid: np.ndarray, acc: np.ndarray, ceil: np.ndarray, window: np.ndarray):
        """One row per request of the chunk (``rid``: its request codes, in order of first appearance; a
        chunk holds whole requests of one run): what a groupby of (run_id, rid) gave, by bincount (the
        groupby of string keys was ~2% of a fleet's ``estimate``)."""
        m = int(rid.max()) + 1 if rid.size else 0
        first = np.zeros(m, np.int64)
        first[rid[::-1]] = np.arange(rid.size)[::-1]
        n = np.bincount(rid, minlength=m)
        return pd.DataFrame({"run_id": df["run_id"].to_numpy()[first], "rid": df["rid"].to_numpy()[first], "n": n,
                             "committed": np.bincount(rid, weights=acc, minlength=m).astype(np.int64),
                             "ceiling_tokens": np.bincount(rid, weights=ceil, minlength=m) + n,
                             "mean_window": np.bincount(rid, weights=window, minlength=m) / n})

    def _tag_calibration_rows(self, tbl: pa.Table) -> None:
        """The (run_id, rid) of the calibration rows just sampled, by their request key: partitions'
        rows are put back in frame order when merged (the held-out split draws per request in order)."""
        run, rid = (tbl.column(c).to_numpy(zero_copy_only=False).astype(object) for c in ("run_id", "rid"))
        uk, first = np.unique(row_request_keys(run, rid), return_index=True)
        at = first[np.searchsorted(uk, self.cal[-1][2])]
        self.cal_req.append((run[at], rid[at]))

    # -- moving between processes (the Spark executors) -----------------------------------------
    def state(self, cpu_s: float = 0.0) -> dict:
        """What an executor sends back: sums. The per-(group, request) statistics are reduced to the
        bootstrap's per-replicate partial sums of each aggregate the results use (``specs``)."""
        stats = {g: self._expand(pd.concat(v, ignore_index=True), g) for g, v in self.stats.items() if v}
        sums = {sp: part for g, st in stats.items() for sp, part in grouping_sums(st, g, self.specs)}
        return dict(counts=self.counts, sums=sums, shifts=self.shifts, util=self.util, pos=self.pos,
                    windows=self.windows, per_request=self.per_request, trim=self.trim, cal=self.cal,
                    cal_req=self.cal_req, notes=self.notes, chunks=self.chunks, cpu_s=cpu_s, extra=self.extra)

    def merge(self, states: list[dict]) -> None:
        """Add the partitions' states (:meth:`state`) into this accumulator, which saw no chunk itself;
        calibration rows in frame order (requests by sorted key). The tail aggregates then come from
        the replicate partial sums only (:attr:`sums`), not from per-request statistics."""
        c = self.counts
        self.sums = {}
        self.keep_stats = False
        for st in states:
            for k, v in st["counts"].items():
                if k == "modes":
                    for m, x in v.items():
                        c["modes"][m] = c["modes"].get(m, 0) + x
                else:
                    c[k] += v
            for sp, d in st["sums"].items():
                self.sums.setdefault(sp, []).append(d)
            for g in self.shifts:
                self.shifts[g] += st["shifts"][g]
                self.util[g] += st["util"][g]
            self.pos += st["pos"]
            self.windows += st["windows"]
            self.per_request += st["per_request"]
            for k, v in st["trim"].items():
                self.trim[k] += v
            self.cal += st["cal"]
            self.cal_req += st["cal_req"]
            self.notes += [n for n in st["notes"] if n not in self.notes]
            self.chunks += st["chunks"]
            for name, e in st["extra"].items():
                self.extra[name].merge(e)
        if self.cal:
            run = np.concatenate([r[0] for r in self.cal_req])
            rid = np.concatenate([r[1] for r in self.cal_req])
            order = pd.DataFrame({"a": run, "b": rid}).sort_values(["a", "b"], kind="stable").index.to_numpy()
            z, y, k = (np.concatenate([x[i] for x in self.cal])[order] for i in range(3))
            self.cal, self.cal_req = [(z, y, k, self.cal[0][3])], [(run[order], rid[order])]

    def _compact(self, st: pd.DataFrame, g: tuple) -> pd.DataFrame:
        """Per-(group, request) statistics kept between chunks in ~64 bytes a row: group labels as
        int32 codes of a per-run dictionary, counts as int32."""
        for c in g:
            lab = self.labels.setdefault(c, {})
            vals = st[c].to_numpy(object)
            codes = np.empty(len(vals), np.int32)
            null = pd.isna(vals)
            if null.any():
                codes[null] = lab.setdefault("None", len(lab))
            for v in pd.unique(vals[~null]):  # a few distinct labels per chunk
                codes[~null & (vals == v)] = lab.setdefault(str(v), len(lab))
            st[c] = codes
        for c in ("n", "n_censored", "n_truth"):
            st[c] = st[c].astype(np.int32)
        return st

    def _expand(self, st: pd.DataFrame, g: tuple) -> pd.DataFrame:
        for c in g:
            lab = self.labels.get(c, {})
            cats = [None] * len(lab)
            for k, v in lab.items():
                cats[v] = k
            st[c] = pd.Categorical.from_codes(st[c].to_numpy(), categories=cats)
        return st

    # -- results ---------------------------------------------------------
    def tail_result(self, info: dict, notes: list[str]) -> StreamTail:
        stats = {g: self._expand(pd.concat(v, ignore_index=True), g) for g, v in self.stats.items() if v}
        shifts = {}
        for g, v in self.shifts.items():
            if v:
                d = pd.concat(v, ignore_index=True)
                shifts[g] = d.groupby(list(g), dropna=False).sum().reset_index() if g else d.sum().to_frame().T
        return StreamTail(counts=self.counts, stats=stats, shifts=shifts, gamma=self.G,
                          levels=tuple(self.est.levels), hazard_info=info, notes=list(self.notes) + notes,
                          sums={sp: part if isinstance(part, list) else [part] for sp, part in self.sums.items()})

    def utilization_result(self, tail: StreamTail, n_boot: int, seed: int):
        rows = []
        G = self.G
        for g, by_name in zip(GROUPINGS, ("run", "workload", "band")):
            by = list(g)
            d = pd.concat(self.util[g], ignore_index=True)
            d = d.groupby(by, dropna=False).sum().reset_index() if by else d.sum().to_frame().T
            ci = None
            if not self.exact:
                ci = tail.aggregate(by=by, level=0.95, n_boot=n_boot, seed=seed)
                ci = ci.set_index("group" if not by else by[0])
            for _, r in d.iterrows():
                grp = self.run_id if not by else ("None" if pd.isna(r[by[0]]) else str(r[by[0]]))
                com, ce, nn = float(r["committed"]), float(r["ceiling_tokens"]), float(r["n"])
                row = dict(by=by_name, group=grp, n=int(nn), mean_window=float(r["window"] / nn),
                           committed=int(com), ceiling_tokens=ce, utilization=com / ce, exact=self.exact,
                           in_window_accept_rate=float(r["correct"] / max(r["window"], 1)),
                           spec_accept_rate=float(r["correct"] / (nn * G)))
                # what the telemetry proves whatever the model: the ceiling between its identification bounds
                b_lo, b_hi = float(r["bound_lo"] / nn), float(r["bound_hi"] / nn)
                row.update(ceiling_bound_lo=b_lo, ceiling_bound_hi=b_hi,
                           util_bound_lo=com / (nn * (b_hi + 1)), util_bound_hi=com / (nn * (b_lo + 1)))
                if ci is not None:
                    key = "all" if not by else grp
                    if key in ci.index:
                        lo, hi = max(ci.loc[key, "lo"], b_lo), min(ci.loc[key, "hi"], b_hi)
                        row["util_lo"], row["util_hi"] = float(com / (nn * (hi + 1))), float(com / (nn * (lo + 1)))
                else:
                    row["util_lo"] = row["util_hi"] = row["utilization"]
                rows.append(row)
        k = np.arange(G)
        by_pos = pd.DataFrame({"position": k, "accepted": self.pos[0].astype(np.int64), "ceiling_reached": self.pos[1],
                               "verified": self.pos[2].astype(np.int64)})
        by_pos["utilization"] = by_pos.accepted / by_pos.ceiling_reached.clip(lower=1e-12)
        win = pd.concat(self.windows, ignore_index=True).groupby(["workload", "window"], dropna=False)["count"].sum().reset_index()
        win["workload"] = win["workload"].astype(object).where(win["workload"].notna(), "None")
        win["share"] = win["count"] / win.groupby("workload")["count"].transform("sum")
        per_req = pd.concat(self.per_request, ignore_index=True) if self.per_request else \
            pd.DataFrame(columns=["run_id", "rid", "n", "committed", "ceiling_tokens", "mean_window"])
        per_req["utilization"] = per_req.committed / per_req.ceiling_tokens
        notes = [] if self.exact else ["ceiling estimated by the tail estimator; intervals: bootstrap of the mean ceiling"]
        if self.bs_note:
            notes.append(self.bs_note)
        if not self.keep_per_request:
            notes.append("per-request table not kept for a run this size (bounded memory)")
        return UtilizationResult(by_group=pd.DataFrame(rows), by_position=by_pos, windows=win, per_request=per_req,
                                 notes=notes)

    def realized_calibration(self):
        """The realized-label calibration rows this pass kept (a stable hash sample of requests when
        ``cal_fraction`` < 1), as :class:`estimators.calibration.CalData` (the streamed and Spark paths)."""
        if not self.cal:
            raise ValueError("label 'realized' needs request-steps with a ceiling (a cap-accept or static run)")
        z = np.concatenate([c[0] for c in self.cal])
        y = np.concatenate([c[1] for c in self.cal])
        grp = np.concatenate([c[2] for c in self.cal])
        notes = [self.cal[0][3][0], f"realized label: position k reached past iff k < ceiling ({len(z)} request-steps)"]
        if self.cal_fraction < 1:
            notes.append("calibration on a stable hash-sample of the run's requests")
        return CalData(z, y, grp, "realized", notes)

    def trim_counters(self) -> dict:
        t = self.trim
        out = {"request_steps": t["request_steps"], "trimmed_request_steps": t["trimmed"],
               "trim_regret_rate": t["regret"] / max(t["trimmed"], 1), "window_tokens": t["window_tokens"],
               "delivered_tokens": t["delivered"], "ceiling_tokens": t["ceiling_tokens"],
               "trim_ratio": 1 - t["delivered"] / t["ceiling_tokens"]}
        return out
