"""Scoring half of ``bench/paired_grid.py``: the truth of a paired configuration, its score rows,
pooled coverage with Clopper-Pearson intervals, and the JSON + markdown report.

Why a module of its own: the grid's driver (design, runs, child processes) and the arithmetic that
turns estimates into coverage are read and changed apart; this half imports no acceptscope code, so a
"before" and an "after" estimator tree are scored by the same arithmetic.

Units: mean ceiling in drafts per block (``ceiling``, 0..gamma), utilization =
``sum(correct + 1) / sum(ceiling + 1)`` over the compact run's blocks (the estimator's definition,
``estimators/utilization.py``). The audit sampling inference reports accept-length units
(``ceiling + 1``); it is shifted by 1 here.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Optional

import duckdb
import numpy as np
from scipy.stats import beta

# the key sets the estimate JSON may carry its model-free bounds under (the estimator adds them; the
# scorer reads whichever it finds and reports "contains truth" for them)
BOUND_KEY = re.compile(r"bound|identified", re.I)
LO_KEYS = ("lo", "lower", "min", "floor", "low")
HI_KEYS = ("hi", "upper", "max", "ceiling_hi", "high")


# ---------------------------------------------------------------------------------------------- truth
def _steps(db: str, run: str, cols: str) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute(f"SELECT rid, step_index, {cols} FROM request_steps WHERE run_id = ? "
                           "ORDER BY rid, step_index", [run]).fetchall()


def paired_truth(compact_db: str, truth_db: str, compact_run: str = "c", truth_run: str = "k",
                 eos: Iterable[int] = ()) -> dict:
    """The truth of a compact run from the cap-accept run of the same seed, block by block.

    Checks the pairing the grid rests on (same blocks, same windows, same accepted drafts, same
    committed tokens) and returns the mean ceiling (raw, and cut at the first EOS draft: drafts past
    an accepted EOS could never be committed), the utilization and the censoring counts."""
    c = _steps(compact_db, compact_run, '"window", correct_drafts, committed_tokens, draft_tokens')
    k = {(r[0], r[1]): r[2:] for r in _steps(truth_db, truth_run,
                                              '"window", correct_drafts, committed_tokens, ceiling')}
    eos = set(int(e) for e in eos)
    ceil, ceil_eos, corr, win = [], [], [], []
    mismatch = missing = 0
    gamma = 0
    for rid, si, w, cd, com, drafts in c:
        t = k.get((rid, si))
        if t is None or t[3] is None:
            missing += 1
            continue
        if (t[0], t[1], list(t[2] or [])) != (w, cd, list(com or [])):
            mismatch += 1
        K = int(t[3])
        gamma = max(gamma, len(drafts or []))
        cut = next((i + 1 for i, d in enumerate(drafts or []) if d in eos), None)
        ceil.append(K)
        ceil_eos.append(K if cut is None else min(K, cut))
        corr.append(cd)
        win.append(w)
    if not ceil:
        raise ValueError(f"{compact_db}: no compact block pairs with {truth_db}")
    ceil, ceil_eos, corr, win = (np.asarray(v, float) for v in (ceil, ceil_eos, corr, win))
    censored = (corr >= win) & (win < gamma)
    return {"n_blocks": int(len(ceil)), "n_censored": int(censored.sum()),
            "n_trimmed_tail": int((ceil > corr).sum()),
            "mean_ceiling": float(ceil.mean()), "mean_ceiling_eos": float(ceil_eos.mean()),
            "utilization": float((corr + 1).sum() / (ceil + 1).sum()),
            "utilization_eos": float((corr + 1).sum() / (ceil_eos + 1).sum()),
            "mean_window": float(win.mean()), "gamma": int(gamma),
            "pair_mismatch": int(mismatch), "pair_missing": int(missing), "truth_only": int(len(k) - (len(c) - missing))}


# ------------------------------------------------------------------------------------------ estimates
def _num(x) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _siblings(obj: dict, path: str, want=None) -> list[dict]:
    """``<name>_lo`` / ``<name>_hi`` pairs of one dict (``want``: a pattern the name must match)."""
    out = []
    for key in obj:
        m = re.match(r"(.*?)_?(lo|lower|min)$", str(key), re.I)
        if not m or _num(obj[key]) is None or (want is not None and not want.search(m.group(1))):
            continue
        for hk in (m.group(1) + s for s in ("_hi", "_upper", "_max", "hi", "upper", "max")):
            if hk in obj and _num(obj[hk]) is not None:
                name = m.group(1) or path.rsplit(".", 1)[-1]
                out.append({"path": f"{path}.{name}" if m.group(1) else path, "lo": _num(obj[key]), "hi": _num(obj[hk])})
                break
    return out


def find_bounds(obj: Any, path: str = "") -> list[dict]:
    """Every (lo, hi) pair the estimate JSON holds under a key that says bounds / identified.

    The format is the estimator's to choose; this accepts a dict with lo/hi-like keys, a
    two-number list, or ``<name>_lo`` / ``<name>_hi`` siblings (under such a key, or named so
    themselves), and names each by its JSON path."""
    out: list[dict] = []
    if isinstance(obj, dict):
        for key, v in obj.items():
            p = f"{path}.{key}" if path else str(key)
            if BOUND_KEY.search(str(key)):
                out.extend(_pairs(v, p))
            elif isinstance(v, (dict, list)):
                out.extend(find_bounds(v, p))
        out.extend(_siblings(obj, path, BOUND_KEY))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(find_bounds(v, f"{path}[{i}]"))
    return out


def _pairs(v: Any, path: str) -> list[dict]:
    if isinstance(v, list) and len(v) == 2 and all(_num(x) is not None for x in v):
        return [{"path": path, "lo": _num(v[0]), "hi": _num(v[1])}]
    if isinstance(v, dict):
        lo = next((_num(v[k]) for k in LO_KEYS if k in v and _num(v[k]) is not None), None)
        hi = next((_num(v[k]) for k in HI_KEYS if k in v and _num(v[k]) is not None), None)
        if lo is not None and hi is not None:
            return [{"path": path, "lo": lo, "hi": hi}]
        out = _siblings(v, path)
        for k, x in v.items():
            if isinstance(x, (dict, list)):
                out.extend(_pairs(x, f"{path}.{k}"))
        return out
    if isinstance(v, list):
        return [p for i, x in enumerate(v) for p in _pairs(x, f"{path}[{i}]")]
    return []


def bound_target(path: str) -> Optional[str]:
    """Which truth a bound speaks of, from its JSON path (its own name first, then where it sits):
    utilization, accept length, or mean ceiling (drafts)."""
    for part in (path.lower().rsplit(".", 1)[-1], path.lower()):
        if "util" in part:
            return "utilization"
        if "accept_len" in part:
            return "accept_length"
        if any(w in part for w in ("ceiling", "tail", "aggregate")):
            return "mean_ceiling"
    return None


def headline(est: dict) -> dict:
    """What the grid scores in one run's estimate JSON: the run-level mean ceiling and utilization
    intervals, the censoring summary and the model-free bounds (when the estimator gives any)."""
    tail = est["tail"]
    a = tail["aggregate"][0]
    u = next(x for x in est["utilization"]["by_group"] if x["by"] == "run")
    s = tail.get("summary", {})
    out = {"est": a["mean_ceiling"], "lo": a["lo"], "hi": a["hi"],
           "util": u["utilization"], "util_lo": u.get("util_lo", u["utilization"]),
           "util_hi": u.get("util_hi", u["utilization"]),
           "n_censored": s.get("n_censored"), "n_unresolved": s.get("n_unresolved"),
           "bounds": find_bounds({"tail": tail, "utilization": {"run": u}})}
    notes = [n for n in s.get("notes", []) if isinstance(n, str)]
    out["hazard_note"] = next((n for n in notes if n.startswith("hazards")), "")
    advice = [v for k, v in tail.items() if "advice" in k.lower() or "audit" in k.lower()]
    if advice:
        out["advice"] = advice[0]
    return out


def score(truth: dict, h: dict, truth_key: str = "mean_ceiling") -> dict:
    """Coverage and width of one estimate's intervals (and its bounds) against the truth."""
    t, tu = truth[truth_key], truth["utilization" + truth_key.removeprefix("mean_ceiling")]
    row = {"truth": t, "est": h["est"], "lo": h["lo"], "hi": h["hi"], "width": h["hi"] - h["lo"],
           "bias": h["est"] - t, "covers": bool(h["lo"] - 1e-9 <= t <= h["hi"] + 1e-9),
           "truth_util": tu, "util": h["util"], "util_lo": h["util_lo"], "util_hi": h["util_hi"],
           "util_width": h["util_hi"] - h["util_lo"],
           "util_covers": bool(h["util_lo"] - 1e-9 <= tu <= h["util_hi"] + 1e-9)}
    bounds = []
    for b in h.get("bounds", []):
        tgt = bound_target(b["path"])
        if tgt is None:
            continue
        tv = {"utilization": tu, "mean_ceiling": t, "accept_length": t + 1}[tgt]
        bounds.append({**b, "target": tgt, "truth": tv, "contains": bool(b["lo"] - 1e-9 <= tv <= b["hi"] + 1e-9)})
    row["bounds"] = bounds
    if bounds:
        row["bounds_contain"] = all(b["contains"] for b in bounds)
    return row


def score_sampling(truth: dict, si: dict, truth_key: str = "mean_ceiling") -> dict:
    """The audit sampling inference (accept-length units) scored in drafts per block."""
    t, tu = truth[truth_key], truth["utilization" + truth_key.removeprefix("mean_ceiling")]
    c, u = si["ceiling"], si["utilization"]
    lo, hi = c["lo"] - 1, c["hi"] - 1
    return {"est": c["estimate"] - 1, "lo": lo, "hi": hi, "width": hi - lo, "bias": c["estimate"] - 1 - t,
            "covers": bool(lo - 1e-9 <= t <= hi + 1e-9), "util": u["estimate"], "util_lo": u["lo"], "util_hi": u["hi"],
            "util_covers": bool(u["lo"] - 1e-9 <= tu <= u["hi"] + 1e-9), "n_audited": si["n_audited"],
            "n_requests": si["n_requests"], "method": si["method"], "n_with_tail": si["n_with_tail"]}


# ------------------------------------------------------------------------------------------ pooling
def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for a coverage rate k/n."""
    if n == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def pooled(flags: list[bool]) -> dict:
    k, n = int(sum(bool(f) for f in flags)), len(flags)
    lo, hi = clopper_pearson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else float("nan"), "cp_lo": lo, "cp_hi": hi}


def median(v) -> Optional[float]:
    v = [x for x in v if x is not None and math.isfinite(x)]
    return float(np.median(v)) if v else None


AUDIT_BINS = (0, 8, 16, 32, 64, 128, 256, 512, 1 << 30)


def width_curve(points: list[dict]) -> dict:
    """Interval width against the number of audited requests: medians per bin and the fitted
    ``width = c / sqrt(n)`` (least squares on log width; the audit-size advice rests on it)."""
    out = {}
    for kind in ("tail", "sampling"):
        pts = [(p["n_audited"], p[kind]["width"]) for p in points
               if p.get(kind) and p[kind].get("width") is not None and p[kind]["width"] > 0 and p["n_audited"] > 0]
        rows = []
        for a, b in zip(AUDIT_BINS[:-1], AUDIT_BINS[1:]):
            w = [x for n, x in pts if a < n <= b]
            if w:
                rows.append({"audited": f"{a + 1}-{b}" if b < (1 << 30) else f">{a}", "n": len(w),
                             "median_width": median(w)})
        fit = None
        if len(pts) >= 3:
            n = np.array([p[0] for p in pts], float)
            w = np.array([p[1] for p in pts], float)
            c = float(np.exp(np.mean(np.log(w) + 0.5 * np.log(n))))
            slope = float(np.polyfit(np.log(n), np.log(w), 1)[0])
            fit = {"c": c, "free_slope": slope, "n_for_width_0.16": (c / 0.16) ** 2, "n_for_width_0.10": (c / 0.10) ** 2}
        out[kind] = {"bins": rows, "fit": fit}
    return out


def summarize(rows: list[dict], fractions: Iterable[float]) -> dict:
    """Pooled coverage and widths over the scoring configurations (the grid's headline)."""
    ok = [r for r in rows if r.get("compact") and "error" not in r["compact"]]
    c = [r["compact"] for r in ok]
    out = {"configs": len(rows), "scored": len(ok),
           "errors": sorted({r["compact"]["error"] for r in rows if r.get("compact") and "error" in r["compact"]}),
           "compact": {"mean_ceiling": pooled([x["covers"] for x in c]),
                       "utilization": pooled([x["util_covers"] for x in c]),
                       "median_width": median([x["width"] for x in c]),
                       "median_abs_bias": median([abs(x["bias"]) for x in c]),
                       "median_util_width": median([x["util_width"] for x in c])}}
    withb = [x for x in c if "bounds_contain" in x]
    out["compact"]["bounds"] = pooled([x["bounds_contain"] for x in withb]) if withb else None
    out["by_factor"] = by_factor(rows)
    aud = {}
    for f in fractions:
        pts = [a for r in ok for a in r.get("audits", []) if abs(a["fraction"] - f) < 1e-9]
        # an estimate that raised is a finding, not a gap: counted, with its message
        errs = [a["error"] for a in pts if "error" in a]
        entry = {"n": len(pts), "errors": len(errs), "error_messages": sorted(set(errs))}
        for kind in ("tail", "sampling"):
            s = [a[kind] for a in pts if a.get(kind) and "error" not in a[kind]]
            entry[kind] = {"mean_ceiling": pooled([x["covers"] for x in s]),
                           "utilization": pooled([x["util_covers"] for x in s]),
                           "median_width": median([x["width"] for x in s]),
                           "median_audited": median([a["n_audited"] for a in pts if "error" not in a])} if s else None
        aud[f"{f:g}"] = entry
    out["audit"] = aud
    out["width_curve"] = width_curve([a for r in ok for a in r.get("audits", [])])
    return out


def _level(cfg: dict, factor: str) -> str:
    if factor == "temperature":
        t = cfg["temperature"]
        return "0.3-0.5" if t < 0.5 else "0.5-0.7" if t < 0.7 else "0.7-0.85" if t < 0.85 else "0.85-1.0"
    if factor == "workload":
        return "mixed" if "mixed" in cfg["workload"] else "file" if cfg["workload"].startswith("file:") else "built-in"
    if factor == "sts":
        return "on" if cfg["sts"] else "off"
    if factor == "cost_profile":
        return "on" if cfg["cost_profile"] else "off"
    return str(cfg[factor])


def by_factor(rows: list[dict]) -> list[dict]:
    """Compact-alone coverage and bias per level of each design factor (where the misses sit)."""
    out = []
    ok = [r for r in rows if r.get("compact") and "error" not in r["compact"]]
    for factor in ("temperature", "batch", "workload", "sts", "cost_profile"):
        levels: dict = {}
        for r in ok:
            levels.setdefault(_level(r["config"], factor), []).append(r["compact"])
        for lev, cs in sorted(levels.items(), key=lambda kv: (len(kv[0]), kv[0])):
            out.append({"factor": factor, "level": lev, "mean_ceiling": pooled([c["covers"] for c in cs]),
                        "utilization": pooled([c["util_covers"] for c in cs]),
                        "median_bias": median([c["bias"] for c in cs]), "median_width": median([c["width"] for c in cs])})
    return out


# ------------------------------------------------------------------------------------------ markdown
def _f(x, d: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{d}f}"


def _cov(p: Optional[dict]) -> str:
    if not p or not p["n"]:
        return "-"
    return f"{p['k']}/{p['n']} = {p['rate']:.0%} [{p['cp_lo']:.0%}, {p['cp_hi']:.0%}]"


def _md_escape(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def markdown(report: dict) -> str:
    """The report's tables as markdown (pooled, per configuration, audit fractions, width curve)."""
    s, meta = report["summary"], report["meta"]
    L = [f"## Paired grid: split `{meta['split']}`, estimator `{_md_escape(meta['estimator'])}`", "",
         f"- engine commit `{meta['engine_commit'][:12]}`; {s['scored']} of {s['configs']} configurations scored; "
         f"seeds {meta['seeds'][0]}..{meta['seeds'][-1]} (split `{meta['split']}`; the other split's seeds: "
         f"{meta['other_split_seeds'][0]}..{meta['other_split_seeds'][-1]}, disjoint)",
         f"- truth: `{meta['truth_key']}`; this call: generation {meta['timing'].get('generate_s', 0):.0f} s, "
         f"estimates {meta['timing'].get('score_s', 0):.0f} s; the cached runs took "
         f"{meta['timing'].get('generate_cached_total_s', 0):.0f} s to generate; one compact estimate "
         f"{_f(meta['timing'].get('estimate_compact_median_s'), 1)} s (median)",
         f"- command: `{_md_escape(meta['command'])}`", "",
         "| compact alone (95% intervals) | coverage [Clopper-Pearson 95%] | median width |", "|---|---|---|",
         f"| mean ceiling (drafts) | {_cov(s['compact']['mean_ceiling'])} | {_f(s['compact']['median_width'])} |",
         f"| utilization | {_cov(s['compact']['utilization'])} | {_f(s['compact']['median_util_width'])} |",
         f"| model-free bounds contain truth | {_cov(s['compact']['bounds']) if s['compact']['bounds'] else 'not in the estimate JSON'} | |",
         "", "| audit fraction | audited (median) | estimates that failed | tail w/ audit hazards: coverage | width | "
         "sampling inference: coverage | width |", "|---|---|---|---|---|---|---|"]
    for f, e in s["audit"].items():
        t, sp = e.get("tail"), e.get("sampling")
        L.append(f"| {float(f):.0%} | {_f((t or sp or {}).get('median_audited'), 0)} | {e.get('errors', 0)} of {e['n']} | "
                 f"{_cov(t['mean_ceiling']) if t else '-'} | {_f(t['median_width']) if t else '-'} | "
                 f"{_cov(sp['mean_ceiling']) if sp else '-'} | {_f(sp['median_width']) if sp else '-'} |")
    msgs = sorted({m for e in s["audit"].values() for m in e.get("error_messages", [])})
    L += [f"\nfailed audited estimate: {_md_escape(m)}" for m in msgs]
    L += ["", "| audited requests | tail w/ audit hazards: median width (n) | sampling inference: median width (n) |",
          "|---|---|---|"]
    wc = s["width_curve"]
    bins = {b["audited"]: [b, None] for b in wc["tail"]["bins"]}
    for b in wc["sampling"]["bins"]:
        bins.setdefault(b["audited"], [None, None])[1] = b
    for k, (a, b) in bins.items():
        L.append(f"| {k} | {_f(a and a['median_width'])} ({a['n'] if a else 0}) | "
                 f"{_f(b and b['median_width'])} ({b['n'] if b else 0}) |")
    for kind in ("tail", "sampling"):
        fit = wc[kind]["fit"]
        if fit and -0.8 <= fit["free_slope"] <= -0.2:
            L.append(f"\n{kind}: width ~ {fit['c']:.2f}/sqrt(audited) (free log-log slope {fit['free_slope']:.2f}); "
                     f"±0.08 drafts (width 0.16) needs ~{fit['n_for_width_0.16']:.0f} audited requests")
        elif fit:
            L.append(f"\n{kind}: across configurations the width does not fall as 1/sqrt(audited) (free log-log "
                     f"slope {fit['free_slope']:.2f}): no audit-size reading from the pooled points")
    vol = [r for r in report["rows"] if r["config"].get("kind") == "volume" and r.get("audits")]
    for r in vol:
        cf, c = r["config"], r.get("compact") or {}
        alone = (f"; compact alone {_f(c['est'])} [{_f(c['lo'])}, {_f(c['hi'])}], {'covers' if c['covers'] else '**misses**'}"
                 if "est" in c else "")
        L += ["", f"Large traffic ({_md_escape(cf['workload'])}, T = {cf['temperature']}, batch {cf['batch']}, "
              f"{cf['n_requests']} requests; truth {_f((r.get('truth') or {}).get('mean_ceiling'))}{alone}): the same "
              "traffic audited at each fraction", "",
              "| fraction | audited | tail w/ audit hazards [95%] | width | covers | sampling inference [95%] | width | covers |",
              "|---|---|---|---|---|---|---|---|"]
        for a in r["audits"]:
            t, sp = a.get("tail") or {}, a.get("sampling") or {}
            L.append(f"| {a['fraction']:.0%} | {a['n_audited']} | "
                     + (f"{_f(t['est'])} [{_f(t['lo'])}, {_f(t['hi'])}] | {_f(t['width'])} | {'yes' if t['covers'] else '**no**'} | "
                        if t else f"{_md_escape(a.get('error', '-'))[:60]} | | | ")
                     + (f"{_f(sp['est'])} [{_f(sp['lo'])}, {_f(sp['hi'])}] | {_f(sp['width'])} | {'yes' if sp['covers'] else '**no**'} |"
                        if sp else "- | | |"))
    if s.get("by_factor"):
        L += ["", "| compact alone, by factor | level | mean ceiling covered | utilization covered | median bias | "
              "median width |", "|---|---|---|---|---|---|"]
        L += [f"| {x['factor']} | {x['level']} | {_cov(x['mean_ceiling'])} | {_cov(x['utilization'])} | "
              f"{_f(x['median_bias'], 3)} | {_f(x['median_width'])} |" for x in s["by_factor"]]
    L += ["", "| # | seed | workload | T | batch | STS | profile | blocks | censored | truth | estimate [95%] | width | "
          "cov | truth util | util [95%] | cov | bounds |", "|" + "---|" * 17]
    for r in report["rows"]:
        c, cf, t = r.get("compact") or {}, r["config"], r.get("truth") or {}
        if "error" in c or not c:
            L.append(f"| {cf['index']} | {cf['seed']} | {_md_escape(cf['workload'])} | {cf['temperature']:.2f} | "
                     f"{cf['batch']} | | | | | | error: {_md_escape(c.get('error', 'not scored'))[:80]} |" + " |" * 6)
            continue
        L.append(f"| {cf['index']} | {cf['seed']} | {_md_escape(cf['workload'])} | {cf['temperature']:.2f} | {cf['batch']} | "
                 f"{'on' if cf['sts'] else 'off'} | {cf['cost_profile'] or 'off'} | {t['n_blocks']} | "
                 f"{t['n_censored'] / t['n_blocks']:.0%} | {_f(c['truth'])} | {_f(c['est'])} [{_f(c['lo'])}, {_f(c['hi'])}] | "
                 f"{_f(c['width'])} | {'yes' if c['covers'] else '**no**'} | {_f(c['truth_util'])} | "
                 f"{_f(c['util'])} [{_f(c['util_lo'])}, {_f(c['util_hi'])}] | {'yes' if c['util_covers'] else '**no**'} | "
                 f"{('yes' if c['bounds_contain'] else '**no**') if 'bounds_contain' in c else '-'} |")
    return "\n".join(L) + "\n"


def dumps(report: dict) -> str:
    return json.dumps(report, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))


def crossfit_markdown(cf: dict) -> str:
    """The hidden-ceiling cross-fit (``estimators.validation``) as a short table."""
    if "error" in cf:
        return f"\n### Hidden-ceiling cross-fit\n\nfailed: {_md_escape(cf['error'])}\n"
    L = ["", f"### Hidden-ceiling cross-fit ({cf['runs']} cap-accept runs of this split, {_f(cf.get('seconds'), 0)} s)", "",
         "| mode | unresolved blocks | cov90 (unresolved) | ecov90 | bias (unresolved) |", "|---|---|---|---|---|"]
    for m in cf.get("per_mode") or []:
        L.append(f"| {m['mode']} | {m.get('n_unresolved', '-')} | {_f(m.get('cov90_unresolved'))} | "
                 f"{_f(m.get('ecov90_unresolved'))} | {_f(m.get('bias_unresolved'))} |")
    L += ["", "| aggregate 95% groups | covered [Clopper-Pearson 95%] |", "|---|---|",
          f"| all groups | {_cov(cf['aggregate_all_groups'])} |"]
    L += [f"| by {_md_escape(k)} | {_cov(v)} |" for k, v in cf["aggregate_by"].items()]
    return "\n".join(L) + "\n"
