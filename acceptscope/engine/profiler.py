"""Cost profiler for the reference engine: step time over batch size and verify tokens -> SGLang SPS tables.

Mirrors SGLang's ``dspark_sps_profiler`` procedure on the embedded engine: for each batch
size ``bs`` and budget fraction ``frac`` the engine runs steady decode steps (draft + compact
verify of ``M = bs + int(frac * bs * gamma)`` total verify tokens + acceptance) on prefilled
requests, and the median step time of the cell is kept. Then

* the **diagonal** 1-D table takes the full-width cells (``frac = 1``, ``B = bs * (gamma+1)``)
  as ``steps_per_sec = 1 / median``;
* the **additive** table is an OLS fit ``T = bias + alpha[bs] + theta[bin(M)]`` with
  ``alpha[min bs] = 0`` and ``theta[min bin] = 0`` (SGLang's parametrisation; bins of
  ``mbin`` tokens, probes at the bin's mean M, written as ints).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
from scipy.optimize import isotonic_regression
import torch

from acceptscope.domain import sps as sps_mod
from acceptscope.engine.kv import pack
from acceptscope.domain.sps import SpsTable1D, SpsTableAdditive
from acceptscope.engine.verify import run_verify


@dataclass
class Cell:
    bs: int
    frac: float
    batch_tokens: int
    median_s: float
    samples: int


def profile_cells(
    engine,
    batch_sizes: Sequence[int],
    fracs: Sequence[float],
    *,
    context_len: int = 64,
    steps: int = 8,
    warmup: int = 2,
    vocab_hi: Optional[int] = None,
    progress: Optional[Callable[[], None]] = None,
) -> list[Cell]:
    """Time steady decode steps of ``engine`` (a :class:`runner.Engine`) per (bs, frac) cell."""
    G = engine.gamma
    tgt = engine.target
    V = vocab_hi or tgt.vocab_size
    g = torch.Generator().manual_seed(1234)
    cells: list[Cell] = []
    for bs in batch_sizes:
        if bs > tgt.cache.num_slots:
            raise ValueError(f"batch size {bs} exceeds the engine's {tgt.cache.num_slots} slots")
        slots = [tgt.cache.alloc() for _ in range(bs)]
        try:
            prompt = torch.randint(0, V, (bs * context_len,), generator=g)
            pb = pack(slots, [0] * bs, [context_len] * bs)
            _, hidden = tgt.forward(pb, prompt, logit_rows=pb.cu_seqlens[1:] - 1)
            states = []
            for i in range(bs):
                st = engine.drafter.new_state()
                engine.drafter.extend_context(st, hidden[i * context_len : (i + 1) * context_len])
                states.append(st)
            anchors = torch.randint(0, V, (bs,), generator=g)
            temps = torch.ones(bs)
            for frac in fracs:
                extra = int(frac * bs * G)
                base, rem = divmod(extra, bs)
                windows = torch.tensor([base + (1 if i < rem else 0) for i in range(bs)], dtype=torch.long)
                times = []
                for it in range(warmup + steps):
                    t0 = time.perf_counter()
                    prop = engine.drafter.propose(states, anchors, temps, engine.draft_gen)
                    u = torch.rand(bs, 2 * G + 1, generator=g)
                    run_verify(tgt, "compact", slots, [context_len] * bs, anchors, prop.tokens[:, :G],
                               prop.logprobs[:, :G], windows, temps, u[:, :G], u[:, G:])
                    if it >= warmup:
                        times.append(time.perf_counter() - t0)
                cells.append(Cell(bs, float(frac), bs + extra, float(np.median(times)), len(times)))
                if progress:
                    progress()
        finally:
            for s in slots:
                tgt.cache.free(s)
    return cells


def fit_diagonal(cells: Sequence[Cell], gamma: int, max_batch_tokens: Optional[int] = None) -> SpsTable1D:
    full = sorted((c for c in cells if c.frac >= 1.0), key=lambda c: c.batch_tokens)
    if not full:
        raise ValueError("diagonal fit needs full-width cells (frac = 1)")
    probes, sps = [], []
    for c in full:
        if probes and c.batch_tokens == probes[-1]:
            continue
        probes.append(int(c.batch_tokens))
        sps.append(1.0 / c.median_s)
    return SpsTable1D(probes, sps, int(max_batch_tokens or probes[-1]))


def fit_additive(cells: Sequence[Cell], mbin: int = 16, monotone: bool = True) -> SpsTableAdditive:
    """OLS on one-hot dummies: ``T = bias + alpha[bs] + theta[bin(M)]``.

    ``monotone`` (default) then makes alpha and theta non-decreasing (weighted PAV, weights =
    cells per level): on a shared CPU the raw dummies are noisy, and a cost that *drops* with
    more tokens makes the planner's argmax chase noise. ``monotone=False`` is SGLang's
    unconstrained fit.
    """
    if len(cells) < 4:
        raise ValueError("additive fit needs at least 4 cells")
    bss = sorted({c.bs for c in cells})
    bins = sorted({int(round(c.batch_tokens / mbin)) for c in cells})
    ncol = 1 + (len(bss) - 1) + (len(bins) - 1)
    X = np.zeros((len(cells), ncol))
    y = np.zeros(len(cells))
    for i, c in enumerate(cells):
        X[i, 0] = 1.0
        bi = bss.index(c.bs)
        if bi > 0:
            X[i, bi] = 1.0
        mi = bins.index(int(round(c.batch_tokens / mbin)))
        if mi > 0:
            X[i, len(bss) - 1 + mi] = 1.0
        y[i] = c.median_s
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    bias = float(coef[0])
    alpha = [0.0] + [float(v) for v in coef[1 : len(bss)]]
    theta = [0.0] + [float(v) for v in coef[len(bss) :]]
    if monotone:
        aw = [float(sum(1 for c in cells if c.bs == b)) for b in bss]
        tw = [float(sum(1 for c in cells if int(round(c.batch_tokens / mbin)) == b)) for b in bins]
        alpha = isotonic_regression(alpha, weights=aw).x.tolist()  # weighted least-squares, non-decreasing
        theta = isotonic_regression(theta, weights=tw).x.tolist()
        a0, t0 = alpha[0], theta[0]  # keep the SGLang parametrisation: first levels are 0
        alpha = [a - a0 for a in alpha]
        theta = [t - t0 for t in theta]
        bias += a0 + t0
    # probe = mean M of the cells in the bin (ints, strictly increasing)
    m_probes = []
    for b in bins:
        ms = [c.batch_tokens for c in cells if int(round(c.batch_tokens / mbin)) == b]
        m_probes.append(int(round(float(np.mean(ms)))))
    for i in range(1, len(m_probes)):
        if m_probes[i] <= m_probes[i - 1]:
            m_probes[i] = m_probes[i - 1] + 1
    if bias <= 0:  # keep SGLang's bias > 0 invariant by moving the shift into alpha
        shift = bias - 1e-6
        bias = 1e-6
        alpha = [a + shift for a in alpha]
    return SpsTableAdditive(bias, [int(b) for b in bss], alpha, m_probes, theta)


def cells_from_measurements(result: dict, component: str = "step_ms") -> list[Cell]:
    """Cells of one shape from :mod:`acceptscope.engine.gpu_profile` output (``results[i]``).

    ``component`` is ``step_ms`` (draft + verify, what SGLang's profiler times) or ``verify_ms``.
    Cells the GPU could not run (``error``) are skipped.
    """
    if component not in ("step_ms", "verify_ms"):
        raise ValueError(f"component must be step_ms or verify_ms, got {component!r}")
    out = []
    for i, c in enumerate(result.get("cells", [])):
        if "error" in c:
            continue
        for key in ("bs", "frac", "batch_tokens", component):
            if key not in c:
                raise ValueError(f"cells[{i}]: field {key}: missing")
        out.append(Cell(int(c["bs"]), float(c["frac"]), int(c["batch_tokens"]), float(c[component]) / 1e3,
                        int(c.get("reps", 0))))
    if not out:
        raise ValueError("no measured cells")
    return out


def fit_report(table, cells: Sequence[Cell]) -> dict:
    """How well a fitted table predicts its own cells: median / max relative error of the step time."""
    rel = [abs(table.step_seconds(c.bs, c.batch_tokens - c.bs) - c.median_s) / c.median_s for c in cells]
    return {"cells": len(rel), "median_rel_err": float(np.median(rel)), "max_rel_err": float(np.max(rel))}


HBM_DATASHEET_BYTES_PER_S = {"NVIDIA H200": 4.8e12, "NVIDIA H100 80GB HBM3": 3.35e12}


def write_measured_profile(doc: dict, out, *, shape: Optional[str] = None, mbin: int = 32,
                           component: str = "step_ms") -> dict:
    """Fit and write SGLang's two SPS formats from GPU measurements, with a provenance manifest.

    ``doc`` is the JSON that :mod:`acceptscope.engine.gpu_profile` writes. Files: the additive
    table at ``out``, the 1-D diagonal table at ``<stem>.1d.json`` and ``<out>.manifest.json``
    (GPU, driver, torch/CUDA, shape, context, date, the measured cells, fit quality and the
    batch-1 memory-bandwidth bound ratio). Returns the manifest.
    """
    results = doc.get("results") or []
    if shape is not None:
        results = [r for r in results if r.get("shape", {}).get("name") == shape]
    if len(results) != 1:
        raise ValueError(f"measurements hold {len(results)} results for shape {shape!r}; name exactly one")
    r = results[0]
    cells = cells_from_measurements(r, component)
    gamma = int(r["gamma"])
    add = fit_additive(cells, mbin=mbin)
    diag = fit_diagonal(cells, gamma, max_batch_tokens=max(c.bs for c in cells) * (gamma + 1))
    out = Path(out)
    p1 = out.with_name(out.name.removesuffix(".json") + ".1d.json")
    h_add = sps_mod.write_sps(add, out)
    h_1d = sps_mod.write_sps(diag, p1)
    prov = dict(doc.get("provenance") or {})
    bound = dict(r.get("bound") or {})
    sheet = HBM_DATASHEET_BYTES_PER_S.get(str(prov.get("gpu")))
    if bound and sheet:
        bound["datasheet_bandwidth_bytes_per_s"] = sheet
        bound["datasheet_bound_ms"] = bound["weight_bytes"] / sheet * 1e3
        b1 = min(bound["batch1_verify_ms"].values())
        bound["ratio_vs_datasheet"] = b1 / bound["datasheet_bound_ms"]
    man = {
        "kind": "acceptscope.gpu_cost_profile", "shape": r["shape"], "target_layers": r["target_layers"],
        "draft_layers": r["draft_layers"], "gamma": gamma, "context_len": r["context_len"],
        "step_component": component, "mbin": mbin, "provenance": prov, "bound": bound,
        "tables": {"additive": {"path": out.name, "sha256": h_add, "fit": fit_report(add, cells)},
                   "diagonal": {"path": p1.name, "sha256": h_1d, "fit": fit_report(diag, cells)}},
        "cells": r["cells"],
        "method": ("random-weight Qwen3-architecture decoder of the named shape, bf16, full depth unless "
                   "target_layers says otherwise; per cell a CUDA graph of draft(bs) + compact verify of "
                   "T = bs + int(frac * bs * gamma) front-packed tokens over a context_len K/V cache; "
                   "median of CUDA-event times; additive table = OLS bias + alpha[bs] + theta[bin(T)] "
                   "(monotone), 1-D table = the full-width cells"),
    }
    Path(str(out) + ".manifest.json").write_text(json.dumps(man, indent=1, sort_keys=True), encoding="utf-8")
    return man


def kv_ms_per_context_token(manifest: dict) -> float:
    """Milliseconds one more context token adds to a step: its K and V bytes, read once by every target and
    draft layer (a request's rows share one flash tile), over the profile session's measured HBM bandwidth.

    Analytic (shape + measured bandwidth), not fitted to any step time: the table is measured at one
    ``context_len``, the engine's requests hold their own contexts.
    """
    sh = manifest["shape"]
    layers = int(manifest["target_layers"]) + int(manifest.get("draft_layers") or 0)
    bw = (manifest.get("bound") or {}).get("bandwidth_bytes_per_s") or \
        (manifest.get("provenance") or {}).get("copy_bandwidth_bytes_per_s")
    if not bw:
        raise ValueError("cost profile manifest: no measured bandwidth (bound.bandwidth_bytes_per_s)")
    return 2 * 2 * int(sh["kv_heads"]) * int(sh["head_dim"]) * layers / float(bw) * 1e3


def fit_context_term(rows: Sequence[dict], ref_context: int) -> dict:
    """Per-batch cost of one context token, from a GPU context sweep (``gpu_profile`` varlen replays of
    uniform layouts timed at their own contexts and at ``ref_context``): per ``bs`` the least-squares slope
    of ``step_ms - step_ms_ref_ctx`` on ``context_sum - bs * ref_context`` (through the origin).

    Small batches are latency-bound (one tile per request and KV head scans the context serially, so a
    token costs about ``1/bs`` of a single request's), large ones bandwidth-bound; hence one slope per bs.
    """
    by: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        dx = int(r["context_sum"]) - int(r["bs"]) * int(ref_context)
        if dx:
            by.setdefault(int(r["bs"]), []).append((dx, float(r["step_ms"]) - float(r["step_ms_ref_ctx"])))
    if not by:
        raise ValueError("context sweep: no step timed at a context other than the reference")
    bss = sorted(by)
    k = [sum(x * y for x, y in by[b]) / sum(x * x for x, _ in by[b]) for b in bss]
    return {"ref_context": int(ref_context), "bs": bss, "ms_per_context_token": k,
            "cells": sum(len(v) for v in by.values())}


@dataclass(frozen=True)
class StepClock:
    """The virtual clock: the profile's table for (bs, verify tokens), plus the cost of the requests' own
    contexts relative to the table's ``ref_context``: ``kv_ms[bs] * (sum of contexts - bs * ref_context)``,
    ``kv_ms`` interpolated over ``kv_bs`` in log2(bs) (no term: the table alone)."""

    table: object
    ref_context: int = 0
    kv_bs: tuple = ()
    kv_ms: tuple = ()
    source: str = "table"

    def kv_ms_per_token(self, bs: int) -> float:
        if not self.kv_bs:
            return 0.0
        return float(np.interp(np.log2(max(int(bs), 1)), np.log2(np.asarray(self.kv_bs, float)), self.kv_ms))

    def step_ms(self, bs: int, batch_tokens: int, context_sum: Optional[int] = None) -> float:
        ms = self.table.step_seconds(int(bs), int(batch_tokens) - int(bs)) * 1e3
        if context_sum is not None and self.kv_bs:
            ms += self.kv_ms_per_token(bs) * (int(context_sum) - int(bs) * self.ref_context)
        return ms

    @classmethod
    def from_profile(cls, table, table_path) -> "StepClock":
        """The table plus, from its provenance manifest (``<table>.manifest.json``) when present, the context
        term: the measured sweep (``context_term``) or else the analytic K/V-read bound."""
        man = Path(str(table_path) + ".manifest.json")
        if not man.is_file():
            return cls(table)
        m = json.loads(man.read_text(encoding="utf-8"))
        ct = m.get("context_term")
        if ct:
            return cls(table, int(ct["ref_context"]), tuple(ct["bs"]), tuple(ct["ms_per_context_token"]),
                       "context sweep")
        return cls(table, int(m["context_len"]), (1,), (kv_ms_per_context_token(m),), "K/V bandwidth bound")


def _errs(rows: list, key: str) -> dict:
    e = np.array([x[key] for x in rows])
    a = np.abs(e)
    return {"median_rel_err": float(np.median(a)), "p90_rel_err": float(np.quantile(a, 0.9)),
            "max_rel_err": float(a.max()), "mean_bias_rel": float(e.mean())}


def vclock_check(replays: Sequence[dict], table, clock: Optional[StepClock] = None) -> dict:
    """Virtual clock vs measured GPU step time on replayed window sets.

    ``replays``: ``gpu_profile`` replay rows (``bs``, ``batch_tokens``, ``step_ms``; from a varlen replay also
    ``context_sum`` and ``step_ms_ref_ctx``, the same step with every context at the table's). The table's
    prediction is its step time for ``bs`` requests verifying ``batch_tokens`` tokens; with ``clock`` (and
    contexts) also the context-aware clock's prediction (``rel_err_clock``). Errors are (pred - meas) / meas.
    """
    rows = []
    for r in replays:
        pred = table.step_seconds(int(r["bs"]), int(r["batch_tokens"]) - int(r["bs"])) * 1e3
        row = {**{k: r[k] for k in ("bs", "batch_tokens", "context_sum", "step_ms", "step_ms_ref_ctx") if k in r},
               "predicted_ms": pred, "rel_err": (pred - r["step_ms"]) / r["step_ms"]}
        if "step_ms_ref_ctx" in r:
            row["rel_err_ref_ctx"] = (pred - r["step_ms_ref_ctx"]) / r["step_ms_ref_ctx"]
        if clock is not None and "context_sum" in r:
            pc = clock.step_ms(r["bs"], r["batch_tokens"], r["context_sum"])
            row["predicted_clock_ms"] = pc
            row["rel_err_clock"] = (pc - r["step_ms"]) / r["step_ms"]
        rows.append(row)
    if not rows:
        raise ValueError("no replayed steps")
    out = {"steps": len(rows), **_errs(rows, "rel_err")}
    for key in ("rel_err_ref_ctx", "rel_err_clock"):
        if all(key in x for x in rows):
            out[key.removeprefix("rel_err_")] = _errs(rows, key)
    out["rows"] = rows
    return out
