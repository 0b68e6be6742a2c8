"""STS (Sequential Temperature Scaling) fitting, held-out comparison and SGLang-loadable export.

SGLang applies ``c_k = sigmoid(z_k / T_k)`` to the confidence head's logit and schedules on
the survival ``S_k = prod_{j<=k} c_j``; a table is a vector of per-position temperatures.
Three ways to fit it:

* ``sequential-ece``: the paper's and SGLang's ``dspark_sts_fit``: positions left to right,
  each ``T_k`` from a 41-point log grid on [0.1, 10] minimising the 15-bin equal-width ECE
  of the cumulative survival against the prefix label, earlier temperatures frozen, ties
  keeping the smallest ``T`` (reimplemented from the published description, vectorised
  over the grid);
* ``smooth-nll`` / ``smooth-brier``: a proper scoring rule (NLL or Brier of the survival)
  minimised over ``log T_k`` with a continuous bounded optimiser, sequentially (default)
  or jointly over all positions.

Labels: ``realized`` (from truth-bearing runs: position ``k`` reached past iff
``k < ceiling``; for sampled traffic this is the acceptance the scheduler actually
needs) or ``greedy`` (SGLang's STS collector label: the greedy argmax-match prefix,
from ``sts_samples``). Every result names its label. Fit on one split, score on another:
:func:`compare` reports per-position ECE (equal-width, equal-mass, debiased), Brier, NLL
and AUROC with request-clustered bootstrap CIs, before and after, for each method.

Example::

    >>> from acceptscope.estimators.synthetic import simulate
    >>> from acceptscope.estimators.calibration import calibration_data, StsCalibrator
    >>> d = calibration_data(simulate(n_requests=60, seed=6).tables["request_steps"])
    >>> cal = StsCalibrator("smooth-nll").fit(d.z, d.y)
    >>> len(cal.temperatures_) == d.z.shape[1] and all(t > 0 for t in cal.temperatures_)
    True
    >>> import msgspec, json
    >>> doc = json.loads(cal.to_sglang_json(dataset="demo", label=d.label))
    >>> sorted(k for k in doc if not k.startswith("acceptscope"))
    ['dataset', 'ece_after', 'ece_before', 'num_samples', 'temperatures']
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

import msgspec
import numpy as np
import pandas as pd

from acceptscope.domain.sts import sts_problem
from acceptscope.estimators.bootstrap import row_request_keys
from acceptscope.estimators.calibration_metrics import PositionScorer, ece, ece_rows, reliability_table
from acceptscope.estimators.frame import BlockFrame, padded

METHODS = ("sequential-ece", "smooth-nll", "smooth-brier")
STEP_BLOCK_ROWS = 32  # rows of an STS shard held out together when it has no request ids
LOG_T_BOUNDS = (math.log(0.05), math.log(20.0))


def sglang_grid() -> np.ndarray:
    """``torch.logspace(log10(0.1), log10(10), 41)`` in float64."""
    return np.logspace(-1.0, 1.0, 41)


def _sig(x):
    """``0.5 * (1 + tanh(x / 2))`` in one array (the same operations in the same order, so the same bits):
    the grid fit scores 41 temperatures a position, and three temporaries of that size cost 40% more."""
    y = np.multiply(x, 0.5, dtype=np.float64)
    np.tanh(y, out=y)
    y += 1.0
    y *= 0.5
    return y


def survival(z: np.ndarray, temperatures) -> np.ndarray:
    """Cumulative survival ``prod_j sigmoid(z_j / T_j)``."""
    T = np.asarray(temperatures, float)[None, :]
    return np.cumprod(_sig(z / T), 1)


def _grid_ece(prev: np.ndarray, zk: np.ndarray, yk: np.ndarray, grid: np.ndarray, nb: int) -> np.ndarray:
    """SGLang's ECE for every grid temperature at once."""
    # (the survival is this call's scratch: ece_rows clamps it in place, no copy beside it)
    return ece_rows(_scaled(_sig(zk[None, :] / grid[:, None]), prev[None, :]), yk, nb, overwrite=True)


def _scaled(a: np.ndarray, b) -> np.ndarray:
    """``b * a`` into ``a`` (the same bits: multiplication commutes)."""
    a *= b
    return a


def fit_grid(z: np.ndarray, y: np.ndarray, grid: np.ndarray | None = None, num_bins: int = 15) -> dict:
    """Sequential grid fit (SGLang ``fit_sts_temperatures`` semantics)."""
    grid = sglang_grid() if grid is None else np.asarray(grid, float)
    n, G = z.shape
    if n == 0:
        raise ValueError("STS fit needs at least one sample")
    prev_one = np.ones(n)
    prev_fit = np.ones(n)
    T, before, after = [], [], []
    for k in range(G):
        prev_one = prev_one * _sig(z[:, k])
        before.append(ece(prev_one, y[:, k], num_bins))
        e = _grid_ece(prev_fit, z[:, k], y[:, k], grid, num_bins)
        i = int(np.argmin(e))  # first minimum == strict '<' over an ascending grid
        T.append(float(grid[i]))
        after.append(float(e[i]))
        prev_fit = prev_fit * _sig(z[:, k] / grid[i])
    return dict(temperatures=T, ece_before=before, ece_after=after)


def _loss(p, y, kind):
    p = np.clip(p, 1e-12, 1 - 1e-12)
    if kind == "nll":
        return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())
    return float(((p - y) ** 2).mean())


def fit_smooth(z: np.ndarray, y: np.ndarray, loss: str = "nll", sequential: bool = True, num_bins: int = 15) -> dict:
    """Continuous fit of ``log T_k`` minimising NLL or Brier of the cumulative survival."""
    from scipy.optimize import minimize, minimize_scalar  # (lazy: tests/test_layers.py LAZY_IMPORTS)

    n, G = z.shape
    lo, hi = LOG_T_BOUNDS
    if sequential:
        prev = np.ones(n)
        T = []
        for k in range(G):
            zk, yk = z[:, k], y[:, k]
            r = minimize_scalar(lambda lt: _loss(prev * _sig(zk / math.exp(lt)), yk, loss), bounds=(lo, hi),
                                method="bounded", options=dict(xatol=1e-5))
            T.append(float(math.exp(r.x)))
            prev = prev * _sig(zk / T[-1])
    else:
        def obj(lt):
            S = survival(z, np.exp(lt))
            return sum(_loss(S[:, k], y[:, k], loss) for k in range(G))

        r = minimize(obj, np.zeros(G), method="L-BFGS-B", bounds=[LOG_T_BOUNDS] * G)
        T = [float(t) for t in np.exp(r.x)]
    S0 = np.cumprod(_sig(z), 1)
    S1 = survival(z, T)
    return dict(temperatures=T, ece_before=[ece(S0[:, k], y[:, k], num_bins) for k in range(G)],
                ece_after=[ece(S1[:, k], y[:, k], num_bins) for k in range(G)])


@dataclass
class CalData:
    """Confidence logits ``z`` (n, G), prefix labels ``y`` (n, G), request groups, label kind."""

    z: np.ndarray
    y: np.ndarray
    groups: np.ndarray | None
    label: str
    notes: list[str] = field(default_factory=list)

    def split(self, frac: float = 0.5, seed: int = 0) -> tuple["CalData", "CalData"]:
        """Split by request (or row when anonymous)."""
        rng = np.random.default_rng(seed)
        g = self.groups if self.groups is not None else np.arange(len(self.z))
        codes, uniq = pd.factorize(g)
        a = rng.random(len(uniq)) < frac
        m = a[codes]
        mk = lambda s: CalData(self.z[s], self.y[s], None if self.groups is None else self.groups[s], self.label, self.notes)
        return mk(m), mk(~m)


def calibration_data(data, label: str = "realized", sts_samples: pd.DataFrame | None = None,
                     temperatures=None, gamma: int | None = None) -> CalData:
    """Build (logits, labels) from ``request_steps`` (``label='realized'``) or ``sts_samples`` (``'greedy'``)."""
    if label == "greedy":
        if sts_samples is None or len(sts_samples) == 0:
            raise ValueError("label 'greedy' needs sts_samples rows (SGLang STS collector shards)")
        s = sts_samples
        if "label_kind" in s:
            s = s[s["label_kind"].fillna("greedy-argmax") == "greedy-argmax"]
        G = gamma or int(max(len(x) for x in s["logits"]))
        z = padded(s["logits"], G)
        y = padded(s["prefix_mask"], G)
        ok = np.isfinite(z).all(1) & np.isfinite(y).all(1)
        notes = [f"greedy argmax-match label from sts_samples ({len(s)} rows)"]
        if (~ok).any():
            notes.append(f"dropped {(~ok).sum()} rows with non-finite logits/labels")
        groups = None
        if {"shard", "row_index"} <= set(s.columns):
            # no request id in SGLang's shards: hold out contiguous stretches (whole decode steps, mostly)
            groups = (s["shard"].to_numpy(np.int64) << 32) + s["row_index"].to_numpy(np.int64) // STEP_BLOCK_ROWS
            notes.append(f"STS shards carry no request or step id: held-out split by contiguous blocks of "
                         f"{STEP_BLOCK_ROWS} rows (whole decode steps, mostly), not by request")
        return CalData(z[ok], y[ok], None if groups is None else groups[ok], "greedy", notes)
    if label != "realized":
        raise ValueError(f"label must be 'realized' or 'greedy', got {label!r}")
    frame = data if isinstance(data, BlockFrame) else BlockFrame.from_request_steps(data, gamma=gamma)
    m = frame.has_truth
    if not m.any():
        raise ValueError("label 'realized' needs request-steps with a ceiling (a cap-accept or static run)")
    z, note = frame.logits(temperatures)
    k = np.arange(frame.gamma)[None, :]
    y = (k < frame.ceiling[:, None]).astype(float)
    ok = m & np.isfinite(z).all(1)
    notes = [note, f"realized label: position k reached past iff k < ceiling ({ok.sum()} request-steps)"]
    # groups: the stable (run_id, rid) key, as the streamed and Spark paths tag their rows
    keys = row_request_keys(frame.df["run_id"], frame.df["rid"])
    return CalData(z[ok], y[ok], keys[ok], "realized", notes)


class StsCalibrator:
    """Per-position temperatures; ``method`` in :data:`METHODS`; scikit-learn-like ``fit``/``predict``."""

    def __init__(self, method: str = "smooth-nll", sequential: bool = True, num_bins: int = 15):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.method, self.sequential, self.num_bins = method, sequential, num_bins

    def fit(self, z: np.ndarray, y: np.ndarray) -> "StsCalibrator":
        if self.method == "sequential-ece":
            r = fit_grid(z, y, num_bins=self.num_bins)
        else:
            r = fit_smooth(z, y, loss=self.method.split("-")[1], sequential=self.sequential, num_bins=self.num_bins)
        self.temperatures_ = r["temperatures"]
        self.ece_before_, self.ece_after_ = r["ece_before"], r["ece_after"]
        self.num_samples_ = int(len(z))
        return self

    def predict(self, z: np.ndarray) -> np.ndarray:
        """Calibrated cumulative survival."""
        return survival(z, self.temperatures_)

    def to_sglang_json(self, dataset: str = "", label: str = "realized", extra: dict | None = None) -> str:
        """SGLang ``DSparkStsCalibration`` JSON plus an ``acceptscope`` metadata object (ignored by
        SGLang's msgspec decode). All numbers finite."""
        fin = lambda xs: [float(x) if np.isfinite(x) else 0.0 for x in xs]
        doc = {"temperatures": [float(t) for t in self.temperatures_], "dataset": dataset,
               "num_samples": int(self.num_samples_), "ece_before": fin(self.ece_before_),
               "ece_after": fin(self.ece_after_),
               "acceptscope": {"method": self.method, "label": label, "sequential": self.sequential,
                               "num_bins": self.num_bins, **(extra or {})}}
        text = json.dumps(doc, allow_nan=False)
        if '"bias_seconds"' in text:
            raise ValueError("STS metadata must not contain the SGLang SPS selector string")
        return text


def check_sglang_sts(text: str, gamma: int | None = None) -> list[float]:
    """Decode with SGLang 0.5.23's rules (msgspec struct, unknown keys ignored, T > 0, length gamma)."""

    class _Sts(msgspec.Struct, frozen=True):
        temperatures: list[float]
        dataset: str = ""
        num_samples: int = 0
        ece_before: list[float] = []
        ece_after: list[float] = []

    obj = msgspec.json.decode(text.encode(), type=_Sts)
    problem = sts_problem(list(obj.temperatures), gamma)
    if problem:
        raise ValueError(f"field {problem[0]}: {problem[1]}")
    return obj.temperatures


@dataclass
class CalibrationResult:
    """Held-out comparison of STS fits (``metrics`` long by method/stage/position)."""

    label: str
    metrics: pd.DataFrame
    temperatures: dict
    reliability: pd.DataFrame
    fit_seconds: dict
    n_train: int
    n_test: int
    notes: list[str] = field(default_factory=list)

    def summary(self) -> pd.DataFrame:
        """Count-weighted mean over positions per method and stage."""
        m = self.metrics
        cols = ["ece", "ece_mass", "ece_debiased", "brier", "nll", "auroc"]
        return m.groupby(["method", "stage"]).apply(
            lambda g: pd.Series({c: np.average(g[c], weights=g["n"]) for c in cols}), include_groups=False).reset_index()

    def to_json(self) -> dict:
        return dict(label=self.label, n_train=self.n_train, n_test=self.n_test, temperatures=self.temperatures,
                    fit_seconds=self.fit_seconds, summary=self.summary().to_dict("records"),
                    metrics=self.metrics.to_dict("records"), notes=self.notes)


SCORES = ("ece", "brier", "nll")  # held-out scores a table may be chosen by (lower is better)


def choose(result: CalibrationResult, candidates=METHODS, score: str = "ece") -> dict:
    """Pick the best of ``candidates`` (fits one may write) by held-out ``score`` and name the table it must
    beat: the one in force (``extra_fits["in-force"]``), else identity (SGLang without a table).

    Why: a fit can score worse on held-out data than what the server already runs; the caller writes the
    choice only when ``better`` (or when told to anyway) and shows ``rows``, every table ranked.
    """
    if score not in SCORES:
        raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    s = result.summary().set_index("method")
    cols = ("ece", "ece_mass", "ece_debiased", "brier", "nll", "auroc")
    rows = sorted(({"method": m, "stage": s.loc[m, "stage"], **{c: float(s.loc[m, c]) for c in cols}}
                   for m in s.index), key=lambda r: r[score])
    baseline = "in-force" if "in-force" in s.index else "identity"
    best = min(candidates, key=lambda m: s.loc[m, score])
    best_score, base_score = float(s.loc[best, score]), float(s.loc[baseline, score])
    return {"score": score, "best": best, "best_score": best_score, "baseline": baseline,
            "baseline_score": base_score, "better": best_score <= base_score, "rows": rows}


def compare(train: CalData, test: CalData, methods=METHODS, n_boot: int = 200, seed: int = 0,
            extra_fits: dict | None = None) -> CalibrationResult:
    """Fit each method on ``train``, score before/after on ``test`` (the same label)."""
    temps, secs = {}, {}
    for m in methods:
        t0 = time.perf_counter()
        temps[m] = StsCalibrator(m).fit(train.z, train.y).temperatures_
        secs[m] = time.perf_counter() - t0
    for name, T in (extra_fits or {}).items():
        temps[name] = list(T)
    G = test.z.shape[1]
    # the replicate weights drawn once for every method (the same rows and clusters); one survival held at a time
    scorer = PositionScorer(len(test.z), test.groups, n_boot, seed)
    frames, rels = [], []
    for m, stage, T in [("identity", "before", np.ones(G))] + [(m, "after", T) for m, T in temps.items()]:
        P = survival(test.z, T)
        d = scorer.score(P, test.y)
        d.insert(0, "stage", stage)
        d.insert(0, "method", m)
        if stage == "after":
            d["temperature"] = [T[k] for k in d.position]
        frames.append(d)
        r = reliability_table(P, test.y)
        r.insert(0, "method", m)
        rels.append(r)
    return CalibrationResult(label=test.label, metrics=pd.concat(frames, ignore_index=True), temperatures=temps,
                             reliability=pd.concat(rels, ignore_index=True), fit_seconds=secs,
                             n_train=len(train.z), n_test=len(test.z), notes=list(train.notes))
